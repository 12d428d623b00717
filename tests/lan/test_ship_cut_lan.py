"""A shipped job's transfer cut mid-way (issue 34), over a real LAN of daemons: h2 fetches a 16 MB
file throttled to 4 MB/s (``ship_fetch_mb_per_s``, so the cut is not a race); h1, the owner, is
killed while the part file grows. h2 leaves no tree, never starts the attempt, keeps the part file;
once h1 is back the job is queued again (nothing ran: no retry used), h2 resumes the file from the
part and the job runs on the whole file. That second transfer outlasts the job's lease (1 s) and
the owner's grace (1 s): the worker renews the lease while it fetches, so it is not declared lost.
h1's config ships jobs by default (``ship = true``): the job is submitted without ``--ship``."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from tests.lan.harness import FAST_CLUSTER, Lan

QUIET = "INFO"
MDNS = ["--interface", "eth0"]
GPU = [(16384, "7.5")]
BIG = 16_000_000


def _wait(what: str, fn: Callable[[], bool], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while not fn():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)


def _part_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.glob("*.part")) if cache.is_dir() else 0


def test_a_transfer_cut_mid_way_leaves_no_tree_and_runs_once_the_owner_is_back(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(2)
    h1, h2 = lan.hosts
    lan.form_cluster(h1, h2)
    owner = {**FAST_CLUSTER, "lease_grace_s": 1.0, "ship": True}  # a lab default: jobs submitted on h1 ship
    h1.start_daemon(config=owner, extra_args=MDNS, cpu_slots=2, log_level=QUIET, wait=False)
    h2.start_daemon(config={**FAST_CLUSTER, "ship_fetch_mb_per_s": 4.0}, extra_args=MDNS, cpu_slots=2,
                    log_level=QUIET, fake_gpus=GPU, wait=False)
    h1.wait_daemon()
    h2.wait_daemon()
    lan.wait_cluster(h1, h2, timeout_s=20)

    repo = h1.work / "plain"
    repo.mkdir()
    (repo / "msg.txt").write_text("whole\n")
    h1.run(f"head -c {BIG} /dev/urandom > big.bin", check=True, cwd=repo)
    r = h1.cli("submit", "--accelerator", "cuda", "--lease-s", "1", "--", "sh", "-c",
               "cat msg.txt; wc -c < big.bin", cwd=repo, check=True)
    job = r.stdout.split()[2].rstrip(":")

    cache = h2.state_dir / "ship-cache"
    _wait("h2 fetches big.bin", lambda: _part_bytes(cache) >= 1_000_000, 45)  # (the 16 MB snapshot goes first)
    h1.kill_daemon()  # the owner dies mid-transfer
    _wait("h2 gives the transfer up", lambda: f"job_id={job} attempt 1: Transfer:" in h2.log_tail(20000), 15)
    cut = _part_bytes(cache)
    assert 0 < cut < BIG  # kept to resume from, never under the content's name
    trees = h2.state_dir / "trees"
    assert not trees.exists() or list(trees.iterdir()) == []  # no partial tree
    assert not (h2.state_dir / "runs" / job / "1").exists()  # attempt 1 never started

    h1.start_daemon(config=owner, extra_args=MDNS, cpu_slots=2, log_level=QUIET)
    view = h1.wait_job(job, timeout_s=40)
    assert view.status == "succeeded", view.reason
    # The second transfer (~3.7 s) outlasted the 1 s lease + 1 s grace: renewed meanwhile, never lost.
    assert [a.attempt for a in view.attempts] == [1, 2], view.attempts
    assert not any("no lease renewal" in e.reason for e in h1.job(job).events)
    assert h1.cli_ok("logs", job).split() == ["whole", str(BIG)]
    history = " | ".join(e.reason for e in h1.job(job).events)
    moved = [int(n) for n in re.findall(r"Transfer: \d+ file\(s\), (\d+) bytes moved", history)]
    assert moved and moved[-1] <= BIG - cut + 100, history  # resumed from the part file
    assert not list(cache.glob("*.part"))
    plain = h1.cli("submit", "--no-ship", "--", "true", cwd=repo, check=True)  # --no-ship: no snapshot taken
    assert "shipped" not in plain.stderr
    assert h1.job(plain.stdout.split()[2].rstrip(":")).spec.ship is None
