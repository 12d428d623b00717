"""Waiting without ``select()``, and the processes that must not outlive their parent.

``select.select`` cannot watch a descriptor above ``FD_SETSIZE`` (1024): a daemon holding many
connections hands such numbers to the code that waits on its zygote's pipes, and ``select``
then raises ``filedescriptor out of range``. :func:`readable` uses ``poll``.

:func:`die_with_parent` and :func:`orphaned` keep the zygote's spare watchdogs from outliving
the zygote (Linux ``PR_SET_PDEATHSIG``, and a check of the parent's pid as a backstop);
:func:`name_process` gives the zygote, a spare and a watchdog names of their own in ``ps -o
comm`` and ``top`` (their command lines are all ``python -m gpulayerd.runs.zygote``).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
from collections.abc import Sequence

__all__ = ["die_with_parent", "name_process", "orphaned", "readable"]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def readable(fds: Sequence[int], timeout_s: float) -> list[int]:
    """The descriptors of ``fds`` ready to read (or at end of file, or in error) within ``timeout_s``
    seconds (0: do not wait); [] when none is, or a signal interrupted the wait."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLPRI)
    try:
        events = poller.poll(max(timeout_s, 0.0) * 1000.0)
    except InterruptedError:  # (PEP 475 retries it; only a signal handler that raised ends up here)
        return []
    return [fd for fd, _ in events]


def _prctl(option: int, value: int | bytes) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int | None = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (None: no longer). Linux
    only (False elsewhere). The parent may already be gone: check :func:`orphaned` after setting it."""
    return _prctl(_PR_SET_PDEATHSIG, 0 if sig is None else int(sig))


def orphaned(parent: int) -> bool:
    """True when this process's parent is no longer ``parent`` (it exited: we were re-parented)."""
    return os.getppid() != parent


def name_process(name: str) -> None:
    """This process's name in ``ps -o comm``, ``top`` and ``/proc/PID/comm`` (at most 15 bytes; Linux)."""
    _prctl(_PR_SET_NAME, name.encode()[:15])
