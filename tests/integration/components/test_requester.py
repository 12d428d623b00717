"""Who is asking the local API, and may they (issue 11): requesters, ownership, personal mode.

The ownership rules run through the real owner service of the usual :class:`Lab`, with
:class:`Requester` values made by hand; the requester lookups use real accounts (the
``accounts`` fixture) and the kernel's peer credentials; the HTTP tests serve a real
:func:`make_local_app` on a unix socket in a short temporary directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from gpulayerd import routes
from gpulayerd.api.client import ApiRequestError, DaemonClient
from gpulayerd.api.server import make_local_app
from gpulayerd.app.common.requester import (
    DEFAULT_JOB_PATH,
    HIDDEN,
    PeerCredentials,
    Requester,
    Requesters,
    peer_credentials,
)
from gpulayerd.app.local import LocalApi
from gpulayerd.app.roles import LocalRoles
from gpulayerd.errors import Forbidden
from gpulayerd.models import RequesterView, SubmitRequest
from gpulayerd.models.jobs_query import MAX_IDS
from tests.fakes.accounts import Accounts
from tests.fakes.daemons import OWNER, Lab, d

ALICE = Requester(uid=1001, user="alice", gids=(1001,))
BOB = Requester(uid=1002, user="bob", gids=(1002,))
CAROL_ADMIN = Requester(uid=1003, user="carol", gids=(1003, 1500), admin=True)


def alice_spec(lab: Lab) -> dict[str, Any]:
    return {"command": ["python", "train.py", "--lr", "3e-4"], "workdir": str(lab.workdir), "name": "sweep",
            "env": {"HF_TOKEN": "s3cret"}, "user": "mallory", "path": "/evil/bin"}


async def submit_as_alice(lab: Lab) -> str:
    owner = d(lab, "owner").services.owner
    view = await owner.submit(SubmitRequest(spec=alice_spec(lab), submitted_by="mallory", path="/opt/bin:/usr/bin"),
                              ALICE)
    await lab.settle()
    return str(view.id)


# ------------------------------------------------------------------ submit


@pytest.mark.asyncio
async def test_submit_takes_the_user_from_the_requester_and_the_path_from_the_request(lab: Lab) -> None:
    job = await submit_as_alice(lab)
    view = await lab.job(d(lab, "owner"), job)
    assert view.submitted_by == "alice"  # not the body's "mallory"
    assert view.spec.user == "alice"  # not the spec's "mallory"
    assert view.spec.path == "/opt/bin:/usr/bin"  # SubmitRequest.path, not the spec's
    assert view.spec_hidden is False
    row = await d(lab, "owner").store.jobs.get_job(job)
    assert row is not None and row.submitted_by == "alice"
    assert '"user":"alice"' in row.spec_json  # what workers get with offers and claims


@pytest.mark.asyncio
async def test_submit_without_a_path_gets_the_safe_default(lab: Lab) -> None:
    spec = {"command": ["true"], "workdir": str(lab.workdir)}
    view = await d(lab, "owner").services.owner.submit(SubmitRequest(spec=spec), BOB)
    assert (view.submitted_by, view.spec.user, view.spec.path) == ("bob", "bob", DEFAULT_JOB_PATH)
    assert DEFAULT_JOB_PATH == "/usr/local/bin:/usr/bin:/bin"


@pytest.mark.asyncio
async def test_a_path_with_a_nul_byte_is_refused(lab: Lab) -> None:
    spec = {"command": ["true"], "workdir": str(lab.workdir)}
    with pytest.raises(Exception, match="path: must not contain a NUL byte"):
        await d(lab, "owner").services.owner.submit(SubmitRequest(spec=spec, path="/bin\0/x"), BOB)


# ------------------------------------------------------------------ ownership


@pytest.mark.asyncio
async def test_bob_cannot_cancel_or_read_the_logs_of_alices_job(lab: Lab) -> None:
    job = await submit_as_alice(lab)
    api = d(lab, "owner").services.api  # the local routes' role check (the API runs it before the handler)
    with pytest.raises(Forbidden, match=f"^job {job} belongs to alice$") as err:
        await api.async_authorize(routes.LOCAL["cancel"], BOB, job)
    assert err.value.code == "forbidden"
    with pytest.raises(Forbidden, match=f"^job {job} belongs to alice$"):
        await api.async_authorize(routes.LOCAL["logs"], BOB, job)
    with pytest.raises(Forbidden, match=f"^job {job} belongs to alice$"):
        await api.async_authorize(routes.LOCAL["cancel"], BOB, job[:8])  # a prefix names the same job
    view = await lab.job(d(lab, "owner"), job)
    assert (view.status, view.cancel_requested) == ("queued", False)  # nothing changed


@pytest.mark.asyncio
async def test_the_user_and_an_admin_may_cancel_and_read_logs(lab: Lab) -> None:
    job = await submit_as_alice(lab)
    owner = d(lab, "owner").services.owner
    api = d(lab, "owner").services.api
    for who in (ALICE, CAROL_ADMIN):
        for name in ("cancel", "logs"):
            await api.async_authorize(routes.LOCAL[name], who, job)  # holds the role: no exception
    chunk = await owner.logs(job, "stdout", 0, None, ALICE)
    assert (chunk.job_id, chunk.data) == (job, "")
    assert (await owner.logs(job, "stderr", 0, None, CAROL_ADMIN)).job_id == job
    cancelled = await owner.cancel(job, CAROL_ADMIN)
    assert cancelled.status == "cancelled"
    other = await submit_as_alice(lab)
    assert (await owner.cancel(other, ALICE)).status == "cancelled"


@pytest.mark.asyncio
async def test_others_see_who_what_and_where_but_not_the_command_env_or_paths(lab: Lab) -> None:
    job = await submit_as_alice(lab)
    owner = d(lab, "owner").services.owner
    seen = await owner.get_job(job, BOB)
    assert (seen.id, seen.name, seen.submitted_by, seen.status, seen.owner) == (job, "sweep", "alice", "queued", OWNER)
    assert seen.reason == "waiting for the scheduler"
    assert seen.spec_hidden is True
    assert seen.spec.user == "alice" and seen.spec.name == "sweep"
    assert seen.spec.command == [HIDDEN]
    assert seen.spec.env == {} and seen.spec.workdir is None and seen.spec.path is None
    assert seen.spec.requirements.accelerator.value == "cpu"
    assert "s3cret" not in seen.model_dump_json() and "train.py" not in seen.model_dump_json()
    assert [e.to_status for e in seen.events] == ["queued"]  # the history stays visible

    listed = {j.id: j for j in await owner.list_jobs(None, None, "local", BOB)}
    assert listed[job].spec_hidden and listed[job].spec.command == [HIDDEN] and listed[job].submitted_by == "alice"
    for who in (ALICE, CAROL_ADMIN, None):
        full = await owner.get_job(job, who)
        assert full.spec_hidden is False and full.spec.env == {"HF_TOKEN": "s3cret"}
        assert full.spec.command == ["python", "train.py", "--lr", "3e-4"]
        assert (await owner.list_jobs(None, None, "local", who))[0].spec.env == {"HF_TOKEN": "s3cret"}


@pytest.mark.asyncio
async def test_peers_jobs_listed_across_the_cluster_are_concealed_too(lab: Lab) -> None:
    job = await submit_as_alice(lab)
    d(lab, "w1").node.mode, d(lab, "w1").node.user = "system", ""  # its certificate vouches for alice and bob
    w1 = d(lab, "w1").services.owner
    listed = {j.id: j for j in await w1.list_jobs(None, None, "cluster", BOB)}
    assert listed[job].submitted_by == "alice" and listed[job].spec_hidden
    assert listed[job].spec.command == [HIDDEN]
    mine = {j.id: j for j in await w1.list_jobs(None, None, "cluster", ALICE)}
    assert not mine[job].spec_hidden and mine[job].spec.command[:2] == ["python", "train.py"]
    assert mine[job].spec.env == {"HF_TOKEN": ""}  # values only for the node that runs it
    # A personal node (root's) speaks only for its own user: alice's listing through it is concealed.
    d(lab, "w1").node.mode, d(lab, "w1").node.user = "personal", "root"
    theirs = {j.id: j for j in await w1.list_jobs(None, None, "cluster", ALICE)}
    assert theirs[job].spec_hidden and theirs[job].spec.command == [HIDDEN]


def test_conceal_keeps_a_view_for_its_user_and_admins() -> None:
    assert BOB.may_manage("bob") and not BOB.may_manage("alice") and not BOB.may_manage("")
    assert CAROL_ADMIN.may_manage("alice") and CAROL_ADMIN.may_manage("")


# ------------------------------------------------------------------ who is asking


def test_peer_credentials_come_from_the_kernel() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        creds = peer_credentials(a)
    assert creds == PeerCredentials(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        assert peer_credentials(tcp) is None
    assert peer_credentials(None) is None


def _unused_uid() -> int:
    uid = 54321
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


@pytest.mark.asyncio
async def test_requesters_name_users_and_admins(accounts: Accounts) -> None:
    admins = accounts.group("admin")
    carol = accounts.user("carol", groups=[admins])
    bob = accounts.user("bob")
    system = Requesters(mode="system", admin_group=admins)
    c = await system.resolve(PeerCredentials(uid=carol.uid, gid=carol.gid, pid=4321))
    assert (c.user, c.uid, c.admin, c.pid) == (carol.name, carol.uid, True, 4321)
    assert set(c.gids) == set(carol.groups)
    b = await system.resolve(PeerCredentials(uid=bob.uid))
    assert (b.user, b.admin) == (bob.name, False)
    root = await system.resolve(PeerCredentials(uid=0))
    assert (root.user, root.admin) == ("root", True)
    nobody = _unused_uid()
    assert (await system.resolve(PeerCredentials(uid=nobody))).user == f"uid {nobody}"
    no_group = Requesters(mode="system", admin_group="no-such-group-gl")
    assert (await no_group.resolve(PeerCredentials(uid=carol.uid))).admin is False


@pytest.mark.asyncio
async def test_a_personal_daemon_serves_only_its_own_user_root_included(accounts: Accounts) -> None:
    bob = accounts.user("bob")
    personal = Requesters(mode="personal", admin_group="", daemon_uid=bob.uid)
    me = await personal.resolve(PeerCredentials(uid=bob.uid))
    assert (me.user, me.admin) == (bob.name, True)  # the daemon's own user is admin of its daemon
    with pytest.raises(Forbidden, match=f"^this gpulayerd serves only {bob.name} ") as err:
        await personal.resolve(PeerCredentials(uid=0))
    assert err.value.code == "forbidden"
    as_root = Requesters(mode="personal", admin_group="", daemon_uid=0)
    assert (await as_root.resolve(PeerCredentials(uid=0))).user == "root"  # a personal daemon of root (CI)
    with pytest.raises(Forbidden, match=r"^this gpulayerd serves only root "):
        await as_root.resolve(PeerCredentials(uid=bob.uid))


# ------------------------------------------------------------------ over the socket


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for a unix socket (paths are limited to about 100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="glrq-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture
async def serve(lab: Lab, short_dir: Path) -> AsyncIterator[Any]:
    """``await serve(requesters)``: the owner's local API on a unix socket; returns its path."""
    runners: list[web.AppRunner] = []

    async def start(requesters: Requesters) -> Path:
        o = d(lab, "owner")
        api = LocalApi(node_id=OWNER, hostname="owner", version="test", state_dir=str(o.config.state_dir),
                       owner=o.services.owner, machine=o.services.machine, directory=None,
                       signals=o.services.signals, clock=lab.clock, requesters=requesters,
                       roles=LocalRoles(store=o.store, jobs=o.services.jobs))
        runner = web.AppRunner(make_local_app(api), handle_signals=False, access_log=None)
        await runner.setup()
        runners.append(runner)
        path = short_dir / f"{len(runners)}.sock"
        await web.UnixSite(runner, str(path)).start()
        return path

    try:
        yield start
    finally:
        for r in runners:
            await r.cleanup()


@pytest.mark.asyncio
async def test_the_body_cannot_claim_another_user(lab: Lab, serve: Any) -> None:
    sock = await serve(Requesters(mode="system", admin_group=""))
    spec = {"command": ["true"], "workdir": str(lab.workdir), "user": "alice"}
    async with DaemonClient(sock) as c:
        job = await c.submit(spec, submitted_by="alice", path="/opt/x/bin:/usr/bin")
        assert (job.submitted_by, job.spec.user, job.spec.path) == ("root", "root", "/opt/x/bin:/usr/bin")
        assert (await c.job(job.id)).submitted_by == "root"


@pytest.mark.asyncio
async def test_a_personal_daemon_of_another_account_answers_403(lab: Lab, serve: Any) -> None:
    nobody = _unused_uid()
    sock = await serve(Requesters(mode="personal", admin_group="", daemon_uid=nobody))
    async with DaemonClient(sock) as c:
        for call in (c.jobs(), c.health()):
            with pytest.raises(ApiRequestError) as err:
                await call
            assert (err.value.status, err.value.code) == (403, "forbidden")
            assert err.value.body.message.startswith(f"this gpulayerd serves only uid {nobody} ")


class _EveryoneIsBob(Requesters):
    """The user database of this test: every uid is bob (no admin)."""

    def lookup(self, uid: int) -> Requester:
        return BOB


@pytest.mark.asyncio
async def test_another_users_cancel_and_logs_answer_403_naming_the_owner(lab: Lab, serve: Any) -> None:
    job = await submit_as_alice(lab)
    sock = await serve(_EveryoneIsBob(mode="system", admin_group=""))
    async with DaemonClient(sock) as c:
        # health says who asks, from the kernel: the TUI offers cancel by it
        assert (await c.health()).requester == RequesterView(uid=BOB.uid, user="bob", admin=False)
        for call in (c.cancel(job), c.logs(job)):
            with pytest.raises(ApiRequestError) as err:
                await call
            assert (err.value.status, err.value.code, err.value.body.message) == (
                403, "forbidden", f"job {job} belongs to alice")
        seen = await c.job(job)
        assert (seen.submitted_by, seen.spec_hidden, seen.spec.command, seen.spec.env) == ("alice", True, [HIDDEN], {})
        listed = await c.jobs()
        assert [(j.id, j.spec_hidden) for j in listed] == [(job, True)]
    assert (await lab.job(d(lab, "owner"), job)).cancel_requested is False


@pytest.mark.asyncio
async def test_jobs_by_ids_show_each_job_as_the_listing_does_and_nothing_more(lab: Lab, serve: Any) -> None:
    alices = await submit_as_alice(lab)
    bobs = (await d(lab, "owner").services.owner.submit(
        SubmitRequest(spec={"command": ["true"], "workdir": str(lab.workdir), "name": "b"}), BOB)).id
    elsewhere = (await d(lab, "w1").services.owner.submit(  # owned by w1: not in the owner's listing
        SubmitRequest(spec={"command": ["true"], "workdir": str(lab.workdir)}), BOB)).id
    await lab.settle()
    sock = await serve(_EveryoneIsBob(mode="system", admin_group=""))
    async with DaemonClient(sock) as c:
        listed = {j.id: j for j in await c.jobs()}
        assert elsewhere not in listed
        got = await c.jobs(ids=[bobs, "m8no-such-job", elsewhere, alices])
        assert [j.id for j in got] == [alices, bobs]  # submission order; unknown and others' ids left out
        for j in got:
            assert j == listed[j.id]  # exactly as listed: alice's command, env and workdir concealed
        assert got[0].spec_hidden and got[0].spec.command == [HIDDEN] and "s3cret" not in got[0].model_dump_json()
        assert not got[1].spec_hidden
        state = got[0].status
        assert await c.jobs(statuses=[state], ids=[alices, bobs]) == [j for j in got if j.status == state]
        assert await c.jobs(ids=[]) == []
        many = [f"m8id{i:08d}" for i in range(MAX_IDS - 1)]  # job ids have 12 characters
        assert [j.id for j in await c.jobs(ids=[*many, bobs])] == [bobs]  # the most one request takes
        with pytest.raises(ApiRequestError) as err:
            await c.jobs(ids=[f"m8id{i:08d}" for i in range(MAX_IDS + 1)])
        assert (err.value.status, err.value.code) == (400, "bad_request")
        assert f"at most {MAX_IDS} job ids" in err.value.body.message


@pytest.mark.asyncio
async def test_the_change_feed_sends_a_burst_once_per_job(lab: Lab, serve: Any) -> None:
    sock = await serve(Requesters(mode="system", admin_group=""))
    signals = d(lab, "owner").services.signals
    async with DaemonClient(sock) as c:
        stream = c.events()
        assert (await anext(stream)).kind == "resync"
        for _ in range(50):  # a job rewritten 50 times before the stream is read: one change
            signals.job_changed("m8aaaa")
            signals.job_changed("m8bbbb")
        signals.devices_changed()
        got = [await anext(stream) for _ in range(3)]
        assert [(e.kind, e.key) for e in got] == [("job", "m8aaaa"), ("job", "m8bbbb"), ("devices", "")]
        signals.job_changed("m8aaaa")  # taken: a new change of the same job is sent again
        assert ((e := await anext(stream)).kind, e.key) == ("job", "m8aaaa")
        await stream.aclose()
