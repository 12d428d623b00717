"""Where the local API's unix socket lives: the rule the daemon and the CLI share.

Stdlib only (platformdirs imported when a personal runtime dir is needed), so that the CLI can
find the socket without importing the daemon's settings (:mod:`gpulayerd.config`, pydantic).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

__all__ = ["SOCKET_NAME", "SYSTEM_RUNTIME_DIR", "SYSTEM_SOCKET_PATH", "default_runtime_dir", "socket_path_for"]

SOCKET_NAME = "gpulayerd.sock"
SYSTEM_RUNTIME_DIR = Path("/run/gpulayer")
"""System mode's socket dir (0755, root's; the socket is 0666)."""
SYSTEM_SOCKET_PATH = SYSTEM_RUNTIME_DIR / SOCKET_NAME
"""Where the CLI looks for the system daemon when no personal one answers."""


def default_runtime_dir() -> Path:
    """platformdirs' user runtime dir (``$XDG_RUNTIME_DIR/gpulayer``), or a private dir in /tmp.

    Falls back to ``/tmp/gpulayer-<uid>`` when the runtime dir cannot be created (no
    login session, e.g. a container).
    """
    from platformdirs import user_runtime_dir

    with warnings.catch_warnings():
        # Without XDG_RUNTIME_DIR (no login session, e.g. a container or root in CI) platformdirs
        # warns and falls back to /tmp/runtime-<uid>: a fine answer, not the user's concern.
        warnings.simplefilter("ignore")
        d = Path(user_runtime_dir("gpulayer"))
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d
    except OSError:
        return Path(f"/tmp/gpulayer-{os.getuid()}")


def socket_path_for(state_dir: Path | None, runtime_dir: Path | None = None) -> Path:
    """Where the local API socket lives for these settings (the CLI uses the same rule)."""
    if runtime_dir is not None:
        return runtime_dir / SOCKET_NAME
    if state_dir is not None:
        return state_dir / "run" / SOCKET_NAME
    return default_runtime_dir() / SOCKET_NAME
