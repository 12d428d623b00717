"""Which local addresses gpulayerd advertises on the LAN, and which interface holds an address.

Container bridges, VPN tunnels and overlay networks are skipped unless named
explicitly: peers on the LAN cannot reach those addresses, and advertising them
makes every peer try (and time out on) each one.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from typing import Protocol

import psutil

__all__ = ["SKIPPED_INTERFACE_PREFIXES", "interface_for_address", "lan_addresses"]

SKIPPED_INTERFACE_PREFIXES: tuple[str, ...] = (
    "lo",
    "docker",
    "br-",
    "virbr",
    "veth",
    "tailscale",
    "zt",
    "wg",
    "cni",
    "flannel",
    "cali",
)
"""Interface name prefixes never chosen automatically (loopback, containers, VPNs, overlays)."""


class NicAddress(Protocol):
    """One address of an interface, as in ``psutil.net_if_addrs()`` values."""

    @property
    def family(self) -> int: ...

    @property
    def address(self) -> str: ...


class NicStats(Protocol):
    """One interface's state, as in ``psutil.net_if_stats()`` values."""

    @property
    def isup(self) -> bool: ...


def lan_addresses(
    interface: str | None = None,
    *,
    net_if_addrs: Mapping[str, Sequence[NicAddress]] | None = None,
    net_if_stats: Mapping[str, NicStats] | None = None,
) -> list[tuple[str, str]]:
    """IPv4 addresses to advertise: ``(ifname, address)`` pairs, sorted by interface then address.

    Without ``interface``: every up interface whose name does not start with one of
    :data:`SKIPPED_INTERFACE_PREFIXES`, minus loopback and link-local (169.254/16)
    addresses. An interface missing from ``net_if_stats`` counts as up (psutil leaves out
    interfaces it cannot query). The result may be empty (no LAN; use static peers).

    Args:
        interface: use only this interface (whatever its name and kind), as ``--interface`` does.
        net_if_addrs: ``psutil.net_if_addrs()``-shaped table (read from psutil when None).
        net_if_stats: ``psutil.net_if_stats()``-shaped table (read from psutil when None).

    Raises:
        ValueError: ``interface`` does not exist (the message lists the interfaces there are),
            is down, or has no IPv4 address.
    """
    addrs: Mapping[str, Sequence[NicAddress]] = psutil.net_if_addrs() if net_if_addrs is None else net_if_addrs
    stats: Mapping[str, NicStats] = psutil.net_if_stats() if net_if_stats is None else net_if_stats

    if interface is not None:
        if interface not in addrs:
            available = ", ".join(sorted(addrs)) or "none"
            raise ValueError(f"no network interface named {interface!r}; available: {available}")
        if not _is_up(stats, interface):
            raise ValueError(f"network interface {interface!r} is down")
        chosen = sorted(_ipv4(addrs[interface]), key=ipaddress.IPv4Address)
        if not chosen:
            raise ValueError(f"network interface {interface!r} has no IPv4 address")
        return [(interface, ip) for ip in chosen]

    result: list[tuple[str, str]] = []
    for name in sorted(addrs):
        if name.startswith(SKIPPED_INTERFACE_PREFIXES) or not _is_up(stats, name):
            continue
        for ip in sorted(_ipv4(addrs[name]), key=ipaddress.IPv4Address):
            parsed = ipaddress.IPv4Address(ip)
            if not (parsed.is_loopback or parsed.is_link_local):
                result.append((name, ip))
    return result


def interface_for_address(
    ip: str,
    *,
    net_if_addrs: Mapping[str, Sequence[NicAddress]] | None = None,
) -> str | None:
    """Name of the local interface that holds ``ip`` (IPv4 or IPv6), or None if none does.

    Used to pin collective backends to the advertised network (``GLOO_SOCKET_IFNAME``).
    """
    try:
        wanted = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    addrs: Mapping[str, Sequence[NicAddress]] = psutil.net_if_addrs() if net_if_addrs is None else net_if_addrs
    for name in sorted(addrs):
        for a in addrs[name]:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(a.address.split("%", 1)[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def _is_up(stats: Mapping[str, NicStats], name: str) -> bool:
    s = stats.get(name)
    return s is None or s.isup


def _ipv4(addrs: Sequence[NicAddress]) -> set[str]:
    """The valid IPv4 addresses among one interface's addresses."""
    out: set[str] = set()
    for a in addrs:
        if a.family != socket.AF_INET:
            continue
        try:
            out.add(str(ipaddress.IPv4Address(a.address)))
        except ValueError:
            continue
    return out
