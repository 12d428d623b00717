"""A job whose workdir hangs (a hard NFS mount whose server is gone) must not freeze the daemon.

The workdir lies on a FUSE mount that never answers (:mod:`tests.fakes.hungfs`): any
``stat`` under it blocks. Looking at it on the event loop would stop the local API, the
scheduler and the lease renewals of every running job together; the daemon must instead
give up on that workdir after a bounded time, saying "workdir ... did not answer within
N s", and go on serving everything else meanwhile.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from gpulayerd.api.client import DaemonClient
from gpulayerd.models import JobView
from tests.fakes.hungfs import HungMountError, hung_mount

from .conftest import TERMINAL, Daemon, Lab

PROBE_S = 2.0  # every API call must answer within this while the workdir hangs
REASON_WITHIN_S = 30.0  # the daemon's give-up time ("did not answer within N s") must be shorter
RUNNING_LEASE_S = 3.0  # a running job whose lease must keep being renewed meanwhile
MIN_HUNG_S = 2 * RUNNING_LEASE_S + 1.0  # watch at least this long, so that lease would have run out

_T = TypeVar("_T")


def _hold(release: str) -> list[str]:
    return ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"]


async def _watch(d: Daemon, spec: dict[str, object]) -> tuple[JobView, list[float]]:
    """Submit ``spec`` and, meanwhile and afterwards, call the API every 0.2 s until the job's
    reason says its workdir did not answer (and at least MIN_HUNG_S passed).

    Returns the job's last view and the latency of every call, in seconds.
    Raises AssertionError as soon as one call takes longer than PROBE_S.
    """
    latencies: list[float] = []
    async with (
        DaemonClient(d.socket_path, timeout_s=REASON_WITHIN_S + 30) as slow,
        DaemonClient(d.socket_path, timeout_s=PROBE_S + 5) as quick,
    ):

        async def timed(what: str, call: Awaitable[_T]) -> _T:
            t0 = time.monotonic()
            try:
                result = await asyncio.wait_for(call, PROBE_S)
            except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                raise AssertionError(
                    f"the daemon's API did not answer {what} within {PROBE_S} s while a "
                    f"job's workdir hung (after {len(latencies)} quick answers)"
                ) from None
            latencies.append(time.monotonic() - t0)
            return result

        # The submit may itself look at the workdir (off the event loop, bounded): it has time.
        submit = asyncio.ensure_future(slow.submit(spec))
        t0 = time.monotonic()
        view: JobView | None = None
        while True:
            await timed("GET /v1/health", quick.health())
            await timed("GET /v1/jobs", quick.jobs())
            if submit.done():
                view = await timed("GET /v1/jobs/ID", quick.job(submit.result().id))
                if "did not answer within" in view.reason and time.monotonic() - t0 >= MIN_HUNG_S:
                    return view, latencies
            if time.monotonic() - t0 > REASON_WITHIN_S:
                got = "the submit did not return" if view is None else f"{view.status}: {view.reason!r}"
                raise AssertionError(
                    f"after {REASON_WITHIN_S} s the job with the hung workdir is {got}; "
                    "wanted a reason with 'did not answer within'"
                )
            await asyncio.sleep(0.2)


@pytest.mark.slow
def test_a_hung_workdir_is_given_up_on_while_the_daemon_keeps_serving(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=2)
    running = d.call(
        lambda c: c.submit(
            {
                "command": _hold("release-running"),
                "workdir": str(d.work),
                "policy": {"lease_s": RUNNING_LEASE_S, "retries": 0},
            }
        )
    )
    d.wait_status(running.id, {"running"})

    mount_point = lab.root / f"hung-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    workdir = mount_point / "work"
    try:
        with hung_mount(mount_point):
            hung, latencies = asyncio.run(
                _watch(
                    d, {"command": ["sh", "-c", "echo must not run"], "workdir": str(workdir), "policy": {"retries": 0}}
                )
            )
            assert str(workdir) in hung.reason, hung.reason
            assert hung.status in ("queued", "rejected") and hung.attempt == 0, (hung.status, hung.attempt, hung.reason)
            assert max(latencies) < PROBE_S, latencies

            # The scheduler still runs other jobs, and the running job's lease was renewed all along.
            other = d.submit("--", "sh", "-c", "echo fine")
            assert d.wait_status(other, TERMINAL).status == "succeeded"
            assert d.job(running.id).status == "running", d.job(running.id).reason
    except HungMountError as e:
        pytest.fail(f"this test needs a FUSE mount (root and /dev/fuse): {e}", pytrace=False)
    finally:
        (d.work / "release-running").touch()
    ended = d.wait_status(running.id, TERMINAL)
    assert (ended.status, ended.exit_code) == ("succeeded", 0), ended.reason
