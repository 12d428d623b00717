"""Users across machines on a LAN of namespaces: a job of alice runs only where alice has an account.

alice is a real account (``accounts`` fixture) in the machine's /etc/passwd, which h1 and h2
see. h3 gets its own copies of /etc/passwd, /etc/group and /etc/shadow without her:
``ip netns exec NS`` bind-mounts every file of ``/etc/netns/NS/`` over ``/etc``, for the
daemon and every command of that host. The directory is unique to the run (it is named
after the namespace) and removed at the end.

Every daemon runs in system mode (enrolled with ``--system``'s library call). alice submits
through h1's socket with the CLI, as herself. Her GPU jobs fit h2 and h3 (one fake GPU each;
h1 has none): they must never be placed on h3, and ``explain`` names the reason there.

Then bob's personal-mode node (a certificate bound to bob) offers a job "as alice" to a
system-mode worker over the real mutual-TLS peer API: refused, and nothing runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.models import ExplanationModel
from gpulayerd.net.ca import cluster_init, cluster_join, new_token
from tests.fakes.accounts import Account, Accounts, SharedPython, etc_unchanged
from tests.lan.harness import FAST_CLUSTER, Host, Lan

QUIET = "INFO"
GPU = [(16384, "7.5")]
ETC_FILES = ("passwd", "group", "shadow")


@pytest.fixture
def etc_without(request: pytest.FixtureRequest) -> Iterator[Callable[[Host, str], Path]]:
    """``etc_without(host, name)``: ``/etc/netns/<host's namespace>/`` with copies of the user
    database files that leave out ``name`` (removed after the test). From the first copy to the end no
    other test changes the user database (:func:`etc_unchanged`): a ``useradd`` elsewhere replaces
    ``/etc/passwd``, which drops the namespace's bind mount of its copy (a CI run saw alice's job run there)."""
    made: list[Path] = []
    parent = Path("/etc/netns")
    parent_existed = parent.exists()
    held = contextlib.ExitStack()

    def make(host: Host, name: str) -> Path:
        held.enter_context(etc_unchanged())
        d = Path("/etc/netns") / host.ns
        d.mkdir(parents=True, exist_ok=False)
        made.append(d)
        for f in ETC_FILES:
            src = Path("/etc") / f
            lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
            (d / f).write_text("".join(x for x in lines if not x.startswith(f"{name}:")), encoding="utf-8")
            st = src.stat()
            os.chmod(d / f, st.st_mode & 0o7777)
            os.chown(d / f, st.st_uid, st.st_gid)
        return d

    try:
        yield make
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
        if not parent_existed:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if empty: another run's directories stay
        held.close()


def _start_system_daemons(lan: Lan) -> None:
    h1, h2, h3 = lan.hosts
    token = cluster_init(h1.daemon_state_dir, None, mode="system", uses=2, addresses=[f"{h1.ip}:7172"])
    for h in (h2, h3):
        cluster_join(h.daemon_state_dir, token, mode="system", signer=h1.daemon_state_dir)  # offline enrollment
    for h in lan.hosts:
        run = h.root / "run"  # a socket directory other accounts can reach (the system daemon makes it 0755)
        run.mkdir(mode=0o755, exist_ok=True)
        h.start_daemon(config={**FAST_CLUSTER, "mode": "system"}, extra_args=["--runtime-dir", str(run)],
                       cpu_slots=2, log_level=QUIET, fake_gpus=GPU if h is not h1 else None, wait=False)
    for h in lan.hosts:
        h.wait_daemon()
    lan.wait_cluster(timeout_s=20)


def _submit_as(shared: SharedPython, who: Account, host: Host, *cmd: str) -> str:
    sock = host.root / "run" / "gpulayerd.sock"
    r = shared.cli(who, "--socket", str(sock), "submit", "--workdir", str(who.home), "--accelerator", "cuda",
                   "--gpus", "1", "--json", "--", *cmd)
    assert r.returncode == 0, f"submit as {who.name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    data: dict[str, Any] = json.loads(r.stdout)
    return str(data["id"])


def _row(e: ExplanationModel, host: Host) -> Any:
    return next((w for w in e.workers if w.worker == host.node_id), None)


def test_alices_jobs_never_run_where_she_has_no_account(lan_factory: Callable[..., Lan], accounts: Accounts,
                                                        shared_python: SharedPython,
                                                        etc_without: Callable[[Host, str], Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each daemon's socket is in <host>/run (--runtime-dir), where alice can reach it.
    monkeypatch.setattr(Host, "socket_path", property(lambda h: h.root / "run" / "gpulayerd.sock"))
    alice = accounts.user("alice")
    lan = lan_factory(3)
    h1, h2, h3 = lan.hosts
    etc_without(h3, alice.name)
    assert h2.run(["id", "-un", alice.name]).returncode == 0
    assert h3.run(["id", "-un", alice.name]).returncode != 0, "h3 must not see alice's account"
    _start_system_daemons(lan)

    whoami = 'id -un > "$HOME/whoami-$GPULAYER_JOB_ID"; sleep 30'  # the others wait queued meanwhile
    jobs = [_submit_as(shared_python, alice, h1, "/bin/sh", "-c", whoami) for _ in range(3)]

    def h3_rejects_alice() -> ExplanationModel | None:
        for job in jobs:
            e = h1.api(lambda c, j=job: c.explain(j))
            row = _row(e, h3)
            if row is not None and any(r.code == "NO_ACCOUNT" for r in row.rejections):
                return e
        return None

    e = lan.wait(h3_rejects_alice, timeout_s=90, what="explain to show that h3 has no account for alice")
    row = _row(e, h3)
    assert [r.message for r in row.rejections if r.code == "NO_ACCOUNT"] == [
        f"no account '{alice.name}' on {h3.hostname}"]
    h3_caps = h3.api(lambda c: c.devices())
    assert alice.name in h3_caps.missing_accounts
    # Never placed on h3; h2 (which has her account) is where they go.
    for job in jobs:
        v = h1.job(job)
        assert all(a.worker != h3.node_id for a in v.attempts), f"{job} was placed on h3: {v}"
    placed = [a.worker for job in jobs for a in h1.job(job).attempts]
    assert placed and set(placed) == {h2.node_id}, placed
    # On h2 the job runs as alice: the file it wrote in her home is hers and names her.
    written = lan.wait(lambda: [p for j in jobs if (p := alice.home / f"whoami-{j}").exists()
                                and p.read_text().strip()] or None, timeout_s=30, what="a job of alice to run")
    for p in written:
        assert p.read_text().strip() == alice.name
        assert p.stat().st_uid == alice.uid


# An owner's offer sent from inside a host's namespace with the certificate of STATE_DIR;
# prints the worker's answer as one JSON line.
OFFER = r"""
import asyncio, json, sys
from pathlib import Path
from gpulayerd.api.peer import PeerClient
from gpulayerd.errors import PeerRefused
from gpulayerd.net import identity, tls
from gpulayerd.net.transport import OFFER
from gpulayerd.net.wire import Offer, new_msg_id
state, host, port, user, workdir, marker = sys.argv[1:7]
ident = identity.load_or_create_identity(Path(state))

async def main():
    client = PeerClient(tls.client_ssl_context(ident))
    try:
        offer = Offer(msg_id=new_msg_id(), owner=ident.node_id, job_id="forged1", lease_s=30.0,
                      spec={"command": ["touch", marker], "workdir": workdir, "user": user})
        try:
            ack, who = await client.call_at(host, int(port), OFFER, offer)
        except PeerRefused as e:  # 403: the sender does not hold the offer's role
            print(json.dumps({"ok": False, "refused": True, "reason": e.reason}))
        else:
            print(json.dumps({"ok": ack.ok, "refused": False, "reason": ack.reason, "node": who.node_id}))
    finally:
        await client.close()

asyncio.run(main())
"""


def test_bobs_personal_node_cannot_offer_a_job_as_alice(lan_factory: Callable[..., Lan], accounts: Accounts,
                                                         tmp_path: Path) -> None:
    alice, bob = accounts.user("alice"), accounts.user("bob")
    lan = lan_factory(2)
    h1, h2 = lan.hosts
    token = cluster_init(h2.daemon_state_dir, None, mode="system", uses=2, addresses=[f"{h2.ip}:7172"])
    signer = h2.daemon_state_dir  # offline enrollment
    bobs_token = new_token(signer, user=bob.name, addresses=[f"{h2.ip}:7172"])  # the signer's admin made it for bob
    bobs = cluster_join(h1.root / "bob-state", bobs_token, user=bob.name, signer=signer)  # bob's node, on h1
    system = cluster_join(h1.root / "sys-state", token, mode="system", signer=signer)  # a system-mode node, on h1
    assert (bobs.mode, bobs.user, system.mode) == ("personal", bob.name, "system")
    h2.start_daemon(config={**FAST_CLUSTER, "mode": "system"}, cpu_slots=2, log_level=QUIET)
    marker = tmp_path / "forged-ran"

    def offer(state: Path, user: str) -> dict[str, Any]:
        r = h1.run([sys.executable, "-c", OFFER, str(state), h2.ip, "7171", user, "/tmp", str(marker)],
                   check=True, timeout_s=60)
        out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        return out

    refused = offer(bobs.state_dir, alice.name)
    assert (refused["ok"], refused["refused"]) == (False, True)  # 403: the offer's role (it vouches for alice)
    assert f"is {bob.name}'s personal-mode node: it cannot send jobs of '{alice.name}'" in refused["reason"]
    assert h2.api(lambda c: c.health()).counters.get("refused_offer", 0) == 1
    # A system-mode node vouches for alice, and h2 has her account: that offer is kept.
    assert offer(system.state_dir, alice.name)["ok"] is True
    time.sleep(2)  # several scheduling passes of h2 (its owner does not exist: the claim fails)
    assert not marker.exists()
    assert h2.api(lambda c: c.health()).counters.get("refused_offer", 0) == 1  # the second was not refused
