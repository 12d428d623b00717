"""What broke a connection to the daemon, in words (issue 29: the TUI's first disconnect message was
``<TransferEncodingError: 400, message='Not enough data to satisfy transfer length header.'>``).

Real sockets in a short temporary directory: no socket file, a socket nobody listens on, a server
that hangs up before answering, and one that cuts its event stream in the middle of a chunk.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import http_exceptions

from gpulayerd.api.client import DaemonClient, DaemonUnreachable, connection_problem

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for unix sockets (paths are limited to about 100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="glcp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture
async def server(short_dir: Path) -> AsyncIterator[Callable[[Handler], Awaitable[Path]]]:
    """``await server(handler)``: a raw unix-socket server answering with ``handler``; returns its path."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> Path:
        path = short_dir / f"{len(servers)}.sock"
        servers.append(await asyncio.start_unix_server(handler, path=str(path)))
        return path

    try:
        yield start
    finally:
        for s in servers:
            s.close()
            await s.wait_closed()


def test_aiohttp_errors_read_as_words_never_as_a_repr() -> None:
    cut = aiohttp.ClientPayloadError("Response payload is not completed", http_exceptions.TransferEncodingError(
        "Not enough data to satisfy transfer length header."))
    assert connection_problem(cut) == "the daemon closed the connection in the middle of an answer"
    assert connection_problem(aiohttp.ServerDisconnectedError()) == "the daemon closed the connection"
    assert connection_problem(ConnectionResetError(104, "Connection reset by peer")) == \
        "the daemon closed the connection"
    assert connection_problem(aiohttp.SocketTimeoutError("Timeout on reading data from socket")) == \
        "no answer in time (the daemon is overloaded or stopped)"
    assert connection_problem(ValueError("odd \x1b[2J")) == "ValueError: odd \\x1b[2J"  # escaped, never obeyed


@pytest.mark.asyncio
async def test_no_socket_and_nobody_listening_say_so(short_dir: Path) -> None:
    missing = short_dir / "gpulayerd.sock"
    async with DaemonClient(missing) as c:
        with pytest.raises(DaemonUnreachable) as err:
            await c.health()
    assert str(err.value) == f"cannot reach gpulayerd at {missing}: no such file (is gpulayerd running?)"
    stale = short_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:  # bound, never listening: what a daemon that died leaves
        s.bind(str(stale))
        async with DaemonClient(stale) as c:
            with pytest.raises(DaemonUnreachable) as err:
                await c.jobs()
    assert err.value.cause == ("connection refused: nothing listens on it (a daemon that died leaves its socket "
                               "behind)")


@pytest.mark.asyncio
async def test_a_daemon_that_hangs_up_says_it_closed_the_connection(server: Callable[[Handler], Awaitable[Path]]
                                                                    ) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    async def cut_the_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        event = b'event: resync\ndata: {"kind":"resync","key":""}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n%s\r\n" % (len(event), event)  # one whole event, then half a chunk
                     + b"40\r\nevent: jo")
        await writer.drain()
        writer.close()

    async with DaemonClient(await server(hang_up)) as c:
        with pytest.raises(DaemonUnreachable) as err:
            await c.health()
    assert err.value.cause == "the daemon closed the connection"
    async with DaemonClient(await server(cut_the_stream)) as c:
        seen = []
        with pytest.raises(DaemonUnreachable) as err:
            async for change in c.events():
                seen.append(change.kind)
    assert seen == ["resync"]
    assert err.value.cause == "the daemon closed the connection in the middle of an answer", err.value
