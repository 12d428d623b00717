"""Limits on the peer port's open connections, applied as each connection is accepted.

A stranger needs no certificate to open TCP connections, and every open one costs a file
descriptor until its TLS handshake ends. So the listening socket itself counts them:
:class:`LimitedListener` is the socket the event loop accepts on, and it closes a
connection over a limit at once (a reset, before any TLS byte is read or any protocol
object exists); a connection it lets through is a :class:`CountedSocket` that gives its
slot back when it is closed (by the transport, or when collected).

Limits: open connections in total and per remote address (an IPv4 or IPv6 address as the
kernel reports it). Refusals are counted and logged once per address per minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ConnectionLimits", "CountedSocket", "LimitStats", "LimitedListener", "fitted_total", "soft_file_limit"]

log = logging.getLogger(__name__)

_REFUSALS_PER_ACCEPT = 64
"""How many over-limit connections one ``accept()`` call drops before letting the loop run."""

_LOG_EVERY_S = 60.0
_LOG_MEMORY = 4096
"""At most this many addresses remembered for the log-once rule (older ones are forgotten)."""


def fitted_total(requested: int, soft_file_limit: int) -> int:
    """The total connection limit to use: ``requested``, at most half the soft open-files limit.

    The other half stays for the store, job logs, local API clients and outgoing peer calls,
    so a flood of the peer port never starves the local API. At least 1.
    """
    return max(1, min(requested, soft_file_limit // 2))


def soft_file_limit() -> int:
    """This process's soft limit on open files (RLIMIT_NOFILE; unlimited reads as 2**20)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


@dataclass(frozen=True, slots=True)
class LimitStats:
    """A snapshot of a :class:`ConnectionLimits`.

    Attributes:
        open_total: connections open now.
        addresses: remote addresses with at least one open connection.
        refused_total: connections refused since start, all reasons.
        refused_per_address: of those, refused because their address was at its limit.
    """

    open_total: int
    addresses: int
    refused_total: int
    refused_per_address: int


class ConnectionLimits:
    """Counts open connections per remote address and in total; says whether one more may open.

    Not thread-safe: used from the event loop only (the listener accepts there).
    """

    def __init__(self, total: int, per_address: int, clock: Callable[[], float]) -> None:
        """Args: ``total`` and ``per_address`` at least 1; ``clock`` gives monotonic seconds (for logging).

        Raises:
            ValueError: a limit below 1.
        """
        if total < 1 or per_address < 1:
            raise ValueError(f"connection limits must be at least 1 (total={total}, per_address={per_address})")
        self.total = total
        self.per_address = per_address
        self._clock = clock
        self._open: dict[str, int] = {}
        self._open_total = 0
        self._refused_total = 0
        self._refused_per_address = 0
        self._logged: dict[str, tuple[float, int]] = {}  # address -> (last log time, refusals since)

    @classmethod
    def fitted(cls, total: int, per_address: int, clock: Callable[[], float]) -> ConnectionLimits:
        """Limits with ``total`` lowered by :func:`fitted_total` to this process's soft open-files limit.

        Call it after the daemon raised its soft limit; a lowered total is logged.
        """
        soft = soft_file_limit()
        fitted = fitted_total(total, soft)
        if fitted < total:
            log.warning("peer port: at most %d open connections (not %d): the open files limit is %d; "
                        "raise it (LimitNOFILE in the service file) to allow more", fitted, total, soft)
        return cls(fitted, per_address, clock)

    def try_open(self, address: str) -> bool:
        """Take a slot for a new connection from ``address``; False (counted, logged) when over a limit."""
        held = self._open.get(address, 0)
        if held >= self.per_address:
            self._refuse(address, f"{self.per_address} open connections from this address")
            self._refused_per_address += 1
            return False
        if self._open_total >= self.total:
            self._refuse(address, f"{self.total} open connections in total")
            return False
        self._open[address] = held + 1
        self._open_total += 1
        return True

    def closed(self, address: str) -> None:
        """Give back the slot of a connection from ``address`` (once per successful :meth:`try_open`)."""
        held = self._open.get(address, 0)
        if held <= 0:
            return
        if held == 1:
            del self._open[address]
        else:
            self._open[address] = held - 1
        self._open_total -= 1

    def open_for(self, address: str) -> int:
        """Connections open now from ``address``."""
        return self._open.get(address, 0)

    def stats(self) -> LimitStats:
        """Counts now."""
        return LimitStats(self._open_total, len(self._open), self._refused_total, self._refused_per_address)

    def _refuse(self, address: str, limit: str) -> None:
        self._refused_total += 1
        now = self._clock()
        last, since = self._logged.get(address, (None, 0))
        if last is not None and now - last < _LOG_EVERY_S:
            self._logged[address] = (last, since + 1)
            return
        if len(self._logged) >= _LOG_MEMORY:
            self._forget(now)
        self._logged[address] = (now, 0)
        more = f" (and {since} more since the last message)" if since else ""
        log.warning("peer port: refused a connection from %s: already %s%s; "
                    "next message about this address in a minute at the earliest", address, limit, more)

    def _forget(self, now: float) -> None:
        for address, (last, _) in list(self._logged.items()):
            if now - last >= _LOG_EVERY_S:
                del self._logged[address]
        while len(self._logged) >= _LOG_MEMORY:  # all recent: drop the oldest entries
            del self._logged[next(iter(self._logged))]


class CountedSocket(socket.socket):
    """An accepted connection holding a slot of a :class:`ConnectionLimits`; closing it gives the slot back."""

    _release: weakref.finalize[[str], CountedSocket] | None = None

    def close(self) -> None:
        """Close the socket and give back its slot (once, however often it is called)."""
        if self._release is not None:
            self._release()
        super().close()


class LimitedListener(socket.socket):
    """A listening TCP socket whose ``accept()`` applies a :class:`ConnectionLimits`.

    Use :meth:`wrap` on a bound, listening, non-blocking socket and hand the result to
    ``loop.create_server(sock=...)``: the event loop calls :meth:`accept`, which drops
    over-limit connections itself and returns only admitted ones, as :class:`CountedSocket`.
    """

    _limits: ConnectionLimits
    _max_lifetime_s: float | None

    @classmethod
    def wrap(cls, sock: socket.socket, limits: ConnectionLimits,
             max_lifetime_s: float | None = None) -> LimitedListener:
        """Take over ``sock`` (it is detached: use only the returned socket from now on).

        ``max_lifetime_s``: each admitted connection is shut down this many seconds after it
        was accepted, whatever it is doing (for a listener whose requests are short, such as
        enrollment: a client that sends a request slowly, or never finishes it, cannot keep
        its slot); None: no limit.
        """
        listener = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener._limits = limits
        listener._max_lifetime_s = max_lifetime_s
        listener.setblocking(False)
        return listener

    def accept(self) -> tuple[socket.socket, object]:
        """The next admitted connection, non-blocking.

        Raises:
            BlockingIOError: no admitted connection is pending (over-limit ones were dropped;
                after a batch of them the loop gets to run before more are taken).
            OSError: as ``socket.accept`` (e.g. EMFILE; the event loop retries later).
        """
        for _ in range(_REFUSALS_PER_ACCEPT):
            plain, addr = super().accept()
            address = str(addr[0]) if isinstance(addr, tuple) and addr else "?"
            if self._limits.try_open(address):
                conn = CountedSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
                conn._release = weakref.finalize(conn, self._limits.closed, address)
                if self._max_lifetime_s is not None:  # accept() runs on the event loop
                    asyncio.get_running_loop().call_later(self._max_lifetime_s, _cut, weakref.ref(conn))
                return conn, addr
            _reset(plain)
        raise BlockingIOError("over-limit connections dropped; more may be pending")


def _cut(ref: weakref.ref[CountedSocket]) -> None:
    """Shut down a connection that outlived its listener's ``max_lifetime_s`` (its transport then closes it)."""
    conn = ref()
    if conn is not None and conn.fileno() != -1:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)


def _reset(conn: socket.socket) -> None:
    """Close an accepted connection with a reset (no FIN handshake, no TIME_WAIT on our side)."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
