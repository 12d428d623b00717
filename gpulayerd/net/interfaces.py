"""Which local addresses gpulayerd advertises on the LAN, and which interface holds an address.

Container and VM bridges, VPN tunnels and overlay networks are skipped unless named
explicitly (``--interface``): peers on the LAN cannot reach those addresses, and
advertising them makes every peer try (and time out on) each one, or pick a tunnel
address at random (recorded case bug-37). An interface is skipped when

- its name starts with one of :data:`SKIPPED_INTERFACE_PREFIXES` (the names OpenVPN,
  WireGuard, Docker, Podman, libvirt, LXD/LXC/Incus, VMware, VirtualBox, Multipass,
  Hamachi, ZeroTier, Tailscale, CNI/Flannel/Calico and macOS's ``utun``/``bridge`` use), or
- it is point-to-point (``pointopoint`` among psutil's interface flags, or an address
  with a point-to-point peer): tunnels of any VPN, whatever their name.

The link kind (veth, bridge in sysfs) is deliberately not a rule: a host inside a network
namespace or container reaches the LAN through a veth interface (the test LAN's hosts do).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from typing import Protocol

from gpulayerd.host import sysinfo

__all__ = ["SKIPPED_INTERFACE_PREFIXES", "interface_for_address", "is_virtual_interface", "lan_addresses"]

SKIPPED_INTERFACE_PREFIXES: tuple[str, ...] = (
    "lo",
    # VPN tunnels
    "tun",
    "tap",
    "wg",
    "utun",
    "ppp",
    "ipsec",
    "ham",
    "zt",
    "tailscale",
    "nebula",
    "gif",
    "stf",
    # container and VM bridges, overlays
    "docker",
    "br-",
    "virbr",
    "veth",
    "vmnet",
    "vboxnet",
    "lxdbr",
    "lxcbr",
    "incusbr",
    "mpqemubr",
    "podman",
    "cni",
    "flannel",
    "cali",
    "cilium",
    "kube-",
    "bridge",
)
"""Interface name prefixes never chosen automatically (loopback, containers, VMs, VPNs, overlays).

``veth`` matches only the host side of a container's link (``veth1a2b``); a namespace's
own end is named like a NIC (``eth0``) and is kept.
"""


def is_virtual_interface(name: str, flags: str = "", ptp: bool = False) -> bool:
    """True when ``name`` is an interface :func:`lan_addresses` skips unless asked for by name.

    Args:
        name: the interface name.
        flags: psutil's comma-separated interface flags (``up,pointopoint,running``).
        ptp: one of its addresses has a point-to-point peer (psutil's ``ptp``).
    """
    return name.startswith(SKIPPED_INTERFACE_PREFIXES) or ptp or "pointopoint" in flags.split(",")


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

    # psutil's ``flags`` (``up,pointopoint,running``) is read when present.


def lan_addresses(
    interface: str | None = None,
    *,
    net_if_addrs: Mapping[str, Sequence[NicAddress]] | None = None,
    net_if_stats: Mapping[str, NicStats] | None = None,
) -> list[tuple[str, str]]:
    """IPv4 addresses to advertise: ``(ifname, address)`` pairs, sorted by interface then address.

    Without ``interface``: every up interface that :func:`is_virtual_interface` does not
    skip (name prefixes in :data:`SKIPPED_INTERFACE_PREFIXES`, point-to-point links),
    minus loopback and link-local (169.254/16) addresses. An interface missing from
    ``net_if_stats`` counts as up (psutil leaves out interfaces it cannot query). The result
    may be empty (no LAN; use static peers).

    Args:
        interface: use only this interface (whatever its name and kind), as ``--interface`` does.
        net_if_addrs: ``psutil.net_if_addrs()``-shaped table (read from psutil when None).
        net_if_stats: ``psutil.net_if_stats()``-shaped table (read from psutil when None).

    Raises:
        ValueError: ``interface`` does not exist (the message lists the interfaces there are),
            is down, or has no IPv4 address.
    """
    addrs: Mapping[str, Sequence[NicAddress]] = sysinfo.net_if_addrs() if net_if_addrs is None else net_if_addrs
    stats: Mapping[str, NicStats] = sysinfo.net_if_stats() if net_if_stats is None else net_if_stats

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
        flags = getattr(stats.get(name), "flags", "")
        ptp = any(getattr(a, "ptp", None) for a in addrs[name] if a.family == socket.AF_INET)
        if is_virtual_interface(name, flags if isinstance(flags, str) else "", ptp) or not _is_up(stats, name):
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
    addrs: Mapping[str, Sequence[NicAddress]] = sysinfo.net_if_addrs() if net_if_addrs is None else net_if_addrs
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
