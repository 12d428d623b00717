"""Limits on the peer port's open connections, applied as each connection is accepted.

A stranger needs no certificate to open TCP connections, and every open one costs a file
descriptor until its TLS handshake ends. So the listening socket itself counts them:
:class:`LimitedListener` is the socket the event loop accepts on, and it closes a
connection over a limit at once (a reset, before any TLS byte is read or any protocol
object exists); a connection it lets through is a :class:`CountedSocket` that gives its
slot back when it is closed (by the transport, or when collected).

Limits: open connections in total and per remote address (an IPv4 or IPv6 address as the
kernel reports it), and a budget for connections that have not completed mutual TLS, which a
newer connection may take from the address (then the /24) holding the most of them
(:class:`ConnectionLimits`): strangers cannot keep a member out. Refusals are counted and logged
once per address per minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import logging
import os
import socket
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ConnectionLimits", "CountedSocket", "LimitStats", "LimitedListener", "Slot", "accept_or_shed",
           "fitted_total", "keep_spare_descriptor", "quiet_accept_errors", "soft_file_limit", "subnet_of"]

log = logging.getLogger(__name__)

_REFUSALS_PER_ACCEPT = 64
"""How many over-limit connections one ``accept()`` call drops before letting the loop run."""

_LOG_EVERY_S = 60.0
_LOG_MEMORY = 4096
"""At most this many addresses remembered for the log-once rule (older ones are forgotten)."""

MEMBER_MEMORY_S = 600.0
"""Seconds an address that completed mutual TLS counts as a member's (:class:`ConnectionLimits`)."""
MEMBER_HANDSHAKES = 4
"""Handshakes in progress from a member's address that are taken for a stranger's connection last."""
_MEMBER_ADDRESSES = 4096


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
        unauthenticated: connections open now that have not completed mutual TLS.
        evicted: connections closed since start to make room for a newer one.
    """

    open_total: int
    addresses: int
    refused_total: int
    refused_per_address: int
    unauthenticated: int = 0
    evicted: int = 0


def subnet_of(address: str) -> str:
    """The /24 of an IPv4 address (the /64 of an IPv6 one): the unit a flood from many addresses
    of one network is counted in; an IPv4 client of a dual-stack listener (``::ffff:a.b.c.d``) counts
    in its IPv4 /24. An unparsable address is its own subnet."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


@dataclass(eq=False, slots=True)
class Slot:
    """One admitted connection: where from, since when, whether it completed mutual TLS, and how to
    close it to make room (``evict``; None: never evicted)."""

    address: str
    subnet: str
    opened_at: float
    evict: Callable[[], None] | None
    authenticated: bool = False
    released: bool = False


class ConnectionLimits:
    """Counts open connections per remote address and in total; says whether one more may open, and
    which one makes room when strangers have taken every unauthenticated slot.

    Strangers can open connections without a certificate: at most ``unauthenticated`` of the
    ``total`` slots are for connections that have not completed mutual TLS (none from one /24 beyond
    half of them). When those are taken, a new connection takes the slot of the oldest
    unauthenticated connection of the address (then the /24) that holds the most: one older than
    ``min_age_s``, or a younger one (its handshake may be in progress) when its address holds more
    strangers' connections than the newcomer's; else it is refused. So a flood from a few addresses,
    however fast it reopens, cannot keep out an address that holds fewer, and a member's handshake
    takes milliseconds. A connection that completed mutual TLS (:meth:`authenticated`) is never
    evicted. An address that completed mutual TLS in the last :data:`MEMBER_MEMORY_S` seconds is
    a member's: up to :data:`MEMBER_HANDSHAKES` of its connections still in their handshake are
    taken last, so a member reconnecting through a flood from its own /24 is not cut off by a
    handshake slowed by load (a stranger on a member's machine gains those few slots at most).

    Not thread-safe: used from the event loop only (the listener accepts there).
    """

    def __init__(self, total: int, per_address: int, clock: Callable[[], float], *,
                 unauthenticated: int | None = None, per_subnet: int | None = None, min_age_s: float = 0.5) -> None:
        """Args: ``total`` and ``per_address`` at least 1; ``clock`` gives monotonic seconds;
        ``per_subnet``: unauthenticated connections from one /24 (default: half of ``unauthenticated``,
        at least ``per_address``).

        Raises:
            ValueError: a limit below 1.
        """
        if total < 1 or per_address < 1 or (unauthenticated is not None and unauthenticated < 1):
            raise ValueError(f"connection limits must be at least 1 (total={total}, per_address={per_address}, "
                             f"unauthenticated={unauthenticated})")
        self.total = total
        self.per_address = per_address
        self.unauthenticated = min(total, unauthenticated if unauthenticated is not None else total)
        self.per_subnet = per_subnet if per_subnet is not None else max(per_address, self.unauthenticated // 2)
        self.min_age_s = min_age_s
        self._clock = clock
        self._open: dict[str, int] = {}
        self._open_total = 0
        self._refused_total = 0
        self._refused_per_address = 0
        self._evicted = 0
        self._slots: dict[int, Slot] = {}  # id -> unauthenticated slots that can be evicted
        self._unauth: dict[str, int] = {}  # address -> unauthenticated connections open
        self._unauth_subnet: dict[str, int] = {}
        self._unauth_total = 0
        self._logged: dict[str, tuple[float, int]] = {}  # address -> (last log time, refusals since)
        self._members: dict[str, float] = {}  # address -> when a connection from it last completed mutual TLS

    @classmethod
    def fitted(cls, total: int, per_address: int, clock: Callable[[], float], *,
               unauthenticated: int | None = None) -> ConnectionLimits:
        """Limits with ``total`` lowered by :func:`fitted_total` to this process's soft open-files limit.

        Call it after the daemon raised its soft limit; a lowered total is logged.
        """
        soft = soft_file_limit()
        fitted = fitted_total(total, soft)
        if fitted < total:
            log.warning("peer port: at most %d open connections (not %d): the open files limit is %d; "
                        "raise it (LimitNOFILE in the service file) to allow more", fitted, total, soft)
        return cls(fitted, per_address, clock,
                   unauthenticated=None if unauthenticated is None else min(unauthenticated, fitted))

    def try_open(self, address: str) -> bool:
        """Take a slot for a new connection from ``address`` that is never evicted (nor counted as
        unauthenticated); False (counted, logged) when over a limit."""
        return self.admit(address, None, unauthenticated=False) is not None

    def admit(self, address: str, evict: Callable[[], None] | None, *,
              unauthenticated: bool = True) -> Slot | None:
        """Take a slot for a new connection from ``address`` (making room as the class docstring
        says); None (counted, logged) when it must be refused. ``evict`` closes this connection
        should a newer one need its slot before it is :meth:`authenticated`."""
        held = self._open.get(address, 0)
        if held >= self.per_address:
            self._refuse(address, f"{self.per_address} open connections from this address")
            self._refused_per_address += 1
            return None
        subnet = subnet_of(address)
        if unauthenticated:
            full = (self._open_total >= self.total or self._unauth_total >= self.unauthenticated
                    or self._unauth_subnet.get(subnet, 0) >= self.per_subnet)
            if full and not self._make_room(address, subnet if self._unauth_subnet.get(subnet, 0) >= self.per_subnet
                                            else None):
                self._refuse(address, f"{self.unauthenticated} connections without a completed TLS handshake "
                             f"({self._unauth_subnet.get(subnet, 0)} from {subnet}), none old enough to close")
                return None
        elif self._open_total >= self.total:
            self._refuse(address, f"{self.total} open connections in total")
            return None
        slot = Slot(address, subnet, self._clock(), evict if unauthenticated else None,
                    authenticated=not unauthenticated)
        self._open[address] = held + 1
        self._open_total += 1
        if unauthenticated:
            self._unauth_take(slot, +1)
            self._slots[id(slot)] = slot
        return slot

    def authenticated(self, slot: Slot) -> None:
        """``slot``'s connection completed mutual TLS: it is never evicted, nor counted as a stranger's."""
        if slot.released or slot.authenticated:
            return
        slot.authenticated = True
        self._slots.pop(id(slot), None)
        self._unauth_take(slot, -1)
        self._members.pop(slot.address, None)
        self._members[slot.address] = self._clock()
        if len(self._members) > _MEMBER_ADDRESSES:
            del self._members[next(iter(self._members))]  # the longest unseen

    def release(self, slot: Slot) -> None:
        """Give back ``slot`` (its connection closed); once, however often it is called."""
        if slot.released:
            return
        slot.released = True
        if not slot.authenticated:
            self._slots.pop(id(slot), None)
            self._unauth_take(slot, -1)
        self.closed(slot.address)

    def closed(self, address: str) -> None:
        """Give back the slot of a connection from ``address`` taken by :meth:`try_open`."""
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
        return LimitStats(self._open_total, len(self._open), self._refused_total, self._refused_per_address,
                          self._unauth_total, self._evicted)

    def _unauth_take(self, slot: Slot, n: int) -> None:
        for table, key in ((self._unauth, slot.address), (self._unauth_subnet, slot.subnet)):
            left = table.get(key, 0) + n
            if left > 0:
                table[key] = left
            else:
                table.pop(key, None)
        self._unauth_total += n

    def _make_room(self, newcomer: str, subnet: str | None) -> bool:
        """Evict one unauthenticated connection (within ``subnet`` when given) for a new one from
        ``newcomer``: of the address (then /24) holding the most, the oldest. A connection younger
        than ``min_age_s`` (a handshake may be in progress) is taken only from an address holding
        more strangers' connections than ``newcomer`` does: a flood from a few addresses cannot keep
        out an address that holds none, however fast it reopens. False if there is none to take."""
        now = self._clock()
        held = self._unauth.get(newcomer, 0)
        victim: Slot | None = None
        best: tuple[bool, int, int, float] | None = None
        for slot in self._slots.values():
            if slot.evict is None or (subnet and slot.subnet != subnet):
                continue
            count = self._unauth.get(slot.address, 0)
            if now - slot.opened_at < self.min_age_s and count <= held:
                continue
            key = (not self._is_member(slot.address, count, now), count, self._unauth_subnet.get(slot.subnet, 0),
                   -slot.opened_at)
            if best is None or key > best:
                victim, best = slot, key
        if victim is None or victim.evict is None:
            return False
        evict = victim.evict
        self.release(victim)  # its slot is free now; its socket closes when the loop gets to it
        self._evicted += 1
        with contextlib.suppress(OSError):
            evict()
        return True

    def _is_member(self, address: str, unauthenticated: int, now: float) -> bool:
        """Whether ``address`` is a recent member's holding few enough handshakes to be taken last."""
        seen = self._members.get(address)
        return seen is not None and now - seen <= MEMBER_MEMORY_S and unauthenticated <= MEMBER_HANDSHAKES

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

    _release: weakref.finalize[Any, CountedSocket] | None = None
    slot: Slot | None = None

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
    _by_fd: dict[int, weakref.ref[CountedSocket]]

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
        listener._by_fd = {}
        listener.setblocking(False)
        _Shedding.keep_spare()  # now, while descriptors are plenty (see accept_or_shed)
        return listener

    def accept(self) -> tuple[socket.socket, object]:
        """The next admitted connection, non-blocking.

        Raises:
            BlockingIOError: no admitted connection is pending (over-limit ones were dropped;
                after a batch of them the loop gets to run before more are taken).
            OSError: as ``socket.accept`` (out of descriptors: pending connections are closed
                unanswered instead, :func:`accept_or_shed`).
        """
        for _ in range(_REFUSALS_PER_ACCEPT):
            plain, addr = accept_or_shed(self, super().accept, "peer port")
            address = str(addr[0]) if isinstance(addr, tuple) and addr else "?"
            holder: list[CountedSocket] = []
            slot = self._limits.admit(address, functools.partial(_shut, holder))
            if slot is not None:
                conn = CountedSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
                holder.append(conn)
                conn.slot = slot
                conn._release = weakref.finalize(conn, self._limits.release, slot)
                self._by_fd[conn.fileno()] = weakref.ref(conn)
                if self._max_lifetime_s is not None:  # accept() runs on the event loop
                    asyncio.get_running_loop().call_later(self._max_lifetime_s, _cut, weakref.ref(conn))
                return conn, addr
            _reset(plain)
        raise BlockingIOError("over-limit connections dropped; more may be pending")

    def authenticated(self, fd: int) -> None:
        """The connection on descriptor ``fd`` completed mutual TLS: it keeps its slot (never evicted)."""
        ref = self._by_fd.pop(fd, None)
        conn = ref() if ref is not None else None
        if conn is not None and conn.slot is not None:
            self._limits.authenticated(conn.slot)
        if len(self._by_fd) > 4 * max(1, self._limits.total):  # forget closed ones now and then
            self._by_fd = {k: v for k, v in self._by_fd.items() if v() is not None}


def _shut(holder: list[CountedSocket]) -> None:
    """Shut down an evicted connection (its transport then closes it and gives back the descriptor)."""
    for conn in holder:
        if conn.fileno() != -1:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


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


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log asyncio's "accept() out of system resource" (too many open files) once a minute, with a
    count, instead of a traceback each time (asyncio pauses the listener for a second meanwhile)."""
    if getattr(loop, "_gpulayer_quiet_accept", False):
        return
    previous = loop.get_exception_handler()
    seen = {"last": 0.0, "count": 0}

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == "socket.accept() out of system resource":
            seen["count"] += 1
            now = time.monotonic()
            if now - seen["last"] >= _LOG_EVERY_S:
                log.error("cannot accept connections: %s (%d times in the last minute; retrying every second)",
                          context.get("exception"), seen["count"])
                seen["last"], seen["count"] = now, 0
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
    loop._gpulayer_quiet_accept = True  # type: ignore[attr-defined]


# ------------------------------------------------------------------ out of descriptors at accept

_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)


class _Shedding:
    """A spare descriptor kept open so that, out of descriptors, a listener can still accept a
    pending connection and close it at once (the backlog drains; the loop does not spin on a
    readable listener), and the once-a-minute log of how many were shed. Event-loop use only."""

    spare: int | None = None
    shed = 0
    last_log = float("-inf")

    @classmethod
    def keep_spare(cls) -> None:
        if cls.spare is None:
            with contextlib.suppress(OSError):
                cls.spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    @classmethod
    def note(cls, what: str, exc: OSError, n: int) -> None:
        cls.shed += n
        now = time.monotonic()
        if now - cls.last_log >= _LOG_EVERY_S:
            log.error("%s: cannot accept connections: %s; %d pending connections closed unanswered in the last "
                      "minute (next message in a minute at the earliest; raise the open files limit, "
                      "LimitNOFILE, if this is not a flood)", what, exc.strerror or exc, cls.shed)
            cls.last_log, cls.shed = now, 0


def keep_spare_descriptor() -> None:
    """Open the spare descriptor :func:`accept_or_shed` needs (call it when a listener starts)."""
    _Shedding.keep_spare()


def accept_or_shed(listener: socket.socket, accept: Callable[[], tuple[socket.socket, Any]],
                   what: str) -> tuple[socket.socket, Any]:
    """``accept()``, or, when the process is out of descriptors (EMFILE, ENFILE), close pending
    connections unanswered with the spare descriptor's help and raise :class:`BlockingIOError` (the
    event loop then waits for the next readable event: no traceback, no busy loop).

    Args:
        listener: the listening socket (for its type: TCP connections are reset, not closed).
        accept: the plain ``socket.accept`` of ``listener``.
        what: the listener, for the log (``peer port``, ``local socket``).

    Raises:
        BlockingIOError: nothing pending, or pending connections were shed.
        OSError: other accept errors; EMFILE when no spare descriptor could be kept either (the
            event loop then pauses the listener for a second).
    """
    _Shedding.keep_spare()
    try:
        return accept()
    except OSError as e:
        if e.errno not in _OUT_OF_FILES or _Shedding.spare is None:
            raise
        out_of_files = e
    shed = 0
    os.close(_Shedding.spare)
    _Shedding.spare = None
    try:
        for _ in range(_REFUSALS_PER_ACCEPT):
            try:
                conn, _addr = accept()
            except OSError:
                break
            if listener.family in (socket.AF_INET, socket.AF_INET6):
                _reset(conn)
            else:
                conn.close()
            shed += 1
    finally:
        _Shedding.keep_spare()
        _Shedding.note(what, out_of_files, shed)
    raise BlockingIOError(f"out of descriptors: {shed} pending connections closed")
