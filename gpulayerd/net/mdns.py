"""mDNS discovery of gpulayerd peers: advertise our summary, browse for theirs.

The only module that imports zeroconf. Each daemon registers one service of type
``_gpulayer._tcp.local.`` whose instance name is its node id (52 base32 characters,
one DNS label) and whose TXT record is a small versioned summary (see
:func:`gpulayerd.net.announcement.encode_txt`); full capabilities travel over the
authenticated API.

mDNS is advisory. A daemon killed with SIGKILL sends no goodbye and its record stays
in peers' caches for minutes, so liveness comes from heartbeats, never from here;
``ep`` (an epoch that changes on every daemon start) tells a restarted daemon apart.
Multicast is often blocked, so when mDNS cannot run :class:`MdnsUnavailable` says so
and the daemon goes on with its static peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from zeroconf import Error as ZeroconfError
from zeroconf import IPVersion, NonUniqueNameException, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from gpulayerd.net.announcement import Announcement, encode_txt, parse_txt

__all__ = ["SERVICE_TYPE", "MdnsService", "MdnsUnavailable"]

_log = logging.getLogger(__name__)

SERVICE_TYPE = "_gpulayer._tcp.local."

_MDNS_GROUP = "224.0.0.251"
_MDNS_PORT = 5353
_STATIC_PEERS_HINT = "the daemon continues with static peers only (--peer HOST:PORT)"


class MdnsUnavailable(Exception):
    """mDNS cannot run on the chosen addresses; the message says why and that static peers still work."""


class MdnsService:
    """Advertise one :class:`Announcement` and report peers' announcements as they come and go.

    Every ``async_*`` method and both callbacks run in the event loop; zeroconf runs in
    that loop too (no thread). ``on_seen`` gets a peer's announcement when it first
    resolves and whenever its content changes (TXT, addresses); ``on_gone`` gets the node
    id of a peer that said goodbye or whose record expired. Our own node id is never
    reported. A callback that raises is logged and does not stop discovery.

    Args:
        announcement: what we advertise.
        addresses: IPv4 addresses to bind to (usually from :func:`~gpulayerd.net.interfaces.lan_addresses`).
        on_seen: called with a peer's announcement.
        on_gone: called with a peer's node id.
        service_type: the DNS-SD service type.
        query_interval_s: shortest time between the browser's queries (zeroconf backs off from there).
        request_timeout_s: how long to wait for a peer's SRV/TXT/A records before giving up on it.
        log_memory: how many distinct failures are remembered for log-once.

    Raises:
        ValueError: ``announcement`` cannot be encoded, or ``addresses`` is empty or not IPv4.
    """

    def __init__(
        self,
        announcement: Announcement,
        addresses: Sequence[str],
        on_seen: Callable[[Announcement], None],
        on_gone: Callable[[str], None],
        *,
        service_type: str = SERVICE_TYPE,
        query_interval_s: float = 10.0,
        request_timeout_s: float = 3.0,
        log_memory: int = 256,
    ) -> None:
        encode_txt(announcement)
        if not addresses:
            raise ValueError("no address to run mDNS on")
        for ip in addresses:
            try:
                ipaddress.IPv4Address(ip)
            except ValueError as e:
                raise ValueError(f"mDNS binds to IPv4 addresses only, got {ip!r}") from e
        if query_interval_s <= 0 or request_timeout_s <= 0:
            raise ValueError("query_interval_s and request_timeout_s must be positive")
        self._announcement = announcement
        self._addresses = tuple(addresses)
        self._on_seen = on_seen
        self._on_gone = on_gone
        self._service_type = service_type
        self._query_interval_s = query_interval_s
        self._request_timeout_s = request_timeout_s
        self._log_once = _LogOnce(_log, log_memory)
        self._lock = asyncio.Lock()
        self._aiozc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._known: dict[str, Announcement] = {}

    @property
    def announcement(self) -> Announcement:
        """What we advertise (or will, once started)."""
        return self._announcement

    @property
    def running(self) -> bool:
        """Whether :meth:`async_start` succeeded and :meth:`async_stop` has not run since."""
        return self._aiozc is not None

    @property
    def bound_addresses(self) -> tuple[str, ...]:
        """The addresses mDNS was asked to run on."""
        return self._addresses

    async def async_start(self) -> None:
        """Bind, start browsing and register our service; returns once it has been announced.

        Raises:
            MdnsUnavailable: mDNS cannot run here (port 5353 taken by a responder that does
                not share it, no multicast on any address, permission, name conflict); nothing
                is left running.
            RuntimeError: already started.
        """
        async with self._lock:
            if self._aiozc is not None:
                raise RuntimeError("mDNS is already running")
            usable = _check_multicast(self._addresses)
            try:
                self._aiozc = AsyncZeroconf(interfaces=list(usable), ip_version=IPVersion.V4Only)
                self._browser = AsyncServiceBrowser(
                    self._aiozc.zeroconf,
                    self._service_type,
                    handlers=[self._async_on_service_state_change],
                    delay=max(1, round(self._query_interval_s * 1000)),
                )
                info = _service_info(self._service_type, self._announcement)
                announced = await self._aiozc.async_register_service(info)
                self._info = info
                await announced
            except NonUniqueNameException as e:
                await self._async_teardown()
                reason = f"another responder already advertises node id {self._announcement.node_id}"
                raise MdnsUnavailable(_unavailable_message(usable, reason)) from e
            except (OSError, ZeroconfError) as e:
                await self._async_teardown()
                reason = f"zeroconf failed to start: {type(e).__name__}: {e}"
                raise MdnsUnavailable(_unavailable_message(usable, reason)) from e
            except BaseException:
                await self._async_teardown()
                raise
            _log.info(
                "mDNS: advertising %s as %s on %s port %d",
                self._service_type,
                self._announcement.node_id,
                ", ".join(usable),
                self._announcement.port,
            )

    async def async_update(self, announcement: Announcement) -> None:
        """Advertise ``announcement`` instead (new TXT, e.g. free GPUs changed); no-op if unchanged.

        Before :meth:`async_start` (or after :meth:`async_stop`) it only replaces what a
        later start advertises.

        Raises:
            ValueError: the node id differs from the one advertised, or ``announcement`` cannot be encoded.
        """
        if announcement.node_id != self._announcement.node_id:
            raise ValueError(f"cannot change node id {self._announcement.node_id} to {announcement.node_id}")
        encode_txt(announcement)
        async with self._lock:
            if announcement == self._announcement:
                return
            self._announcement = announcement
            if self._aiozc is None:
                return
            info = _service_info(self._service_type, announcement)
            try:
                rebroadcast = await self._aiozc.async_update_service(info)
                self._info = info
                await rebroadcast
            except (OSError, ZeroconfError) as e:
                self._log_once.log(("update", type(e).__name__), "mDNS: could not re-advertise: %s", e)

    async def async_stop(self) -> None:
        """Say goodbye, stop browsing and close every socket; idempotent, leaves no task behind."""
        async with self._lock:
            await self._async_teardown()

    # ------------------------------------------------------------------ private

    def _async_on_service_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        """Browser handler: runs in the loop, so it only schedules work."""
        if self._aiozc is None:
            return
        label = _instance_label(name, service_type)
        if label is None or label.lower() == self._announcement.node_id.lower():
            return
        pending = self._resolving.pop(name, None)
        if pending is not None:
            pending.cancel()
        if state_change is ServiceStateChange.Removed:
            gone = self._known.pop(name, None)
            if gone is not None:
                self._call("on_gone", lambda: self._on_gone(gone.node_id))
            return
        task = asyncio.get_running_loop().create_task(
            self._async_resolve(name, label, service_type), name=f"mdns-resolve-{label}"
        )
        self._resolving[name] = task
        task.add_done_callback(self._forget_task(name))

    def _forget_task(self, name: str) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            if self._resolving.get(name) is task:
                del self._resolving[name]

        return done

    async def _async_resolve(self, name: str, label: str, service_type: str) -> None:
        """Fetch a peer's records (from the cache when complete) and report it if it changed."""
        aiozc = self._aiozc
        if aiozc is None:
            return
        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(aiozc.zeroconf, self._request_timeout_s * 1000):
            self._log_once.log(
                (name, "timeout"), "mDNS: %s did not answer within %.1f s", name, self._request_timeout_s
            )
            return
        record, reason = parse_txt(info.properties)
        if record is None:
            self._log_once.log((name, reason), "mDNS: ignoring %s, unreadable TXT record: %s", name, reason)
            return
        if record["id"].lower() != label.lower():
            self._log_once.log(
                (name, "id"), "mDNS: ignoring %s, its TXT id %s is not its instance name", name, record["id"]
            )
            return
        addresses = tuple(info.parsed_addresses())
        if not addresses:
            self._log_once.log((name, "addresses"), "mDNS: ignoring %s, it has no address", name)
            return
        self._log_once.forget(lambda key: isinstance(key, tuple) and key[0] == name)
        seen = Announcement(
            node_id=record["id"],
            name=record["name"] or "",
            addresses=addresses,
            port=record["port"],
            cluster=record["cluster"],
            ep=record["ep"],
            version=record["v"],
            gpus=record["gpus"],
            free=record["free"],
        )
        if self._known.get(name) == seen:
            return
        self._known[name] = seen
        self._call("on_seen", lambda: self._on_seen(seen))

    def _call(self, what: str, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            _log.exception("mDNS: %s callback failed", what)

    async def _async_teardown(self) -> None:
        aiozc, self._aiozc = self._aiozc, None
        browser, self._browser = self._browser, None
        info, self._info = self._info, None
        tasks = list(self._resolving.values())
        self._resolving.clear()
        self._known.clear()
        for task in tasks:
            task.cancel()
        if browser is not None:
            await browser.async_cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if aiozc is None:
            return
        try:
            if info is not None:
                goodbye = await aiozc.async_unregister_service(info)
                await goodbye
        except (OSError, ZeroconfError) as e:
            _log.debug("mDNS: goodbye for %s failed: %s", info.name if info else "?", e)
        finally:
            await aiozc.async_close()


class _LogOnce:
    """WARNING the first time a key is logged, DEBUG after; remembers at most ``max_keys`` keys."""

    def __init__(self, logger: logging.Logger, max_keys: int) -> None:
        self._logger = logger
        self._max_keys = max(1, max_keys)
        self._seen: OrderedDict[Hashable, None] = OrderedDict()

    def log(self, key: Hashable, msg: str, *args: object) -> None:
        if key in self._seen:
            self._seen.move_to_end(key)
            level = logging.DEBUG
        else:
            self._seen[key] = None
            if len(self._seen) > self._max_keys:
                self._seen.popitem(last=False)
            level = logging.WARNING
        self._logger.log(level, msg, *args)

    def forget(self, match: Callable[[Hashable], bool]) -> None:
        """Warn again next time for the keys that ``match`` (the failure went away)."""
        for key in [k for k in self._seen if match(k)]:
            del self._seen[key]


def _service_info(service_type: str, a: Announcement) -> AsyncServiceInfo:
    properties: dict[str | bytes, str | bytes | None] = {k: v for k, v in encode_txt(a).items()}
    return AsyncServiceInfo(
        service_type,
        f"{a.node_id}.{service_type}",
        port=a.port,
        properties=properties,
        server=f"{a.node_id}.local.",
        parsed_addresses=list(a.addresses),
    )


def _instance_label(name: str, service_type: str) -> str | None:
    """``<label>`` of ``<label>.<service_type>``, or None when ``name`` is not of that type."""
    suffix = "." + service_type
    if not name.lower().endswith(suffix.lower()) or len(name) == len(suffix):
        return None
    return name[: -len(suffix)]


def _unavailable_message(addresses: Sequence[str], reason: str) -> str:
    return f"mDNS unavailable on {', '.join(addresses)}: {reason}; {_STATIC_PEERS_HINT}"


def _check_multicast(addresses: Sequence[str]) -> list[str]:
    """Addresses on which the mDNS group can be joined; fails early with a clear reason.

    zeroconf logs and carries on when port 5353 or the group join fails, leaving a
    responder that hears nothing; this probe does the same steps once to say why.

    Raises:
        MdnsUnavailable: port 5353 cannot be shared, or no address can join the group.
    """
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as e:
        raise MdnsUnavailable(_unavailable_message(addresses, f"cannot open a UDP socket: {e}")) from e
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            with contextlib.suppress(OSError):  # ENOPROTOOPT on kernels without it; SO_REUSEADDR may still share
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(("", _MDNS_PORT))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                reason = (
                    f"UDP port {_MDNS_PORT} is held by another program that does not share it "
                    "(for avahi-daemon, set disallow-other-stacks=no)"
                )
            elif e.errno in (errno.EACCES, errno.EPERM):
                reason = f"not allowed to bind UDP port {_MDNS_PORT}"
            else:
                reason = f"cannot bind UDP port {_MDNS_PORT}: {e.strerror or e}"
            raise MdnsUnavailable(_unavailable_message(addresses, reason)) from e
        usable: list[str] = []
        failures: list[str] = []
        for ip in addresses:
            membership = socket.inet_aton(_MDNS_GROUP) + socket.inet_aton(ip)
            try:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:  # EADDRINUSE: another address of an interface already joined
                    failures.append(f"{ip} ({e.strerror or e})")
                    continue
            usable.append(ip)
    if not usable:
        reason = f"cannot join multicast group {_MDNS_GROUP} on {', '.join(failures)}"
        raise MdnsUnavailable(_unavailable_message(addresses, reason))
    if failures:
        _log.warning("mDNS: not using %s: cannot join multicast group %s", ", ".join(failures), _MDNS_GROUP)
    return usable
