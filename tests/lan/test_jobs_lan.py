"""Jobs across a LAN of namespaces: placement by requirements, exactly-once under load,
multi-host gangs, and what happens when a worker daemon dies.

The first three tests and the retry on another host share one three-host cluster (starting
daemons costs seconds on a small machine); the failure tests kill daemons and get a LAN of their
own. The cluster-wide job control test also uses the shared cluster: it stops h1 and starts it
again at its end.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from gpulayerd.api.client import DaemonClient
from gpulayerd.models import JobView
from tests.lan.harness import FAST_CLUSTER, REPO_ROOT, TERMINAL_STATES, Host, Lan

QUIET = "INFO"  # the daemon's DEBUG log is mostly aiosqlite statements
MDNS = ["--interface", "eth0"]
GB16_CC75 = [(16384, "7.5")]
GB48_CC86_X2 = [(49152, "8.6"), (49152, "8.6")]


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def cluster3(request: pytest.FixtureRequest) -> Iterator[Lan]:
    """Three hosts in one cluster, mDNS on eth0, four CPU slots each; h1 has no GPU, h2 one
    16 GB cc 7.5 GPU, h3 two 48 GB cc 8.6 GPUs."""
    lan = Lan(3)
    ready = False
    try:
        lan.up()
        h1, h2, h3 = lan.hosts
        lan.form_cluster()
        h1.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=4, log_level=QUIET)
        h2.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=4, log_level=QUIET, fake_gpus=GB16_CC75,
                        wait=False)
        h3.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=4, log_level=QUIET, fake_gpus=GB48_CC86_X2,
                        wait=False)
        h2.wait_daemon()
        h3.wait_daemon()
        lan.wait_cluster(timeout_s=20)
        ready = True
        yield lan
    finally:
        lan.close(dump_logs=not ready or _any_failed(request, "cluster3"))


def _any_failed(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test using ``fixture`` failed (reports recorded by conftest's hook)."""
    for item in request.session.items:
        if fixture in getattr(item, "fixturenames", ()):
            for when in ("setup", "call"):
                rep = getattr(item, f"lan_rep_{when}", None)
                if rep is not None and rep.failed:
                    return True
    return False


def test_cuda_job_runs_where_its_requirements_hold(cluster3: Lan) -> None:
    h1, h2, h3 = cluster3.hosts
    spec = {"command": ["sh", "-c", 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES on $(hostname)"'],
            "requirements": {"accelerator": "cuda", "gpu_memory_gb": 40, "min_cuda_compute_capability": "8.0"}}
    job = h1.submit(spec)
    view = h1.wait_job(job.id, timeout_s=30)
    assert view.status == "succeeded", view.reason
    attempt = view.attempts[-1]
    assert (attempt.worker, attempt.worker_name) == (h3.node_id, h3.hostname)
    assert attempt.placement is not None and attempt.placement.worker == h3.node_id
    indices = attempt.placement.device_indices
    assert len(indices) == 1 and indices[0] in (0, 1)
    # The log lives on h3; h1 proxies it.
    out = h1.cli_ok("logs", job.id)
    assert out == f"CUDA_VISIBLE_DEVICES={','.join(map(str, indices))} on {h3.hostname}\n", out

    # explain of the finished job says where it ran and how it ended, never whether it "fits".
    done = h1.api(lambda c: c.explain(job.id))
    assert done.state is not None and done.verdict == "succeeded", done
    assert (done.state.node, done.state.node_name, done.state.gpus) == (h3.node_id, h3.hostname, indices)
    assert "fits" not in done.model_dump_json()

    # Why not h1 or h2: explain of a waiting job (three such GPUs: none has them), against the cluster now.
    more = h1.submit({"command": ["true"], "requirements": {
        "accelerator": "cuda", "gpu_count": 3, "gpu_memory_gb": 40, "min_cuda_compute_capability": "8.0"}})
    e = h1.api(lambda c: c.explain(more.id))
    rows = {w.worker: w for w in e.workers}
    assert set(rows) == {h1.node_id, h2.node_id, h3.node_id}
    assert e.state is None and all(w.state == "no_fit" for w in rows.values()), e
    msgs1 = " | ".join(r.message for r in rows[h1.node_id].rejections)
    msgs2 = " | ".join(r.message for r in rows[h2.node_id].rejections)
    assert "no cuda device" in msgs1, msgs1
    assert re.search(r"17\.2 GB < 40 GB", msgs2) and "compute capability 7.5 < 8.0" in msgs2, msgs2
    codes2 = {r.code for r in rows[h2.node_id].rejections}
    assert {"INSUFFICIENT_MEMORY", "COMPUTE_CAPABILITY_TOO_LOW"} <= codes2, codes2
    text = h1.cli_ok("explain", more.id)
    for needle in (h1.hostname, h2.hostname, h3.hostname, "no cuda device", "17.2 GB < 40 GB",
                   "compute capability 7.5 < 8.0"):
        assert needle in text, f"{needle!r} not in:\n{text}"
    h1.api(lambda c: c.cancel(more.id))  # a waiting job's cancel is at once, and says by whom
    gone = h1.api(lambda c: c.explain(more.id))
    assert gone.state is not None and (gone.verdict, gone.state.by) == ("cancelled", "root"), gone


async def _submit_all(hosts: list[Host], spec_of: Callable[[Host, int], dict[str, Any]],
                      per_host: int) -> dict[str, list[str]]:
    """Submit ``per_host`` jobs on every host at once, job k of host h being ``spec_of(h, k)``;
    owner name -> job ids."""
    async def one_host(h: Host) -> list[str]:
        async with DaemonClient(h.socket_path, timeout_s=60) as c:
            sem = asyncio.Semaphore(16)

            async def submit(k: int) -> str:
                async with sem:
                    return (await c.submit(spec_of(h, k))).id

            return list(await asyncio.gather(*(submit(k) for k in range(per_host))))

    ids = await asyncio.gather(*(one_host(h) for h in hosts))
    return {h.name: i for h, i in zip(hosts, ids, strict=True)}


async def _list_all(hosts: list[Host]) -> dict[str, list[JobView]]:
    async def one(h: Host) -> list[JobView]:
        async with DaemonClient(h.socket_path, timeout_s=30) as c:
            return await c.jobs()

    views = await asyncio.gather(*(one(h) for h in hosts))
    return {h.name: v for h, v in zip(hosts, views, strict=True)}


async def _show_all(owners: dict[Host, list[str]]) -> dict[str, JobView]:
    """Full views (attempts included) of each owner's jobs."""
    async def one(h: Host, ids: list[str]) -> list[JobView]:
        async with DaemonClient(h.socket_path, timeout_s=60) as c:
            sem = asyncio.Semaphore(16)

            async def get(job_id: str) -> JobView:
                async with sem:
                    return await c.job(job_id)

            return list(await asyncio.gather(*(get(i) for i in ids)))

    views = await asyncio.gather(*(one(h, ids) for h, ids in owners.items()))
    return {v.id: v for vs in views for v in vs}


def test_300_concurrent_jobs_each_run_exactly_once(cluster3: Lan) -> None:
    hosts = cluster3.hosts
    markers = cluster3.root / "markers"
    markers.mkdir()
    command = ["sh", "-c", f"echo $GPULAYER_JOB_ID $GPULAYER_ATTEMPT $(hostname) >> {markers}/$GPULAYER_JOB_ID"]
    gpu_less = hosts[0]  # h1 has no GPU: every fifth of its jobs asks for one, so it must run on a peer

    def spec_of(h: Host, k: int) -> dict[str, Any]:
        spec: dict[str, Any] = {"command": command, "workdir": str(h.work)}
        if h is gpu_less and k % 5 == 0:
            spec["requirements"] = {"accelerator": "cuda"}
        return spec

    before = {h.name: {j.id for j in h.api(lambda c: c.jobs())} for h in hosts}
    t0 = time.monotonic()
    submitted = asyncio.run(_submit_all(hosts, spec_of, 100))
    t_submit = time.monotonic() - t0
    all_ids = {i for ids in submitted.values() for i in ids}
    assert len(all_ids) == 300

    def ours(views: dict[str, list[JobView]]) -> dict[str, JobView]:
        return {j.id: j for vs in views.values() for j in vs if j.id in all_ids}

    last: dict[str, JobView] = {}

    def all_done() -> bool:
        last.clear()
        last.update(ours(asyncio.run(_list_all(hosts))))
        return len(last) == 300 and all(j.status in TERMINAL_STATES for j in last.values())

    try:
        cluster3.wait(all_done, timeout_s=150, interval_s=0.5, what="300 jobs to finish")
    except AssertionError as e:
        left = collections.Counter(j.status for j in last.values())
        raise AssertionError(f"{e}: {dict(left)} of {len(last)} listed") from None
    elapsed = time.monotonic() - t0

    by_owner = {h.name: {j.id for j in h.api(lambda c: c.jobs())} - before[h.name] for h in hosts}
    assert {k: sorted(v) for k, v in by_owner.items()} == {k: sorted(v) for k, v in submitted.items()}, (
        "every job is listed by its owner only")
    statuses = collections.Counter(j.status for j in last.values())
    assert statuses == {"succeeded": 300}, {j.id: (j.status, j.reason) for j in last.values()
                                            if j.status != "succeeded"}
    assert [j.id for j in last.values() if j.attempt != 1] == []

    # Each job wrote exactly one marker line, from the host its owner says ran it.
    files = {p.name: p.read_text() for p in markers.iterdir()}
    assert set(files) == all_ids, f"missing {sorted(all_ids - set(files))[:5]}, extra {sorted(set(files) - all_ids)[:5]}"
    shown = asyncio.run(_show_all({h: submitted[h.name] for h in hosts}))
    owner_of = {i: h.hostname for h in hosts for i in submitted[h.name]}
    ran_on: collections.Counter[tuple[str, str]] = collections.Counter()
    for job_id, text in files.items():
        lines = text.splitlines()
        assert len(lines) == 1, f"job {job_id} ran {len(lines)} times: {lines}"
        jid, attempt, hostname = lines[0].split()
        view = shown[job_id]
        assert [(a.attempt, a.state, a.exit_code) for a in view.attempts] == [(1, "exited", 0)], view.attempts
        assert (jid, attempt, hostname) == (job_id, "1", view.attempts[0].worker_name), (lines, view.attempts)
        ran_on[(owner_of[job_id], hostname)] += 1
    remote = sum(n for (owner, worker), n in ran_on.items() if owner != worker)
    from_gpu_less = sum(n for (owner, worker), n in ran_on.items() if owner == gpu_less.hostname != worker)
    assert from_gpu_less >= 20, f"h1's 20 CUDA jobs must run on a peer: {dict(ran_on)}"
    print(f"300 jobs: submitted in {t_submit:.1f} s, all done in {elapsed:.1f} s, {remote} ran on a peer; "
          f"(owner, worker) -> jobs: {dict(ran_on)}")


def _member_logs(lan: Lan, job_id: str) -> dict[str, str]:
    """Every file a host keeps for ``job_id`` (its output and torchrun's per-rank logs), tail-trimmed."""
    found = {}
    for h in lan.hosts:
        for path in sorted((h.state_dir / "runs" / job_id).rglob("*")):
            if path.is_file():
                found[f"{h.name}:{path.relative_to(h.state_dir)}"] = path.read_text(errors="replace")[-3000:]
    return found


def test_two_host_gloo_job(cluster3: Lan) -> None:
    h1 = cluster3.host(1)
    by_id = {h.node_id: h for h in cluster3.hosts}
    spec = {"command": ["python", "ddp_cpu.py", "--steps", "10"], "workdir": str(REPO_ROOT / "examples"),
            "requirements": {"frameworks": {"torch": ">=2"}},
            "distributed": {"nnodes": 2, "nproc_per_node": 1, "backend": "gloo"}}
    job = h1.submit(spec)
    view = h1.wait_job(job.id, timeout_s=120, interval_s=0.3)
    attempt = view.attempts[-1] if view.attempts else None
    if view.status != "succeeded":
        for name, text in _member_logs(cluster3, job.id).items():
            print(f"===== {name}\n{text}")
    assert view.status == "succeeded", (view.reason, attempt, [e.reason for e in view.events])
    assert attempt is not None and len(attempt.gang) == 2 and len(set(attempt.gang)) == 2, attempt
    checksums = {}
    for rank, node in enumerate(attempt.gang):
        member = by_id[node]
        log = member.state_dir / "runs" / job.id / str(view.attempt) / "stdout.log"
        text = log.read_text()
        found = re.findall(r"rank (\d+) final parameter checksum (\S+)", text)
        assert found, f"{member.name} ({log}):\n{text}"
        assert len(found) == 1 and int(found[0][0]) == rank, found
        checksums[member.name] = found[0][1]
        # logs --rank R: rank R's log, fetched from the member that ran it (h1 may be neither).
        r = h1.cli("logs", "--rank", str(rank), job.id)
        assert (r.returncode, r.stdout) == (0, text), (rank, r.stdout, r.stderr)
    assert len(set(checksums.values())) == 1, checksums
    # Without --rank: every rank's lines, each prefixed with its rank.
    lines = h1.cli_ok("logs", job.id).splitlines()
    for rank in range(2):
        assert any(line.startswith(f"[rank {rank}] ") and f"rank {rank} final parameter checksum " in line
                   for line in lines), lines
    assert all(re.match(r"\[rank [01]\] ", line) for line in lines), lines
    r = h1.cli("logs", "--rank", "2", job.id)
    assert r.returncode != 0 and "ranks 0 to 1" in r.stderr, r


def test_jobs_offered_in_quick_succession_run_once_and_are_never_lost(lan_factory: Callable[..., Lan]) -> None:
    """An owner whose jobs all go to a peer, submitted back to back: each runs once, to the end.

    (A race this guards against: a scheduling pass of the owner that listed a job as queued
    before a peer's claim was granted offered it again; the peer claimed it again, got the
    same attempt, could not record it twice and reported it "lost" while it ran.)
    """
    lan = lan_factory(2)
    h1, h2 = lan.hosts
    lan.form_cluster()
    h1.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=1, log_level=QUIET, wait=False)
    h2.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=32, log_level=QUIET, wait=False)
    h1.wait_daemon()
    h2.wait_daemon()
    lan.wait_cluster()
    blocker = h1.submit({"command": ["sleep", "300"]})
    h1.wait_job(blocker.id, states={"running"})
    spec = {"command": ["sleep", "1.5"], "workdir": str(h1.work), "policy": {"retries": 0}}

    async def back_to_back(n: int) -> list[str]:
        async with DaemonClient(h1.socket_path, timeout_s=30) as c:
            return [(await c.submit(spec)).id for _ in range(n)]

    bad = []
    for _ in range(2):
        ids = asyncio.run(back_to_back(30))
        for job_id in ids:
            v = h1.wait_job(job_id, timeout_s=60)
            if (v.status, v.attempt, [a.worker for a in v.attempts]) != ("succeeded", 1, [h2.node_id]):
                bad.append((job_id, v.status, v.attempt, [(e.from_status, e.to_status, e.attempt, e.reason)
                                                           for e in v.events if e.from_status]))
    assert bad == [], bad


# --------------------------------------------------------------------- a worker dies

HEARTBEAT = 'while :; do date +%s.%N >> "{d}/hb.$GPULAYER_ATTEMPT"; sleep 0.2; done'
RETRIED = ('if [ "$GPULAYER_ATTEMPT" = 1 ]; then ' + HEARTBEAT + '; '
           'else date +%s.%N > "{d}/start.$GPULAYER_ATTEMPT"; sleep 1; fi')
LEASE_S = 5.0
GRACE_S = 2.0


def _job_pid(worker: Host, job_id: str, attempt: int) -> int:
    path = worker.state_dir / "runs" / job_id / str(attempt) / "job.json"
    pid: int = json.loads(path.read_text())["pid"]
    return pid


def test_worker_killed_attempt_lost_then_retried_elsewhere(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(3)
    h1, h2, h3 = lan.hosts
    lan.form_cluster()
    cfg = {**FAST_CLUSTER, "lease_grace_s": GRACE_S}
    # h1 (the owner) has one slot, which a blocker keeps busy, so its jobs run on peers.
    h1.start_daemon(config=cfg, extra_args=MDNS, cpu_slots=1, log_level=QUIET)
    h2.start_daemon(config=cfg, extra_args=MDNS, cpu_slots=2, log_level=QUIET)
    lan.wait_cluster(h1, h2)
    blocker = h1.submit({"command": ["sleep", "300"]})
    assert h1.wait_job(blocker.id, states={"running"}).attempts[-1].worker == h1.node_id
    d = lan.root / "shared"
    d.mkdir()
    retried = h1.submit({"command": ["sh", "-c", RETRIED.format(d=d)],
                         "policy": {"retries": 1, "lease_s": LEASE_S}})
    once = h1.submit({"command": ["sh", "-c", HEARTBEAT.format(d=d).replace("hb.", "once.")],
                      "policy": {"retries": 0, "lease_s": LEASE_S}})
    for j in (retried, once):
        v = h1.wait_job(j.id, states={"running"}, timeout_s=20)
        assert v.attempts[-1].worker == h2.node_id, v.attempts
    # h3 joins only now, so both jobs ran on h2; it is where the retry can go.
    h3.start_daemon(config=cfg, extra_args=MDNS, cpu_slots=2, log_level=QUIET)
    lan.wait_cluster()
    pid_retried = _job_pid(h2, retried.id, 1)
    pid_once = _job_pid(h2, once.id, 1)
    lan.wait(lambda: (d / "hb.1").exists() and (d / "once.1").exists(), timeout_s=10, what="heartbeats")

    for j in (retried, once):  # nothing happened to them yet
        v = h1.job(j.id)
        assert (v.status, v.attempt) == ("running", 1), [(e.from_status, e.to_status, e.reason) for e in v.events]

    assert h2.kill_daemon() == -9
    killed_wall = time.time()
    seen: dict[str, Any] = {}

    def settled() -> bool:
        a, b = h1.job(retried.id), h1.job(once.id)
        if b.status == "lost" and "once_pid_dead" not in seen:
            seen["once_pid_dead"] = _dead(pid_once)
        if a.attempt == 2 and a.status in ("running", "succeeded") and "pid_dead" not in seen:
            seen.update(pid_dead=_dead(pid_retried), status=a.status)
        return a.status == "succeeded" and b.status == "lost"

    lan.wait(settled, timeout_s=30, interval_s=0.1, what="the retry to succeed and the other job to be lost")
    a, b = h1.job(retried.id), h1.job(once.id)

    # The owner declared both attempts lost within lease + grace of the last renewal (which
    # came at most a lease tick, 1 s, before the kill; the owner checks leases every 1 s).
    limit = LEASE_S + GRACE_S + 2.0
    for view, to in ((a, "queued"), (b, "lost")):
        loss = [e for e in view.events if e.attempt == 1 and e.from_status == "running" and e.to_status == to]
        assert len(loss) == 1, [(e.kind, e.from_status, e.to_status, e.attempt, e.reason) for e in view.events]
        after = loss[0].at - killed_wall
        assert 0 < after <= limit, f"job {view.id}: lost {after:.1f} s after the kill (limit {limit} s)"
        assert "no lease renewal" in loss[0].reason, loss[0].reason

    # retries = 1: attempt 2 ran on h3, after every process of attempt 1 was gone.
    assert [(x.attempt, x.worker) for x in a.attempts] == [(1, h2.node_id), (2, h3.node_id)], a.attempts
    assert seen.get("pid_dead") is True, f"attempt 1's job (pid {pid_retried}) lived on: {seen}"
    beats = [float(x) for x in (d / "hb.1").read_text().split()]
    start2 = float((d / "start.2").read_text())
    assert beats and beats[-1] < start2, f"attempt 1 beat at {beats[-1]:.3f}, attempt 2 started at {start2:.3f}"
    assert not (d / "hb.2").exists()
    assert a.retries_left == 0

    # retries = 0: the job ends lost, saying why, and its process died too.
    assert (b.status, b.attempt, b.holder) == ("lost", 1, None)
    assert "no lease renewal" in b.reason and f"{LEASE_S:g} s + {GRACE_S:g} s grace" in b.reason, b.reason
    assert seen.get("once_pid_dead") is True, f"pid {pid_once} outlived its lease"
    assert _dead(pid_once) and _dead(pid_retried)
    assert h1.job(blocker.id).status == "running"

    # The owner's attempt rows say how each attempt ended.
    assert [(x.attempt, x.state) for x in a.attempts] == [(1, "lost"), (2, "exited")], a.attempts
    assert a.attempts[0].ended_at is not None and "no lease renewal" in a.attempts[0].reason, a.attempts[0]
    assert [(x.attempt, x.state) for x in b.attempts] == [(1, "lost")], b.attempts
    assert b.attempts[0].ended_at is not None and "no lease renewal" in b.attempts[0].reason, b.attempts[0]


def test_a_failed_attempt_is_retried_on_another_host_with_retry_elsewhere(cluster3: Lan) -> None:
    """``--retries 2 --retry-on failed --retry-elsewhere``: an exit-1 job runs three times, each retry
    on another host than the attempt before it (three hosts fit it), then ends failed."""
    h1 = cluster3.host(1)
    started = time.monotonic()
    job = json.loads(h1.cli_ok("submit", "--json", "--retries", "2", "--retry-on", "failed", "--retry-backoff",
                               "0.2s", "--retry-elsewhere", "--", "sh", "-c", "echo attempt $GPULAYER_ATTEMPT; exit 1"))
    view = h1.wait_job(job["id"], timeout_s=20)
    assert (view.status, view.attempt, view.retries_left) == ("failed", 3, 0), view.reason
    workers = [a.worker for a in view.attempts]
    assert [(a.attempt, a.exit_code) for a in view.attempts] == [(1, 1), (2, 1), (3, 1)], view.attempts
    assert workers[1] != workers[0] and workers[2] != workers[1], workers
    assert set(workers) <= {h.node_id for h in cluster3.hosts}
    assert time.monotonic() - started < 20.0


# ---------------------------------------------------------------------- any job id on any host
# This test stops h1's daemon and starts it again at its end (even when it fails), so that
# any test after it can still use ``cluster3``.

def _out(h: Host, *args: str) -> tuple[int, str]:
    r = h.cli(*args)
    return r.returncode, r.stdout + r.stderr


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not {what} within {timeout_s:g} s")
        time.sleep(0.2)


def test_any_job_id_works_on_any_host_and_an_owner_down_is_said_so(cluster3: Lan) -> None:
    h1, h2, h3 = cluster3.hosts
    on_h3 = {"command": ["sh", "-c", 'echo "hello from $(hostname)"; sleep 120'],
             "requirements": {"accelerator": "cuda", "gpu_memory_gb": 40}}  # only h3 has such GPUs
    job = h1.submit(on_h3).id
    view = h1.wait_job(job, states=["running"], timeout_s=30)
    assert view.holder == h3.node_id, view
    _wait_for("the job's output on h3", lambda: h1.cli("logs", job).stdout == f"hello from {h3.hostname}\n")

    for h in (h2, h3):  # a bystander, and the worker that runs it
        shown = json.loads(h.cli_ok("show", "--json", job))
        assert (shown["id"], shown["owner"], shown["status"], shown["holder"]) == (
            job, h1.node_id, "running", h3.node_id), (h.name, shown)
        assert shown["spec"]["command"][0] == "sh"
        assert h.cli_ok("show", job[:8]).count(job) >= 1
        assert h.cli_ok("logs", job) == f"hello from {h3.hostname}\n", h.name
        explained = json.loads(h.cli_ok("explain", "--json", job))
        assert (explained["verdict"], explained["state"]["node"], explained["state"]["attempt"]) == (
            "running", h3.node_id, 1), (h.name, explained)
    rc, text = _out(h2, "show", "zzzzzzzzzzzz")
    assert (rc, "no job 'zzzzzzzzzzzz'" in text) == (2, True), (rc, text)

    h3.cli_ok("cancel", job)  # on the worker that runs it
    assert h1.wait_job(job, timeout_s=30).status == "cancelled"

    # The owner goes down: the worker answers for its run, everybody says the owner is unreachable.
    second = h1.submit(on_h3).id
    assert h1.wait_job(second, states=["running"], timeout_s=30).holder == h3.node_id
    _wait_for("the second job's output", lambda: h3.cli("logs", second).stdout.startswith("hello"))
    nowhere = h1.submit({"command": ["true"], "requirements": {"accelerator": "cuda", "gpu_memory_gb": 4000}}).id
    h1.stop_daemon()
    try:
        _owner_down(cluster3, second, nowhere)
    finally:  # later tests of the module use cluster3 with h1 up
        h1.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=4, log_level=QUIET)
        cluster3.wait_cluster(timeout_s=30)


def _owner_down(cluster3: Lan, second: str, nowhere: str) -> None:
    """With h1 (the owner) stopped: h3 answers for its run of ``second``; ``nowhere`` is h1's alone."""
    h1, h2, h3 = cluster3.hosts
    unreachable = f"owner {h1.hostname} unreachable"
    for h in (h3, h2):
        rc, text = _out(h, "show", second)
        assert rc == 0 and unreachable in text and h3.hostname in text, (h.name, rc, text)
        rc, text = _out(h, "logs", second)
        assert (rc, text) == (0, f"hello from {h3.hostname}\n"), (h.name, rc, text)
        rc, text = _out(h, "cancel", second)
        assert rc == 1 and unreachable in text, (h.name, rc, text)
        rc, text = _out(h, "show", nowhere)  # nobody but h1 knows it
        assert rc == 1 and f"{h1.hostname} did not answer" in text and "no job" not in text, (h.name, rc, text)
