"""Code travels with the job (issue 34), over a real LAN of daemons: a job submitted with ``--ship``
from a git repository on h1 runs on h2 (the only host with a GPU) in a fresh per-attempt tree of
h2's, prints a file of the repository, finds no untracked ignored file there; a second submit after
changing one file moves one file (the job's history says so); ``--output results/*.json`` brings
the files back to h1's ``<repo>/gpulayer-out/<job>/``; h2 keeps the attempt's tree and ``gpulayer
fetch`` gets another file of it."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.lan.harness import FAST_CLUSTER, Lan

QUIET = "INFO"
MDNS = ["--interface", "eth0"]
GPU = [(16384, "7.5")]


def test_a_shipped_job_runs_on_another_host_and_brings_its_outputs_back(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(3)
    h1, h2, _ = lan.hosts
    lan.form_cluster(h1, h2)
    h1.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=2, log_level=QUIET, wait=False)
    h2.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=2, log_level=QUIET, fake_gpus=GPU, wait=False)
    h1.wait_daemon()
    h2.wait_daemon()
    lan.wait_cluster(h1, h2, timeout_s=20)

    repo = h1.work / "repo"
    repo.mkdir()
    h1.run("git init -q && printf 'hello from h1\\n' > msg.txt && printf 'big.bin\\n' > .gitignore && "
           "git add msg.txt .gitignore && git -c user.email=t@t -c user.name=t commit -qm init && "
           "head -c 100000000 /dev/zero > big.bin", check=True, cwd=repo)
    script = ('pwd; cat msg.txt; ls -a; mkdir -p results && echo "{\\"ok\\": 1}" > results/r.json && '
              'echo nope > results/r.txt && printf "no newline" > results/r.dat')
    r = h1.cli("submit", "--ship", "--output", "results/*.json", "--accelerator", "cuda", "--", "sh", "-c", script,
               cwd=repo, check=True)
    job = r.stdout.split()[2].rstrip(":")
    view = h1.wait_job(job, timeout_s=30)
    assert view.status == "succeeded", view.reason
    assert view.attempts[-1].worker_name == h2.hostname
    out = h1.cli_ok("logs", job).splitlines()
    assert out[0].startswith(str(h2.state_dir / "trees")) and out[0] != str(repo), out  # h2's fresh tree
    assert out[1] == "hello from h1"
    assert "big.bin" not in out and "msg.txt" in out and ".gitignore" in out  # the ignored 100 MB file stayed
    back = repo / "gpulayer-out" / job / "results"
    assert json.loads((back / "r.json").read_text()) == {"ok": 1} and not (back / "r.txt").exists()
    history = " | ".join(e.reason for e in h1.job(job).events)
    assert "Transfer: 2 file(s)" in history and "Outputs: 1 file(s) of attempt 1" in history, history
    tree = h2.state_dir / "trees" / f"{h1.node_id[:16]}-{job}-1"
    assert tree.is_dir() and tree.with_name(tree.name + ".ended").exists()  # kept ship_keep_s for gpulayer fetch
    # gpulayer fetch: a file that was no --output, from h2's kept tree, written as the user on h1.
    fetched = h1.cli_ok("fetch", job, "results/*.txt", "--to", str(h1.work / "got"), cwd=repo)
    assert fetched.startswith("fetched 1 file(s)") and (h1.work / "got" / "results" / "r.txt").read_text() == "nope\n"
    # A file whose bytes do not end with a newline (the stream's trailer follows it directly).
    fetched = h1.cli_ok("fetch", job, "results/r.dat", "--to", str(h1.work / "got"), cwd=repo)
    assert fetched.startswith("fetched 1 file(s)") and (h1.work / "got" / "results" / "r.dat").read_text() == "no newline"
    nothing = h1.cli("fetch", job, "nope/*", "--to", str(h1.work / "got"), cwd=repo)
    assert nothing.returncode == 1 and "no file of attempt 1 matched nope/*" in nothing.stderr, nothing.stderr
    refused = h1.cli("fetch", job, "../x", cwd=repo)
    assert refused.returncode == 2 and "climbs out" in refused.stderr

    # One file changed: one file moves (the other comes from h2's cache).
    (repo / "msg.txt").write_text("changed on h1\n")
    r = h1.cli("submit", "--ship", "--accelerator", "cuda", "--", "cat", "msg.txt", cwd=repo, check=True)
    second = r.stdout.split()[2].rstrip(":")
    assert h1.wait_job(second, timeout_s=30).status == "succeeded"
    assert h1.cli_ok("logs", second) == "changed on h1\n"
    history = " | ".join(e.reason for e in h1.job(second).events)
    assert "Transfer: 1 file(s), 14 bytes moved from the owner; 1 from this worker's cache" in history, history
