"""Fair share across a LAN of namespaces: the user with less recent usage goes first lab-wide,
the passed-over user is told who, and usage survives a daemon restart.

h1 has no GPU; h2 has two and h3 one (3 GPUs in the lab). Every daemon runs in system mode with
a short ``fairshare_half_life_s``. alice submits 6 five-second GPU jobs on h1; once three run,
bob submits 3 (one from h3, two from h1). When devices free, bob's first job must start before
alice's 4th, and alice's waiting jobs' reason must say FairShare and name bob. Then h1 restarts:
both users' usage is as before, less the decay over the restart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpulayerd.models import UserUsageView
from gpulayerd.net.ca import cluster_init, cluster_join
from tests.fakes.accounts import Account, Accounts, SharedPython
from tests.lan.harness import FAST_CLUSTER, Host, Lan

HALF_LIFE_S = 120.0
JOB_S = 5


def _start(lan: Lan) -> None:
    h1, h2, h3 = lan.hosts
    token = cluster_init(h1.daemon_state_dir, None, mode="system", uses=2, addresses=[f"{h1.ip}:7172"])
    for h in (h2, h3):
        cluster_join(h.daemon_state_dir, token, mode="system", signer=h1.daemon_state_dir)
    gpus = {h1: None, h2: [24576, 24576], h3: [24576]}
    for h in lan.hosts:
        (h.root / "run").mkdir(mode=0o755, exist_ok=True)
        h.start_daemon(config={**FAST_CLUSTER, "mode": "system", "fairshare_half_life_s": HALF_LIFE_S},
                       extra_args=["--runtime-dir", str(h.root / "run")], cpu_slots=2, log_level="INFO",
                       fake_gpus=gpus[h], wait=False)
    for h in lan.hosts:
        h.wait_daemon()
    lan.wait_cluster(timeout_s=20)


def _submit(shared: SharedPython, who: Account, host: Host, name: str) -> str:
    sock = host.root / "run" / "gpulayerd.sock"
    r = shared.cli(who, "--socket", str(sock), "submit", "--name", name, "--workdir", str(who.home),
                   "--accelerator", "cuda", "--gpus", "1", "--json", "--", "sleep", str(JOB_S))
    assert r.returncode == 0, f"submit as {who.name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    data: dict[str, Any] = json.loads(r.stdout)
    return str(data["id"])


def _usage(host: Host) -> dict[str, UserUsageView]:
    return {u.user: u for u in host.api(lambda c: c.users())}


def test_bob_goes_before_alices_fourth_lab_wide_and_usage_survives_a_restart(
        lan_factory: Callable[..., Lan], accounts: Accounts, shared_python: SharedPython,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Host, "socket_path", property(lambda h: h.root / "run" / "gpulayerd.sock"))
    alice, bob = accounts.user("alice"), accounts.user("bob")
    lan = lan_factory(3)
    h1, _, h3 = lan.hosts
    _start(lan)

    a = [_submit(shared_python, alice, h1, f"a{i}") for i in range(6)]
    lan.wait(lambda: sum(h1.job(j).status == "running" for j in a) == 3 or None, timeout_s=20,
             what="three of alice's jobs to run")
    b = [(h3, _submit(shared_python, bob, h3, "b0"))]
    b += [(h1, _submit(shared_python, bob, h1, f"b{i}")) for i in (1, 2)]

    told: list[str] = []  # reasons of alice's waiting jobs that name bob under FairShare
    seen: dict[str, None] = {}  # every reason of alice's waiting jobs

    def all_done() -> bool | None:
        for j in a[3:]:
            v = h1.job(j)
            if v.status == "queued":
                seen[v.reason] = None
                if v.reason.startswith("FairShare:") and bob.name in v.reason:
                    told.append(v.reason)
        views = [h1.job(j) for j in a] + [owner.job(j) for owner, j in b]
        return all(v.status in ("succeeded", "failed", "lost", "cancelled") for v in views) or None

    lan.wait(all_done, timeout_s=60, interval_s=0.2, what="all nine jobs to end")
    views = {j: h1.job(j) for j in a} | {j: owner.job(j) for owner, j in b}
    assert all(v.status == "succeeded" for v in views.values()), {j: (v.status, v.reason) for j, v in views.items()}

    def started(j: str) -> float:
        at = views[j].attempts[-1].started_at
        assert at is not None
        return at

    first_bob = min(started(j) for _, j in b)
    fourth_alice = sorted(started(j) for j in a)[3]
    order = sorted((round(started(j) % 1000, 2), views[j].name, views[j].attempts[-1].worker_name) for j in views)
    assert first_bob < fourth_alice, f"bob's first job started after alice's 4th: {order}"
    assert told, f"no waiting job of alice's said FairShare naming bob: {list(seen)}; {order}"
    assert f"{bob.name}'s jobs go first" in told[0], told[0]

    lan.wait(lambda: {alice.name, bob.name} <= set(_usage(h1)) or None, timeout_s=10, what="both users' usage")
    before, t0 = _usage(h1), time.time()
    assert before[alice.name].gpu_hours > before[bob.name].gpu_hours > 0
    h1.stop_daemon()
    h1.start_daemon(config={**FAST_CLUSTER, "mode": "system", "fairshare_half_life_s": HALF_LIFE_S},
                    extra_args=["--runtime-dir", str(h1.root / "run")], cpu_slots=2, log_level="INFO")
    after, t1 = _usage(h1), time.time()
    decay = 2.0 ** (-(t1 - t0) / HALF_LIFE_S)
    for user in (alice.name, bob.name):
        assert user in after, f"{user}'s usage was lost over the restart: {after}"
        # Within the decay over the restart (and a second's accrual or heartbeat lag either way).
        want = before[user].gpu_hours * decay
        assert after[user].gpu_hours == pytest.approx(want, rel=0.15), (user, before[user], after[user])
