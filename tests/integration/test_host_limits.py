"""Real daemons under host limits: an affinity mask (bug-35) and a host name that does not
resolve (bug-36).

bug-35: a daemon started under ``taskset -c 0`` has one CPU it may use, so it reports one CPU
slot (not the host's count), and a second CPU job waits for the first.

bug-36: the daemon runs in its own UTS and mount namespaces (``unshare --uts --mount``) with
the host name ``gpu-node-17`` and an ``/etc/hosts`` (bind-mounted from a temporary file) that
names only localhost. torchrun ``--standalone`` alone would publish the unresolvable host name
as its store address and hang; with ``--local-addr 127.0.0.1`` the example DDP job runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import REPO_ROOT, Lab

CASES = REPO_ROOT / "tests" / "data" / "cases"


def _case(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((CASES / f"{name}.json").read_text())
    return data


def test_bug_35_daemon_under_taskset_has_one_cpu_slot(lab: Lab) -> None:
    expected = _case("bug-35")["expected"]
    assert isinstance(expected, dict)
    d = lab.daemon(cpu_slots=None, wrap=["taskset", "-c", "0"])
    caps = d.call(lambda c: c.devices())  # what `gpulayer devices --json` prints
    assert caps.cpu_slots_total == expected["cpu_slots_total"] == 1
    # The daemon and what it runs keep the mask: a job sees the one CPU; a second job waits for
    # the slot (the case's two jobs, each held until a file appears instead of sleeping 8 s).
    work = "import os, time; print(sorted(os.sched_getaffinity(0)), flush=True)\n" \
           "while not os.path.exists('release'): time.sleep(0.05)"
    first = d.submit("--", "python", "-c", work)
    d.wait_status(first, {"running"}, timeout_s=30)
    second = d.submit("--", "python", "-c", work)
    waiting = d.wait_reason(second, lambda j: j.reason.startswith("Resources"), timeout_s=30)
    assert waiting.status == "queued" and "cpu slots 0 free of 1" in waiting.reason, waiting.reason
    (d.work / "release").touch()
    for job in (first, second):
        d.wait_status(job, {"succeeded"}, timeout_s=30)
        assert d.cli_ok("logs", job).strip() == "[0]"


def test_bug_36_standalone_ddp_with_unresolvable_hostname(lab: Lab, tmp_path: Path) -> None:
    case = _case("bug-36")
    inp = case["input"]
    assert isinstance(inp, dict)
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{inp['/etc/hosts']}\n")
    script = f'hostname {inp["hostname"]} && mount --bind "{hosts}" /etc/hosts && exec "$@"'
    d = lab.daemon(wrap=["unshare", "--uts", "--mount", "sh", "-c", script, "sh"])
    # The example job, with few steps and its workdir made absolute.
    example = (REPO_ROOT / "examples" / "jobs" / "ddp_cpu.toml").read_text()
    example = re.sub(r'"--steps", "\d+"', '"--steps", "5"', example)
    example = example.replace('workdir = ".."', f'workdir = "{REPO_ROOT / "examples"}"')
    assert '"--steps", "5"' in example and str(REPO_ROOT) in example
    spec = tmp_path / "ddp_cpu.toml"
    spec.write_text(example)
    job = d.submit("-f", str(spec))
    view = d.wait_status(job, {"succeeded"}, timeout_s=60)
    assert view.status == "succeeded"
    out = d.cli_ok("logs", job)
    sums = re.findall(r"rank (\d) final parameter checksum (\S+)", out)
    assert sorted(r for r, _ in sums) == ["0", "1"] and len({s for _, s in sums}) == 1, out
