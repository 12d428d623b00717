"""The peer port against idle strangers: handshake deadline and connection limits, over real TLS on loopback.

Strangers are plain TCP connections that never start a handshake, from 127.0.0.2 and
127.0.0.3 (all of 127/8 is the loopback on Linux); the member is a real PeerClient with a
cluster certificate, from 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpulayerd.api.peer import PeerClient, make_peer_app, start_peer_site
from gpulayerd.net import ca, identity, tls
from gpulayerd.net.identity import Identity
from gpulayerd.net.limits import ConnectionLimits, fitted_total
from gpulayerd.net.transport import RELEASE, Sender
from gpulayerd.net.wire import Ack, Release, new_msg_id
from tests.fakes.routers import router_of

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_limits_count_per_address_and_total_and_give_slots_back() -> None:
    limits = ConnectionLimits(total=3, per_address=2, clock=_Clock())
    assert [limits.try_open("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert limits.try_open("10.0.0.2") is True
    assert limits.try_open("10.0.0.3") is False  # total
    s = limits.stats()
    assert (s.open_total, s.addresses, s.refused_total, s.refused_per_address) == (3, 2, 2, 1)
    limits.closed("10.0.0.1")
    limits.closed("10.0.0.9")  # never opened: ignored
    assert limits.open_for("10.0.0.1") == 1 and limits.try_open("10.0.0.3") is True
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        limits.closed(address)
    assert limits.stats().open_total == 0 and limits.stats().addresses == 0


def test_refusals_are_logged_once_per_address_per_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    limits = ConnectionLimits(total=10, per_address=1, clock=clock)
    assert limits.try_open("10.0.0.1") and limits.try_open("10.0.0.2")
    with caplog.at_level(logging.WARNING, logger="gpulayerd.net.limits"):
        for _ in range(5):
            assert not limits.try_open("10.0.0.1")
        assert not limits.try_open("10.0.0.2")
        clock.now += 59.0
        assert not limits.try_open("10.0.0.1")
        clock.now += 1.0
        assert not limits.try_open("10.0.0.1")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "10.0.0.1" in messages[0] and "10.0.0.2" in messages[1]
    assert "and 5 more" in messages[2]
    assert limits.stats().refused_total == 8


def test_total_stays_at_most_half_the_open_files_limit() -> None:
    assert fitted_total(512, 1024) == 512
    assert fitted_total(512, 256) == 128
    assert fitted_total(512, 1) == 1


@pytest.fixture
def node(tmp_path: Path) -> Identity:
    ca.cluster_init(tmp_path / "a", "lab")
    return identity.load_or_create_identity(tmp_path / "a")


async def _ping(sender: Sender, msg: Release) -> Ack:
    return Ack(ok=True)


@contextlib.asynccontextmanager
async def _serving(node: Identity, limits: ConnectionLimits, handshake_timeout_s: float,
                   max_connection_s: float | None = None) -> AsyncIterator[int]:
    app = make_peer_app(router_of({"member.release": _ping}))
    runner, port = await start_peer_site(app, "127.0.0.1", 0, tls.server_ssl_context(node),
                                         handshake_timeout_s=handshake_timeout_s, limits=limits,
                                         max_connection_s=max_connection_s)
    try:
        yield port
    finally:
        await runner.cleanup()


async def _idle(port: int, source: str, n: int, opened: list[Conn]) -> list[Conn]:
    """``n`` plain TCP connections from ``source`` that never send a byte."""
    new = [await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)) for _ in range(n)]
    opened.extend(new)
    return new


async def _refused(port: int, source: str, opened: list[Conn]) -> bool:
    """Whether a new connection from ``source`` is closed by the server at once (or reset while connecting)."""
    try:
        (conn,) = await _idle(port, source, 1, opened)
    except ConnectionResetError:
        return True
    return await _closed_by_server(conn, within_s=5.0)


async def _closed_by_server(conn: Conn, within_s: float) -> bool:
    """Whether the server closes ``conn`` (EOF or reset) within ``within_s`` seconds."""
    try:
        return await asyncio.wait_for(conn[0].read(1), within_s) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _until(cond: Callable[[], bool], within_s: float) -> bool:
    deadline = asyncio.get_running_loop().time() + within_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _ask(node: Identity, port: int) -> Ack:
    client = PeerClient(tls.client_ssl_context(node), timeout_s=5.0)
    try:
        ping = Release(msg_id=new_msg_id(), owner=node.node_id, hold_id="ping")
        return (await client.call_at("127.0.0.1", port, RELEASE, ping, expect_node=node.node_id))[0]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_connections_over_the_limits_are_closed_at_once_and_members_still_get_answers(node: Identity
                                                                                          ) -> None:
    clock = _Clock()
    limits = ConnectionLimits(total=7, per_address=4, clock=clock, per_subnet=7)  # (all of 127/8: one /24 here)
    opened: list[Conn] = []
    try:
        async with _serving(node, limits, handshake_timeout_s=30.0) as port:
            await _idle(port, "127.0.0.2", 4, opened)
            # Accepted in order: the fifth from the same address is over its limit and reset.
            assert await _refused(port, "127.0.0.2", opened)
            assert limits.open_for("127.0.0.2") == 4
            assert limits.stats().refused_per_address == 1
            # The four idle ones stay (the handshake deadline is far), and a member is answered beside them.
            assert (await _ask(node, port)).ok
            assert not await _closed_by_server(opened[0], within_s=0.05)
            # Another address fills the total. Every stranger's connection is young (a handshake may be
            # in progress), yet a member, whose address holds none, takes the slot of the oldest
            # connection of the address holding the most (127.0.0.2, four), and keeps it once its
            # handshake is done.
            await _idle(port, "127.0.0.3", 3, opened)
            assert limits.stats().open_total == 7
            assert (await _ask(node, port)).ok
            assert limits.stats().evicted == 1 and limits.open_for("127.0.0.3") == 3
            assert await _until(lambda: limits.open_for("127.0.0.2") == 3, within_s=5.0), limits.stats()
            assert await _closed_by_server(opened[0], within_s=5.0)  # the oldest of 127.0.0.2's
            # A stranger holding as many as every other address is refused while all are young ...
            await _idle(port, "127.0.0.2", 1, opened)  # (the member's slot was given back: 7 again)
            assert limits.stats().open_total == 7
            assert await _refused(port, "127.0.0.3", opened) is False  # 127.0.0.2 holds 4 > 3: room made
            assert limits.stats().evicted == 2
            assert await _refused(port, "127.0.0.4", opened) is False  # holds none: room made too
            # ... but takes the oldest slot once they are older.
            clock.now += 1.0
            assert (await _ask(node, port)).ok
            # Closing the idle ones gives their slots back.
            for _, writer in opened:
                writer.close()
            assert await _until(lambda: limits.stats().open_total == 0, within_s=5.0), limits.stats()
            assert (await _ask(node, port)).ok
    finally:
        for _, writer in opened:
            writer.close()


@pytest.mark.asyncio
async def test_a_connection_that_never_handshakes_is_closed_after_the_handshake_timeout(node: Identity) -> None:
    limits = ConnectionLimits(total=16, per_address=16, clock=_Clock())
    opened: list[Conn] = []
    try:
        async with _serving(node, limits, handshake_timeout_s=0.5) as port:
            (idle,) = await _idle(port, "127.0.0.2", 1, opened)
            start = asyncio.get_running_loop().time()
            assert await _closed_by_server(idle, within_s=5.0)
            assert asyncio.get_running_loop().time() - start >= 0.4  # not at once: at the deadline
            assert await _until(lambda: limits.stats().open_total == 0, within_s=5.0), limits.stats()
            assert (await _ask(node, port)).ok  # a member that handshakes at once is served
    finally:
        for _, writer in opened:
            writer.close()


@pytest.mark.asyncio
async def test_no_connection_outlives_the_listeners_max_lifetime(node: Identity) -> None:
    """The enrollment listener's guard: a client that never finishes (here: never even handshakes,
    with a handshake timeout far away) loses its slot after ``max_connection_s``."""
    limits = ConnectionLimits(total=16, per_address=16, clock=_Clock())
    opened: list[Conn] = []
    try:
        async with _serving(node, limits, handshake_timeout_s=30.0, max_connection_s=0.5) as port:
            (idle,) = await _idle(port, "127.0.0.2", 1, opened)
            start = asyncio.get_running_loop().time()
            assert await _closed_by_server(idle, within_s=5.0)
            assert 0.4 <= asyncio.get_running_loop().time() - start < 5.0
            assert await _until(lambda: limits.stats().open_total == 0, within_s=5.0), limits.stats()
    finally:
        for _, writer in opened:
            writer.close()


# ---------------------------------------------------------------- strangers against members (issue 24)


def test_strangers_fill_only_their_budget_and_members_take_the_slot_of_the_oldest_stranger() -> None:
    clock = _Clock()
    limits = ConnectionLimits(total=10, per_address=3, clock=clock, unauthenticated=6, min_age_s=0.5)
    evicted: list[str] = []

    def stranger(address: str, n: int) -> None:
        tag = f"{address}#{n}"
        assert limits.admit(address, lambda: evicted.append(tag)) is not None, limits.stats()

    for i in range(3):
        stranger("10.0.1.1", i)
    for i in range(3):
        stranger("10.0.2.1", i)
        clock.now += 0.01
    # The budget for connections without a finished handshake is taken, all young: an address holding
    # as many as the others is refused; one holding fewer takes the slot of the oldest of the most.
    assert limits.admit("10.0.2.1", lambda: None) is None  # per address (3)
    limits.release(limits._slots[next(iter(limits._slots))])  # (10.0.1.1#0 closes by itself: 5 open)
    assert limits.admit("10.0.3.1", lambda: None) is not None  # a slot was free
    assert limits.admit("10.0.3.1", lambda: evicted.append("3.1")) is not None and evicted == ["10.0.2.1#0"]
    assert limits.admit("10.0.3.1", lambda: None) is None  # holds 2, as many as any: nothing young is taken
    assert limits.stats().unauthenticated == 6
    evicted.clear()
    # A member's connection that completed mutual TLS no longer counts against strangers' budget ...
    clock.now += 1.0
    member = limits.admit("10.0.9.9", lambda: evicted.append("member"))
    assert member is not None and evicted == ["10.0.1.1#1"], evicted  # all hold 2, all old: the oldest
    limits.authenticated(member)
    assert limits.stats().unauthenticated == 6 - 1
    # ... and is never closed to make room, however many strangers come later.
    for n in range(40):
        clock.now += 1.0
        limits.admit(f"10.0.{4 + n % 3}.{n}", lambda: None)
    assert "member" not in evicted and not member.released
    assert limits.stats().open_total <= 10 and limits.stats().unauthenticated <= 6
    limits.release(member)
    limits.release(member)  # once, however often
    assert limits.open_for("10.0.9.9") == 0


def test_one_subnet_holds_at_most_its_share_of_the_strangers_budget() -> None:
    clock = _Clock()
    limits = ConnectionLimits(total=64, per_address=2, clock=clock, unauthenticated=16, per_subnet=4)
    admitted = [limits.admit(f"192.168.7.{i}", lambda: None) for i in range(10)]
    # Each newcomer holds none, so it takes a young slot within its /24: the /24 never holds more than 4.
    assert all(s is not None for s in admitted) and limits.stats().unauthenticated == 4
    assert limits.stats().evicted == 6 and [s.released for s in admitted] == [True] * 6 + [False] * 4
    assert limits.admit("192.168.7.9", lambda: None) is None  # holds 1, as many as any there, all young
    clock.now += 1.0
    assert limits.admit("192.168.7.9", lambda: None) is not None  # old enough: the oldest of its /24 goes
    assert limits.admit("192.168.8.1", lambda: None) is not None  # another /24 is untouched by the first's
    assert limits.stats().unauthenticated == 5 and limits.stats().evicted == 7


def test_a_members_reconnect_in_a_flooded_subnet_is_taken_last() -> None:
    """A member's address (it completed mutual TLS before) reconnecting while strangers of its own /24
    churn through the budget: its handshake, slowed past min_age_s, is not the one evicted."""
    clock = _Clock()
    limits = ConnectionLimits(total=64, per_address=8, clock=clock, unauthenticated=8, per_subnet=8)
    first = limits.admit("10.5.0.3", lambda: None)
    assert first is not None
    limits.authenticated(first)
    limits.release(first)  # its connection dropped (a timed-out call)
    evicted: list[str] = []
    for i in range(7):
        assert limits.admit(f"10.5.0.{100 + i}", lambda i=i: evicted.append(f"s{i}")) is not None
    again = limits.admit("10.5.0.3", lambda: evicted.append("member"))
    assert again is not None and evicted == []  # the eighth slot
    for n in range(50):  # each stranger newcomer, once slots are old enough, evicts the oldest stranger
        clock.now += 1.0
        limits.admit(f"10.5.0.{150 + n % 40}", lambda n=n: evicted.append(f"t{n}"))
    assert "member" not in evicted and not again.released and len(evicted) == 50
    # Only a few handshakes from a member's address are favoured: a fifth one there is an ordinary stranger's.
    extra = [limits.admit("10.5.0.3", lambda k=k: evicted.append(f"m{k}")) for k in range(4)]
    assert all(e is not None for e in extra)
    clock.now += 1.0
    assert limits.admit("10.5.0.250", lambda: None) is not None and evicted[-1].startswith("m"), evicted[-3:]
    # An address not seen authenticated for MEMBER_MEMORY_S is a stranger's again.
    from gpulayerd.net.limits import MEMBER_MEMORY_S
    clock.now += MEMBER_MEMORY_S + 1
    assert not limits._is_member("10.5.0.3", 1, clock.now)


def test_ipv4_clients_of_a_dual_stack_listener_count_in_their_own_24() -> None:
    from gpulayerd.net.limits import subnet_of

    assert subnet_of("::ffff:127.0.1.1") == subnet_of("127.0.1.1") == "127.0.1.0/24"
    assert subnet_of("::ffff:10.0.0.9") != subnet_of("::ffff:127.0.0.9")
    assert subnet_of("2001:db8::1") == "2001:db8::/64" and subnet_of("not-an-ip") == "not-an-ip"


@pytest.fixture
def two_members(tmp_path: Path) -> tuple[Identity, Identity]:
    """Two nodes of one cluster (real certificates): a, the signer, and b."""
    token = ca.cluster_init(tmp_path / "a", "lab", uses=2, addresses=["127.0.0.1:1"])
    b = ca.cluster_join(tmp_path / "b", token, signer=tmp_path / "a")
    return identity.load_or_create_identity(tmp_path / "a"), b


@pytest.mark.asyncio
async def test_a_revoked_node_cannot_hold_the_peer_ports_slots(two_members: tuple[Identity, Identity]) -> None:
    """A revoked node's certificate still verifies against the CA: its connections used to finish the
    handshake, be marked authenticated (never evicted) and, sending no request, never meet the
    revocation check; eight of them filled the total and a member was refused (issue 24 review).
    Now they stay strangers': within the strangers' budget, evicted for a member."""
    a, b = two_members
    revoked = {b.node_id}
    limits = ConnectionLimits(total=8, per_address=8, clock=_Clock(), unauthenticated=4)
    runner, port = await start_peer_site(make_peer_app(router_of({"member.release": _pong}), revoked.__contains__),
                                         "127.0.0.1", 0, tls.server_ssl_context(a), handshake_timeout_s=1.0,
                                         limits=limits, is_revoked=revoked.__contains__)
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(8):
            with contextlib.suppress(OSError):  # (over the strangers' budget: reset)
                _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls.client_ssl_context(b),
                                                          local_addr=("127.0.0.3", 0), server_hostname="x")
                held.append(writer)
        stats = limits.stats()
        assert 0 < stats.open_total == stats.unauthenticated <= 4, stats  # none counted as a member's
        assert (await _ask(a, port)).ok  # a member is answered (it takes the slot of one of them)
    finally:
        for w in held:
            w.close()
        await runner.cleanup()


async def _pong(sender: Sender, msg: Release) -> Ack:
    return Ack(ok=True)
