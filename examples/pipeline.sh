#!/bin/sh
# A pipeline: prepare, then a sweep of 8 tasks once it succeeded, then a summary once every task
# succeeded (a task that fails cancels the summary: DependencyNeverSatisfied). Run where gpulayerd runs.
set -e
prep=$(gpulayer submit --json --name prepare -- sh -c 'echo data > data.txt' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
sweep=$(gpulayer submit --json --name train --array 0-7%2 --after "$prep" -- sh -c 'cat data.txt; echo task {task}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
gpulayer submit --name summary --after "$sweep:ok" -- echo "all 8 tasks of $sweep succeeded"
gpulayer jobs
