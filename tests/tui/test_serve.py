"""The read-only board (issue 39): ``gpulayer tui --read-only`` and ``gpulayer tui --serve``.

In process, with the fake daemon: a read-only app never asks the daemon to cancel, for a job's
detail or for a log, whatever key is pressed, and shows no command. Then the real thing: a real
gpulayerd with a running job (whose log and command hold a marker) and a queued one behind it,
``gpulayer tui --serve`` as a process, driven with aiohttp as a browser would drive it
(textual-serve's protocol: ``["stdin", KEYS]`` text messages up, terminal output as binary
messages down).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gpulayer_tui.app import make_app
from gpulayer_tui.readonly import HIDDEN, READ_ONLY, ReadOnlyApi, ReadOnlyRefused, board_view
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayerd.models import RequesterView
from tests.tui.daemon import RealDaemon, clean_env, tool
from tests.tui.fake_client import NOW, FakeDaemonClient, make_job, make_peer
from tests.tui.helpers import screen_text, wait_for
from tests.tui.test_keys import FAST

LOG_MARK = "LOGMARK39-only-its-user-reads-this"
CMD_MARK = "CMDMARK39-secret-flag"
ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


# ------------------------------------------------------------------ in process


def test_board_view_conceals_command_environment_workdir_and_history() -> None:
    job = make_job("m8kk00000001", "queued", name="sweep", owner="bob", command=("python", "train.py", CMD_MARK),
                   reason="Workdir: /home/alice/proj is not on lab-ws-03")
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"env": {"TOKEN": "s3cret"}})})
    view = board_view(job)
    assert view.spec.command == [HIDDEN] and view.spec.env == {} and view.spec.workdir is None
    assert view.spec_hidden and view.events == [] and view.attempts == [] and view.explanation is None
    assert view.reason == f"Workdir: {HIDDEN} is not on lab-ws-03"
    assert (view.id, view.name, view.submitted_by, view.status) == ("m8kk00000001", "sweep", "bob", "queued")
    dumped = view.model_dump_json()
    assert CMD_MARK not in dumped and "s3cret" not in dumped and "/home/alice" not in dumped


@pytest.mark.asyncio
async def test_read_only_api_refuses_without_asking_the_daemon() -> None:
    fake = FakeDaemonClient(jobs=[make_job("m8kk00000001")])
    api = ReadOnlyApi(fake)
    for call in (api.cancel("m8kk00000001"), api.logs("m8kk00000001"), api.job("m8kk00000001"),
                 api.explain("m8kk00000001")):
        with pytest.raises(ReadOnlyRefused) as refused:
            await call
        assert refused.value.status == 403 and refused.value.code == "read_only"
    assert [c[0] for c in fake.calls] == []
    assert [j.spec.command for j in await api.jobs()] == [[HIDDEN]]


@pytest.mark.asyncio
@pytest.mark.parametrize("admin", [True, False])
async def test_read_only_app_never_cancels_opens_a_detail_or_reads_a_log(admin: bool) -> None:
    """A read-only board: c (and y), F9, l, enter and a double click change nothing and read nothing, on the
    user's own job and on another's, for an admin (who could cancel both) and for a user."""
    jobs = [make_job("m8kk00000001", "running", name="mine", holder_name="lab-ws-02", command=("echo", CMD_MARK)),
            make_job("m8kk00000002", "queued", name="bobs", owner="bob")]
    fake = FakeDaemonClient(jobs=jobs, peers=[make_peer("lab-ws-02", state="self")],
                            requester=RequesterView(uid=1000, user="alice", admin=admin))
    fake.logs_by_job[("m8kk00000001", "stdout")] = LOG_MARK + "\n"
    app = make_app(fake, clock=lambda: NOW, settings=FAST, read_only=True)
    async with app.run_test(size=(120, 30)) as pilot:
        table = app.screen.query_one(JobsTable)
        await wait_for(pilot, lambda: table.row_count == 2, "the first load")
        assert "read-only" in app.title
        for key in ("c", "y", "f9", "enter", "y", "l", "j", "c", "enter", "l"):
            await pilot.press(key)
        await pilot.click(JobsTable, offset=(3, 2), times=2)
        await pilot.pause(0.1)
        assert isinstance(app.screen, MainScreen)
        assert {n.message for n in app._notifications} == {READ_ONLY}  # never "only bob may cancel it"
        text = screen_text(app)
        assert "m8kk00000001" in text and "m8kk00000002" in text
        assert CMD_MARK not in text and LOG_MARK not in text
        assert not app.screen.active_bindings.get("c") or not app.screen.active_bindings["c"].enabled
    for never in ("cancel", "logs", "job", "explain"):
        assert fake.count(never) == 0, fake.calls


@pytest.mark.parametrize(("argv", "said"), [
    (["--port", "9000"], "--port only go with --serve"),
    (["--serve", "--max-viewers", "0"], "--max-viewers must be at least 1"),
    (["--serve", "--port", "70000"], "--port must be 0..65535"),
    (["--serve", "--host", "0.0.0.0", "--port", "0"], "say with --origin"),
])
def test_serve_usage_errors(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gpulayerd.cli import main

    assert main(["--socket", "/nonexistent/gpulayerd.sock", "tui", *argv]) == 2
    assert said in capsys.readouterr().err


# ------------------------------------------------------------- the served board


@pytest.fixture
def lab() -> Iterator[tuple[RealDaemon, str, str]]:
    """A daemon with one CPU slot: a running job (its log and command hold the markers), a queued one behind it."""
    base_python = str(Path(sys.base_prefix) / "bin" / "python3")  # no torch to check: jobs start at once
    daemon = RealDaemon(cpu_slots=1, interpreter=base_python)
    try:
        daemon.start()
        running = daemon.submit("--name", "board-holder", "--", "sh", "-c", f"echo {LOG_MARK}; exec sleep 120")
        queued = daemon.submit("--name", "board-waits", "--", "echo", CMD_MARK)
        daemon.wait_status(running, {"running"}, timeout_s=30.0)
        end = time.monotonic() + 10
        while LOG_MARK not in daemon.cli_ok("logs", running):  # the log the board must never show
            assert time.monotonic() < end, "the job's log never got its line"
            time.sleep(0.05)
        yield daemon, running, queued
    finally:
        daemon.close()


def start_board(daemon: RealDaemon, *args: str) -> tuple[subprocess.Popen[str], str, str]:
    """``gpulayer tui --serve --port 0 ARGS``; returns the process, the origin and the token it printed."""
    proc = subprocess.Popen([tool("gpulayer"), "--state-dir", str(daemon.state_dir), "tui", "--serve", "--port", "0",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    assert proc.stdout is not None
    printed = []
    for line in proc.stdout:
        printed.append(line)
        found = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=([A-Za-z0-9_-]{40,})$", line.strip())
        if found:
            return proc, found.group(1), found.group(2)
    proc.wait(10)
    raise AssertionError(f"no URL printed; exit {proc.returncode}:\n{''.join(printed)}")


async def refused(session: aiohttp.ClientSession, url: str, origin: str | None) -> int:
    """The HTTP status that refused a websocket to ``url`` (fails if it opened)."""
    headers = {"Origin": origin} if origin else {}
    with pytest.raises(aiohttp.WSServerHandshakeError) as e:
        ws = await session.ws_connect(url, headers=headers)
        await ws.close()
    return e.value.status


async def read_until(ws: aiohttp.ClientWebSocketResponse, screen: bytearray, *wanted: str,
                     timeout_s: float = 10.0) -> str:
    """Add the terminal output to ``screen`` until every ``wanted`` is in it (escape sequences removed)."""
    end = time.monotonic() + timeout_s
    while True:
        text = ANSI.sub(b"", bytes(screen)).decode("utf-8", "replace")
        if all(w in text for w in wanted):
            return text
        if time.monotonic() > end:
            raise AssertionError(f"{wanted!r} not in the stream after {timeout_s} s:\n{text[-3000:]}")
        try:
            msg = await ws.receive(timeout=0.5)
        except asyncio.TimeoutError:
            continue
        if msg.type == aiohttp.WSMsgType.BINARY:
            screen += msg.data
        elif msg.type != aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"the websocket ended: {msg.type} {msg.data!r}\n{text[-3000:]}")


@pytest.mark.asyncio
async def test_served_board_needs_token_and_origin_shows_the_queue_and_stays_read_only(
        lab: tuple[RealDaemon, str, str]) -> None:
    daemon, running, queued = lab
    proc, origin, token = start_board(daemon, "--max-viewers", "2")
    try:
        async with aiohttp.ClientSession() as session:
            # the page, the static files and every route of textual-serve: only with the token
            for path in ("/", "/?token=", f"/?token={token[:-1]}", "/ws", "/static/js/textual.js",
                         "/download/x", f"/{token[:-1]}/ws", f"/x/{token}/ws", "/favicon.ico"):
                async with session.get(origin + path) as r:
                    assert r.status == 403, path
                    assert token not in await r.text()
            async with session.get(f"{origin}/?token={token}") as r:
                page = await r.text()
                assert r.status == 200 and r.headers["Referrer-Policy"] == "no-referrer"
                assert f'data-session-websocket-url="ws://{origin[7:]}/{token}/ws"' in page
            async with session.get(f"{origin}/{token}/static/js/textual.js") as r:
                assert r.status == 200
            # the websocket: without the token, or from another origin (or none), no websocket
            ws_url = origin.replace("http", "ws") + f"/{token}/ws?width=120&height=30"
            assert await refused(session, origin.replace("http", "ws") + "/ws", origin) == 403
            assert await refused(session, origin.replace("http", "ws") + f"/{token[:-1]}x/ws", origin) == 403
            assert await refused(session, ws_url, "http://evil.example") == 403
            assert await refused(session, ws_url, origin.replace("127.0.0.1", "127.0.0.2")) == 403
            assert await refused(session, ws_url, None) == 403

            viewer = await session.ws_connect(ws_url, headers={"Origin": origin})
            second = await session.ws_connect(ws_url, headers={"Origin": origin.replace("127.0.0.1", "localhost")})
            try:
                assert await refused(session, ws_url, origin) == 503  # a third viewer, over --max-viewers 2
                screen = bytearray()
                await read_until(viewer, screen, running, queued, "board-waits", "queued")
                # c (then y, as a confirmation would want), F9, l and enter on both rows
                for keys in ("c", "y", "\x1b[20~", "l", "\r", "j", "c", "y", "l", "\r"):
                    await viewer.send_str(json.dumps(["stdin", keys]))
                assert len(board_tuis(daemon)) == 2  # one TUI per viewer
                await read_until(viewer, screen, READ_ONLY)
                await asyncio.sleep(0.5)  # whatever the keys would have led to has had time to show
                await read_until(viewer, screen, running)
                text = ANSI.sub(b"", bytes(screen)).decode("utf-8", "replace")
                assert LOG_MARK not in text and CMD_MARK not in text
                assert "Cancel" not in text and "Logs" not in text
                # nothing changed: the running job runs, the queued one waits, neither is being cancelled
                for job_id, status in ((running, "running"), (queued, "queued")):
                    job = await asyncio.to_thread(daemon.job, job_id)  # (it runs a loop of its own)
                    assert (job.status, job.cancel_requested) == (status, False)
                # a viewer that leaves ends its TUI and frees its place
                await viewer.close()
                end = time.monotonic() + 10
                while len(board_tuis(daemon)) != 1:
                    assert time.monotonic() < end, board_tuis(daemon)
                    await asyncio.sleep(0.05)
                while True:  # (the server counts the viewer out once its TUI's end has been read)
                    try:
                        third = await session.ws_connect(ws_url, headers={"Origin": origin})
                        break
                    except aiohttp.WSServerHandshakeError as e:
                        assert e.status == 503 and time.monotonic() < end, e
                        await asyncio.sleep(0.05)
                await third.close()
                # the board stops (SIGTERM) while a viewer watches: that viewer is closed, its TUI ends
                proc.send_signal(signal.SIGTERM)
                end = time.monotonic() + 15
                while (await second.receive(timeout=15)).type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    assert time.monotonic() < end, "the board went on after SIGTERM"
                assert second.closed
            finally:
                await viewer.close()
                await second.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert LOG_MARK not in out and CMD_MARK not in out
    assert board_tuis(daemon) == [], "a viewer's TUI outlived the board"


def board_tuis(daemon: RealDaemon) -> list[int]:
    """Pids of the viewers' TUIs of ``daemon``'s board still running (their command names its socket)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpulayer_tui" in argv and str(daemon.socket_path).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


@pytest.mark.filterwarnings("ignore:shutdown_timeout should be set on BaseRunner:DeprecationWarning")
def test_a_viewer_cannot_ask_for_a_terminal_of_any_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The page's ``width``/``height`` and a ``resize`` message come from the browser: a viewer with the
    URL must not make the board's TUI draw a screen of a billion cells (memory, CPU of the board's machine)."""
    from textual_serve.app_service import AppService

    from gpulayer_tui.serve import BoardServer

    sizes: list[tuple[int, int]] = []

    async def start(self: AppService, width: int, height: int) -> None:
        sizes.append((width, height))

    async def set_terminal_size(self: AppService, width: int, height: int) -> None:
        sizes.append((width, height))

    async def stop(self: AppService) -> None:
        return None

    monkeypatch.setattr(AppService, "start", start)
    monkeypatch.setattr(AppService, "set_terminal_size", set_terminal_size)
    monkeypatch.setattr(AppService, "stop", stop)
    server = BoardServer(tmp_path / "no.sock", port=0, command="exec true")

    async def view() -> None:
        await server.start()
        try:
            origin = f"http://127.0.0.1:{server.port}"
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(f"{origin}/{server.token}/ws?width=1000000000&height=1000000000",
                                              headers={"Origin": origin})
                await ws.send_str(json.dumps(["resize", {"width": 10**9, "height": 10**9}]))
                await ws.send_str(json.dumps(["ping", "x"]))
                await ws.receive(timeout=5)
                await ws.close()
        finally:
            await server.stop()

    asyncio.run(view())
    assert len(sizes) == 2, sizes
    assert all(1 <= w <= 1000 and 1 <= h <= 1000 for w, h in sizes), sizes
