"""Run every long-running loop under one supervisor: log, back off, restart.

A failure is logged at WARNING the first time and at DEBUG while it repeats (the
log-once idea of python-zeroconf). ``CancelledError`` is never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ["supervise"]

log = logging.getLogger(__name__)


async def supervise(
    name: str,
    loop_fn: Callable[[], Awaitable[None]],
    *,
    initial_backoff_s: float = 0.2,
    max_backoff_s: float = 10.0,
) -> None:
    """Run ``loop_fn`` until cancelled, restarting it with exponential backoff when it fails.

    A loop that returns normally is finished and not restarted.
    """
    backoff_s = initial_backoff_s
    last_error: str | None = None
    while True:
        try:
            await loop_fn()
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            if text != last_error:
                log.warning("loop %s failed (%s); restarting in %.1f s", name, text, backoff_s, exc_info=e)
            else:
                log.debug("loop %s failed again (%s)", name, text)
            last_error = text
            await asyncio.sleep(backoff_s)
            backoff_s = min(max_backoff_s, backoff_s * 2)
