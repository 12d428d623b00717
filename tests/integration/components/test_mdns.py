"""mDNS discovery (gpulayerd.net.mdns) and the choice of LAN addresses (gpulayerd.net.interfaces).

The TXT codec and the interface filter are pure and tested with tables. Discovery runs
real zeroconf, two :class:`MdnsService` instances in this process, both bound to
127.0.0.1 only, with short timings passed in. Nothing else is needed for multicast
there: Linux loops multicast sent with ``IP_MULTICAST_IF=127.0.0.1`` back to the
sockets that joined 224.0.0.251 on 127.0.0.1 (zeroconf sets ``IP_MULTICAST_LOOP`` and
binds port 5353 with ``SO_REUSEADDR``/``SO_REUSEPORT``, so two instances share it),
even though ``lo`` has no MULTICAST flag, and no packet leaves the machine. Each
discovery test runs the loop in debug mode and fails on a callback that blocked it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import NamedTuple

import pytest
import pytest_asyncio

from gpulayerd.net.announcement import TXT_ITEM_MAX_BYTES, TXT_TOTAL_MAX_BYTES, Announcement, decode_txt, encode_txt
from gpulayerd.net.interfaces import interface_for_address, lan_addresses
from gpulayerd.net.mdns import MdnsService, MdnsUnavailable

NODE_A = "A" * 52
NODE_B = "MFRGGZDFMZTWQ2LKNNWG23TPOBYXE43UOV3HO6DZPIYTEMZUGU3D"  # base32, 52 characters
FAST = {"query_interval_s": 0.5, "request_timeout_s": 2.0}
WAIT_S = 5.0


def _private_service_type() -> str:
    """A service type no other process browses: daemons running on this host stay out of the test."""
    return f"_gl-{secrets.token_hex(4)}._tcp.local."


def _announcement(node_id: str = NODE_A, **changes: object) -> Announcement:
    base = Announcement(
        node_id=node_id,
        name="ws-01",
        addresses=("127.0.0.1",),
        port=7451,
        cluster="CLUSTERID7Q2LKNNWG23TPOBYXE43UOV3HO6DZPIYTEMZUGU3DXYZ",
        ep="1a2b3c4d5e6f7a8b",
        gpus=2,
        free=1,
    )
    return replace(base, **changes)


def _wire(props: Mapping[str, str]) -> dict[bytes, bytes | None]:
    """What zeroconf hands us for a TXT record built from ``props``."""
    return {k.encode(): v.encode() for k, v in props.items()}


def _wire_size(props: Mapping[str, str]) -> int:
    return sum(1 + len(f"{k}={v}".encode()) for k, v in props.items())


# ----------------------------------------------------------------------------- TXT


@pytest.mark.parametrize(
    "a",
    [
        _announcement(),
        _announcement(node_id=NODE_B, gpus=None, free=None, name=""),
        _announcement(gpus=0, free=0, cluster="", version=3),
        _announcement(name="wörkstation-ü", port=65535),
    ],
    ids=["full", "unknown-counts", "zeros", "utf8"],
)
def test_txt_round_trip(a: Announcement) -> None:
    props = encode_txt(a)
    assert list(props)[:4] == ["v", "id", "port", "cluster"]
    record = decode_txt(_wire(props))
    assert record == {
        "v": a.version,
        "id": a.node_id,
        "port": a.port,
        "cluster": a.cluster,
        "ep": a.ep,
        "gpus": a.gpus,
        "free": a.free,
        "name": a.name or None,
    }
    assert _wire_size(props) <= TXT_TOTAL_MAX_BYTES


def test_txt_leaves_unknown_values_out() -> None:
    props = encode_txt(_announcement(gpus=None, free=None, name=""))
    assert set(props) == {"v", "id", "port", "cluster", "ep"}


def test_txt_item_over_255_bytes_refused() -> None:
    with pytest.raises(ValueError, match=f"'cluster'.*limit is {TXT_ITEM_MAX_BYTES}"):
        encode_txt(_announcement(cluster="c" * 250))
    # multi-byte characters count in bytes, not characters
    with pytest.raises(ValueError, match="'name'"):
        encode_txt(_announcement(cluster="c", name="é" * 126))
    encode_txt(_announcement(cluster="c", name="é" * 125))


def test_txt_total_over_400_bytes_refused() -> None:
    ok = _announcement(cluster="c" * 150, name="n" * 110)
    assert _wire_size(encode_txt(ok)) <= TXT_TOTAL_MAX_BYTES
    with pytest.raises(ValueError, match=f"limit is {TXT_TOTAL_MAX_BYTES}"):
        encode_txt(_announcement(cluster="c" * 200, name="n" * 200))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"node_id": "a" * 64}, "DNS label"),  # SHA-256 in hex does not fit a label
        ({"node_id": "node.id"}, "DNS label"),
        ({"node_id": ""}, "DNS label"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"gpus": -1}, "negative"),
        ({"free": -2}, "negative"),
        ({"ep": ""}, "epoch"),
        ({"version": 0}, "version"),
    ],
)
def test_txt_encode_refuses_invalid_fields(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_txt(_announcement(**changes))


def test_txt_decode_ignores_unknown_keys_and_key_case() -> None:
    props = _wire(encode_txt(_announcement()))
    props[b"caps"] = b"sha256:abc"
    props[b"future-flag"] = None
    props[b"Cluster"] = props.pop(b"cluster") or b""
    record = decode_txt(props)
    assert record is not None
    assert record["cluster"] == _announcement().cluster


def test_txt_decode_accepts_a_newer_version() -> None:
    record = decode_txt(_wire({**encode_txt(_announcement()), "v": "7", "new": "x"}))
    assert record is not None and record["v"] == 7


@pytest.mark.parametrize(
    ("key", "value"),
    [("gpus", "many"), ("gpus", "-1"), ("free", ""), ("free", "1.5"), ("name", None)],
)
def test_txt_decode_unreadable_optional_value_is_unknown(key: str, value: str | None) -> None:
    props: dict[bytes, bytes | None] = _wire(encode_txt(_announcement()))
    props[key.encode()] = None if value is None else value.encode()
    record = decode_txt(props)
    assert record is not None
    assert record[key] is None


@pytest.mark.parametrize("missing", ["v", "id", "port", "cluster", "ep"])
def test_txt_decode_missing_required_key_is_none(missing: str) -> None:
    props = _wire(encode_txt(_announcement()))
    del props[missing.encode()]
    assert decode_txt(props) is None


@pytest.mark.parametrize(
    "props",
    [
        {},
        {b"\xff\xfe": b"\x00"},
        {b"v": b"1", b"id": b"\xff" * 52, b"port": b"1", b"cluster": b"c", b"ep": b"e"},
        {b"v": b"one", b"id": NODE_A.encode(), b"port": b"1", b"cluster": b"c", b"ep": b"e"},
        {b"v": b"0", b"id": NODE_A.encode(), b"port": b"1", b"cluster": b"c", b"ep": b"e"},
        {b"v": b"1", b"id": NODE_A.encode(), b"port": b"99999", b"cluster": b"c", b"ep": b"e"},
        {b"v": b"1", b"id": b"not a label", b"port": b"1", b"cluster": b"c", b"ep": b"e"},
        {b"v": b"1", b"id": NODE_A.encode(), b"port": b"1", b"cluster": b"c", b"ep": b""},
        {b"v": None, b"id": None, b"port": None, b"cluster": None, b"ep": None},
        {"v": "1", "id": NODE_A, "port": "1", "cluster": "c", "ep": "e"},  # str, not bytes
    ],
    ids=[
        "empty",
        "binary",
        "id-not-utf8",
        "v-word",
        "v-zero",
        "port-range",
        "id-not-label",
        "ep-empty",
        "no-values",
        "str-keys",
    ],
)
def test_txt_decode_garbage_is_none(props: Mapping[bytes, bytes | None]) -> None:
    assert decode_txt(props) is None


# ----------------------------------------------------------------------- interfaces


class _Addr(NamedTuple):
    family: int
    address: str


class _Stats(NamedTuple):
    isup: bool


def _v4(ip: str) -> _Addr:
    return _Addr(socket.AF_INET, ip)


def _v6(ip: str) -> _Addr:
    return _Addr(socket.AF_INET6, ip)


MAC = _Addr(getattr(socket, "AF_PACKET", 17), "02:42:ac:11:00:02")
ADDRS: dict[str, list[_Addr]] = {
    "lo": [_v4("127.0.0.1"), _v6("::1")],
    "eth0": [MAC, _v4("192.168.1.10"), _v4("192.168.1.9"), _v4("169.254.3.4"), _v6("fe80::1%eth0")],
    "enp5s0": [_v4("10.0.0.10"), _v4("10.0.0.9")],
    "enp6s0": [_v4("10.1.0.5")],  # down
    "wlan0": [_v6("fd00::5")],  # no IPv4
    "docker0": [_v4("172.17.0.1")],
    "br-3f2a": [_v4("172.18.0.1")],
    "virbr0": [_v4("192.168.122.1")],
    "veth1a2b": [_v4("169.254.9.9")],
    "tailscale0": [_v4("100.64.0.7")],
    "ztabc123": [_v4("10.147.17.2")],
    "wg0": [_v4("10.8.0.2")],
    "cni0": [_v4("10.88.0.1")],
    "flannel.1": [_v4("10.244.0.0")],
    "cali12ab": [_v4("10.1.2.3")],
}
STATS: dict[str, _Stats] = {name: _Stats(isup=name != "enp6s0") for name in ADDRS if name != "docker0"}


def test_lan_addresses_skips_loopback_containers_vpns_and_down() -> None:
    got = lan_addresses(None, net_if_addrs=ADDRS, net_if_stats=STATS)
    assert got == [
        ("enp5s0", "10.0.0.9"),
        ("enp5s0", "10.0.0.10"),
        ("eth0", "192.168.1.9"),
        ("eth0", "192.168.1.10"),
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("docker0", [("docker0", "172.17.0.1")]),  # missing from stats: assumed up
        ("lo", [("lo", "127.0.0.1")]),
        ("tailscale0", [("tailscale0", "100.64.0.7")]),
        ("eth0", [("eth0", "169.254.3.4"), ("eth0", "192.168.1.9"), ("eth0", "192.168.1.10")]),
    ],
)
def test_lan_addresses_explicit_interface_is_used_whatever_its_kind(name: str, expected: list[tuple[str, str]]) -> None:
    assert lan_addresses(name, net_if_addrs=ADDRS, net_if_stats=STATS) == expected


def test_lan_addresses_unknown_interface_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match="'eth9'") as exc:
        lan_addresses("eth9", net_if_addrs=ADDRS, net_if_stats=STATS)
    assert "available: br-3f2a, cali12ab, cni0, docker0, enp5s0" in str(exc.value)


@pytest.mark.parametrize(("name", "message"), [("enp6s0", "is down"), ("wlan0", "no IPv4")])
def test_lan_addresses_explicit_interface_unusable(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lan_addresses(name, net_if_addrs=ADDRS, net_if_stats=STATS)


def test_lan_addresses_reads_psutil_by_default() -> None:
    got = lan_addresses()
    assert all(isinstance(name, str) and socket.inet_aton(ip) for name, ip in got)
    assert lan_addresses("lo") == [("lo", "127.0.0.1")]


@pytest.mark.parametrize(
    ("ip", "expected"),
    [
        ("192.168.1.10", "eth0"),
        ("172.17.0.1", "docker0"),
        ("fe80::1", "eth0"),
        ("fe80::1%eth0", "eth0"),
        ("fd00::5", "wlan0"),
        ("10.9.9.9", None),
        ("not-an-ip", None),
    ],
)
def test_interface_for_address(ip: str, expected: str | None) -> None:
    assert interface_for_address(ip, net_if_addrs=ADDRS) == expected


def test_interface_for_address_reads_psutil_by_default() -> None:
    assert interface_for_address("127.0.0.1") is not None


# ------------------------------------------------------------------------ discovery


class Recorder:
    """Collects one service's callbacks and lets a test wait for a condition on them."""

    def __init__(self) -> None:
        self.seen: list[Announcement] = []
        self.gone: list[str] = []
        self._changed = asyncio.Event()

    def on_seen(self, a: Announcement) -> None:
        self.seen.append(a)
        self._changed.set()

    def on_gone(self, node_id: str) -> None:
        self.gone.append(node_id)
        self._changed.set()

    async def wait_for(self, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        async def _wait() -> None:
            while not condition():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(_wait(), timeout_s)


@pytest_asyncio.fixture
async def loop_guard(caplog: pytest.LogCaptureFixture) -> AsyncIterator[None]:
    """Fails on leftover tasks or threads. (Blocking calls on the loop are caught for every async
    test by ``no_blocking_calls`` in tests/conftest.py, by call rather than by a timing that a
    loaded machine would trip.)"""
    threads_before = set(threading.enumerate())
    caplog.set_level(logging.WARNING, logger="asyncio")
    yield
    assert set(threading.enumerate()) <= threads_before
    assert asyncio.all_tasks() == {asyncio.current_task()}


@pytest.mark.asyncio
@pytest.mark.usefixtures("loop_guard")
async def test_two_services_find_update_and_lose_each_other() -> None:
    rec_a, rec_b = Recorder(), Recorder()
    ann_a = _announcement(NODE_A, name="ws-a", port=7001, gpus=2, free=2)
    ann_b = _announcement(NODE_B, name="ws-b", port=7002, gpus=4, free=1, ep="b-epoch-1")
    service_type = _private_service_type()
    svc_a = MdnsService(ann_a, ["127.0.0.1"], rec_a.on_seen, rec_a.on_gone, service_type=service_type, **FAST)
    svc_b = MdnsService(ann_b, ["127.0.0.1"], rec_b.on_seen, rec_b.on_gone, service_type=service_type, **FAST)
    try:
        await svc_a.async_start()
        await svc_b.async_start()
        assert svc_a.running and svc_b.running

        await rec_a.wait_for(lambda: bool(rec_a.seen))
        await rec_b.wait_for(lambda: bool(rec_b.seen))
        assert rec_a.seen[-1] == replace(ann_b, addresses=("127.0.0.1",))
        assert rec_b.seen[-1] == replace(ann_a, addresses=("127.0.0.1",))

        # free GPUs changed: the peer sees the new TXT
        await svc_b.async_update(replace(ann_b, free=0))
        await rec_a.wait_for(lambda: rec_a.seen[-1].free == 0)
        assert (rec_a.seen[-1].gpus, rec_a.seen[-1].port, rec_a.seen[-1].cluster) == (4, 7002, ann_b.cluster)

        await svc_b.async_stop()
        assert not svc_b.running
        await rec_a.wait_for(lambda: rec_a.gone == [NODE_B])
        await svc_b.async_stop()  # idempotent
    finally:
        await svc_b.async_stop()
        await svc_a.async_stop()

    # our own advertisement is never reported, and nothing was reported twice
    assert {a.node_id for a in rec_a.seen} == {NODE_B}
    assert {a.node_id for a in rec_b.seen} == {NODE_A}
    assert [a.free for a in rec_a.seen] == [1, 0]
    assert rec_b.gone == []


@pytest.mark.asyncio
@pytest.mark.usefixtures("loop_guard")
async def test_unreadable_record_is_ignored_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A peer whose TXT we cannot read (here: no ``id``) is never reported; WARNING once, DEBUG after."""
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf  # only to play a broken peer

    caplog.set_level(logging.DEBUG, logger="gpulayerd.net.mdns")
    rec = Recorder()
    service_type = _private_service_type()
    svc = MdnsService(_announcement(), ["127.0.0.1"], rec.on_seen, rec.on_gone, service_type=service_type, **FAST)
    bad = AsyncZeroconf(interfaces=["127.0.0.1"])
    name = f"{NODE_B}.{service_type}"

    def info(extra: str) -> AsyncServiceInfo:
        return AsyncServiceInfo(
            service_type,
            name,
            port=9,
            properties={"v": "1", "x": extra},
            server=f"{NODE_B}.local.",
            parsed_addresses=["127.0.0.1"],
        )

    def unreadable() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "gpulayerd.net.mdns" and "unreadable" in r.getMessage()]

    try:
        await svc.async_start()
        await (await bad.async_register_service(info("1")))
        await rec.wait_for(lambda: len(unreadable()) >= 1)
        await (await bad.async_update_service(info("2")))
        await rec.wait_for(lambda: len(unreadable()) >= 2)
    finally:
        await bad.async_close()
        await svc.async_stop()
    levels = [r.levelno for r in unreadable()]
    assert levels[0] == logging.WARNING
    assert set(levels[1:]) == {logging.DEBUG}
    assert rec.seen == [] and rec.gone == []


@pytest.mark.asyncio
async def test_address_without_multicast_is_unavailable() -> None:
    svc = MdnsService(_announcement(), ["192.0.2.123"], print, print)  # TEST-NET-1: not on this machine
    with pytest.raises(MdnsUnavailable, match=r"192\.0\.2\.123.*static peers only \(--peer HOST:PORT\)"):
        await svc.async_start()
    assert not svc.running
    await svc.async_stop()


_HELD_5353 = """
import asyncio, socket, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
from gpulayerd.net.announcement import Announcement
from gpulayerd.net.mdns import MdnsService, MdnsUnavailable
blocker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # no SO_REUSEADDR/SO_REUSEPORT: not shared
blocker.bind(("127.0.0.1", 5353))
a = Announcement(node_id=sys.argv[1], name="ws-01", addresses=("127.0.0.1",), port=7451,
                 cluster="CLUSTERID7Q2LKNNWG23TPOBYXE43UOV3HO6DZPIYTEMZUGU3DXYZ", ep="1a2b3c4d5e6f7a8b")
async def main():
    svc = MdnsService(a, ["127.0.0.1"], print, print)
    try:
        await svc.async_start()
    except MdnsUnavailable as e:
        print("UNAVAILABLE:", e)
        print("RUNNING:", svc.running)
        return
    print("STARTED")
    await svc.async_stop()
asyncio.run(main())
"""


def test_port_5353_held_without_sharing_is_unavailable() -> None:
    """Run in a private network namespace (``unshare --net``, root as in CI), where nothing
    else can already hold port 5353, so the test never depends on this machine's responders."""
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", _HELD_5353, NODE_A],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"unshare --net needs root: {proc.stderr[-2000:]}"
    assert "UNAVAILABLE:" in proc.stdout, proc.stdout + proc.stderr
    assert re.search(r"port 5353 is held by another program.*--peer HOST:PORT", proc.stdout), proc.stdout
    assert "RUNNING: False" in proc.stdout


@pytest.mark.asyncio
async def test_update_before_start_and_node_id_change() -> None:
    svc = MdnsService(_announcement(), ["127.0.0.1"], print, print)
    await svc.async_update(_announcement(free=0))
    assert svc.announcement.free == 0
    with pytest.raises(ValueError, match="cannot change node id"):
        await svc.async_update(_announcement(NODE_B))


@pytest.mark.parametrize(
    ("addresses", "message"),
    [([], "no address"), (["::1"], "IPv4"), (["eth0"], "IPv4")],
)
def test_service_refuses_bad_addresses(addresses: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MdnsService(_announcement(), addresses, print, print)


def test_service_refuses_an_announcement_it_cannot_encode() -> None:
    with pytest.raises(ValueError, match="limit"):
        MdnsService(_announcement(cluster="c" * 300), ["127.0.0.1"], print, print)
