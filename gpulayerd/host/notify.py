"""The service manager's readiness protocol (sd_notify), without a dependency.

systemd starts a ``Type=notify`` service with ``NOTIFY_SOCKET`` set to a unix datagram
socket: a filesystem path, or an abstract name written with a leading ``@``. The
service sends newline-separated ``KEY=VALUE`` assignments to it in one datagram:
``READY=1`` once it serves, ``STOPPING=1`` when it begins to shut down, ``STATUS=...``
for ``systemctl status``. Without ``NOTIFY_SOCKET`` (run by hand, under launchd, in
tests) every call here does nothing. No call ever raises or blocks.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["notify", "notify_ready", "notify_status", "notify_stopping"]

log = logging.getLogger(__name__)


def notify(*assignments: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``assignments`` (such as ``"READY=1"``) to the service manager in one datagram.

    Args:
        assignments: ``KEY=VALUE`` strings; newlines inside a value become spaces.
        environ: where to read ``NOTIFY_SOCKET`` (default: this process's environment).

    Returns:
        True when the datagram was sent; False when ``NOTIFY_SOCKET`` is unset or not a
        unix socket address, or the send failed (logged at DEBUG).
    """
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address.startswith(("/", "@")):
        if address:
            log.debug("NOTIFY_SOCKET=%r is not a unix socket address; not notifying", address)
        return False
    try:
        raw_address = os.fsencode(address)
        if raw_address.startswith(b"@"):
            raw_address = b"\0" + raw_address[1:]  # Linux abstract namespace
        message = "\n".join(a.replace("\n", " ") for a in assignments).encode("utf-8")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            # Non-blocking: this runs in the daemon's event loop; a full queue drops the message.
            sock.setblocking(False)
            sock.sendto(message, raw_address)
    except (OSError, ValueError) as e:
        log.debug("cannot notify the service manager at %s: %s", address, e)
        return False
    return True


def notify_ready(status: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """``READY=1`` (and ``STATUS=``): the daemon serves its local API now."""
    return notify("READY=1", *_status(status), environ=environ)


def notify_stopping(status: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """``STOPPING=1`` (and ``STATUS=``): the daemon has begun its shutdown."""
    return notify("STOPPING=1", *_status(status), environ=environ)


def notify_status(status: str, environ: Mapping[str, str] | None = None) -> bool:
    """``STATUS=``: one line shown by ``systemctl status``."""
    return notify(*_status(status), environ=environ)


def _status(status: str | None) -> list[str]:
    return [] if status is None else [f"STATUS={status}"]
