"""A watchdog's exit record kept in memory while ``exit.json`` cannot be written (a full disk).

The watchdog is not the daemon's child (it detaches with a fork, see :mod:`.watchdog`), so
its own exit status never reaches the daemon, and a pidfd only says that it exited. When
``exit.json`` cannot be written (ENOSPC, EDQUOT, EIO), the watchdog does not give up: it
stays alive with its device locks, retries the file with backoff (:func:`retry_delays`),
and meanwhile serves the record on a Linux abstract unix socket, which needs no disk
(:class:`ExitNote`). The daemon's :class:`~gpulayerd.runs.runner.Runner` asks it there
(:func:`ask`) while the watchdog lives without ``exit.json``, records the end in its
store, and then confirms (``ack``): the watchdog exits at once. Otherwise it exits once
the file is written, or after ``keep_s`` (no daemon came: the attempt ends up "gone").

Both sides check who is at the other end (``SO_PEERCRED``): the daemon trusts a record
only from the watchdog's pid; the watchdog answers only its own account or root. The
socket's name is ``gpulayerd-exit-PID-START``; a process that took the name first cannot
pass for the watchdog, it only makes the daemon wait for the file.

Standard library only: the watchdog imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Iterator, Mapping

from gpulayerd.runs.waiting import readable

__all__ = ["KEEP_S", "ExitNote", "ask", "retry_delays", "socket_name"]

KEEP_S = 3600.0
"""How long a watchdog keeps an exit record nobody collected (seconds)."""

_ACK = b"recorded\n"
_MAX_RECORD = 64 * 1024
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def retry_delays(first_s: float = 0.05, cap_s: float = 2.0) -> Iterator[float]:
    """Backoff between tries: ``first_s``, doubled each time, at most ``cap_s`` (seconds), forever."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, cap_s)


def socket_name(pid: int, start: int | float | None) -> bytes | None:
    """The abstract socket name of watchdog ``pid`` started at ``start``; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return f"\0gpulayerd-exit-{pid}-{start}".encode()


class ExitNote:
    """The watchdog's end of the channel: answers every asker with ``record`` (one JSON line).

    Args:
        name: from :func:`socket_name`; None (or a name already taken) leaves the note
            closed: :meth:`serve` then only waits.
        record: what ``exit.json`` would hold.

    Attributes:
        recorded: True once the daemon confirmed that it recorded the end.
    """

    def __init__(self, name: bytes | None, record: Mapping[str, object]) -> None:
        self._line = json.dumps(dict(record), sort_keys=True).encode() + b"\n"
        self._sock: socket.socket | None = None
        self.recorded = False
        if name is None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(name)
            sock.listen(8)
        except OSError:
            sock.close()
            return
        self._sock = sock

    @property
    def listening(self) -> bool:
        """True when the daemon can ask for the record."""
        return self._sock is not None

    def serve(self, timeout_s: float) -> None:
        """Answer askers for up to ``timeout_s`` seconds (returns early once :attr:`recorded`)."""
        if self._sock is None:
            time.sleep(max(timeout_s, 0.0))
            return
        if not readable([self._sock.fileno()], timeout_s):
            return
        conn, _ = self._sock.accept()
        with conn:
            conn.settimeout(1.0)
            _pid, uid, _gid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            if uid not in (0, os.geteuid()):
                return
            with contextlib.suppress(OSError):
                conn.sendall(self._line)
                if conn.recv(len(_ACK)) == _ACK:
                    self.recorded = True

    def close(self) -> None:
        """Stop answering."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def ask(pid: int, start: int | float | None, *, ack: bool = False, timeout_s: float = 1.0) -> dict[str, object] | None:
    """The exit record that watchdog ``pid`` keeps in memory, or None (it keeps none, or is not it).

    Args:
        pid, start: the watchdog (its pid and the start recorded in ``watchdog.json``).
        ack: tell it that the end is recorded (it then exits and releases its locks).
        timeout_s: how long to wait for its answer.
    """
    name = socket_name(pid, start)
    if name is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(name)
            peer, _uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            if peer != pid:
                return None  # someone else took the name: never trust its record
            data = b""
            while not data.endswith(b"\n") and len(data) < _MAX_RECORD:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            record = json.loads(data)
            if ack and isinstance(record, dict):
                sock.sendall(_ACK)
        except (OSError, ValueError):
            return None
    return record if isinstance(record, dict) else None
