"""A connection the daemon refuses over its limits gets one 503 line, often before the CLI has sent
its request: the CLI reads that answer (after a broken pipe too) and says which limit, never
"gpulayerd is not running" (issue 24; 5 of 10 tries said so before)."""

from __future__ import annotations

import argparse
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayerd.api.unixsite import _refusal_answer
from gpulayerd.cli.exits import CommandFailed
from gpulayerd.cli.http import ApiRequestError, SyncClient, call_daemon

WHY = ("uid 1001 has 3 connections open to gpulayerd (at most 3 per user: local_max_connections_per_user); "
       "close some and try again")


@pytest.fixture
def refusing(tmp_path: Path) -> Iterator[Path]:
    """A unix socket whose server answers every connection at once with the daemon's refusal and
    closes it without reading anything (what LocalListener does over a limit)."""
    path = tmp_path / "s.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(64)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.send(_refusal_answer(WHY))
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path
    stop.set()
    srv.shutdown(socket.SHUT_RDWR)  # wakes the accept
    srv.close()
    t.join(5)


def test_the_refusal_is_read_whether_or_not_the_request_got_through(refusing: Path) -> None:
    for _ in range(30):  # the race: the server's close before, during or after the client's send
        with SyncClient(refusing, 5.0) as client, pytest.raises(ApiRequestError) as info:
            client.request("GET", "/v1/jobs")
        assert (info.value.status, info.value.code, info.value.message) == (503, "too_many_connections", WHY)


def test_the_cli_says_which_limit(refusing: Path) -> None:
    args = argparse.Namespace(socket=str(refusing), state_dir=None)
    with pytest.raises(CommandFailed, match="at most 3 per user: local_max_connections_per_user") as info:
        call_daemon(args, lambda c: c.request("GET", "/v1/jobs"))
    assert "not running" not in str(info.value)
