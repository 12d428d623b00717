"""Environments answered from metadata first, the import-based torch check in the background.

Importing torch in a workload interpreter takes a second or more (and can hang on a broken
driver), so the daemon's first answer about an environment comes from package metadata
(:meth:`EnvironmentProber.metadata_first`): versions, CUDA builds, Python version, with
torch's runtime facts marked ``torch_pending``. The full check then runs in a subprocess,
from a worker thread, as a background task; when it lands, the caller's ``apply`` callback
takes the full snapshot (and tells the scheduler and peers, as any capability change does).
Both answers are cached by the prober, so the next start reads the full one from disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

from gpulayerd.app.common.signals import Signals
from gpulayerd.core.types import EnvironmentSnapshot
from gpulayerd.gpu.environments import TORCH_PENDING_NOTE, EnvironmentProber

__all__ = ["TorchChecks"]

log = logging.getLogger(__name__)

_UNKNOWN_NOTE = "torch: availability unknown"


class TorchChecks:
    """Fast environment answers plus one background torch check per interpreter at a time.

    Args:
        prober: the environment prober (its caches hold both kinds of answer).
        signals: spawns the background tasks (cancelled when the daemon stops).
        apply: awaited with each full snapshot when its check lands (off no lock of ours).
    """

    def __init__(self, prober: EnvironmentProber, signals: Signals,
                 apply: Callable[[EnvironmentSnapshot], Awaitable[None]]) -> None:
        self._prober = prober
        self._signals = signals
        self._apply = apply
        self._running: dict[str, asyncio.Task[None]] = {}
        self._failed: dict[str, EnvironmentSnapshot] = {}  # interpreter path -> its last unfinished check

    def running(self) -> bool:
        """True while some import-based check has not landed yet."""
        return any(not t.done() for t in self._running.values())

    async def answers(self, interpreters: Sequence[str]) -> list[EnvironmentSnapshot]:
        """One snapshot per interpreter, from the cache or metadata (never waiting for torch).

        Starts the import-based check of each interpreter whose full answer is not cached and
        that is not being checked already. After a check that did not finish (timed out,
        crashed), the metadata answer carries that failure's torch notes instead of
        ``torch_pending`` (runtime facts unknown, not pending), and the check is tried again.
        """
        out: list[EnvironmentSnapshot] = []
        for interp in interpreters:
            snap, needs_check = await asyncio.to_thread(self._prober.metadata_first, interp)
            if needs_check:
                failed = self._failed.get(snap.interpreter)
                if failed is not None:
                    why = [n for n in failed.notes if n.startswith(_UNKNOWN_NOTE)] or [
                        f"{_UNKNOWN_NOTE}: the last torch check did not finish ({'; '.join(failed.notes)})"]
                    notes = [n for n in snap.notes if n != TORCH_PENDING_NOTE] + why
                    snap = dataclasses.replace(snap, torch_pending=False, notes=tuple(notes))
                self._start(interp, snap.interpreter)
            out.append(snap)
        return out

    def _start(self, interp: str, path: str) -> None:
        task = self._running.get(path)
        if task is not None and not task.done():
            return
        self._running[path] = self._signals.spawn(self._check(interp, path), name=f"torch-check {path}")

    async def _check(self, interp: str, path: str) -> None:
        try:
            snap, complete = await asyncio.to_thread(self._prober.probe_full, interp)
        except asyncio.CancelledError:
            # The daemon is stopping: end the torch import now (the thread returns at once),
            # rather than have shutdown wait for it (seconds, or the probe timeout if it hangs).
            self._prober.stop_torch_checks()
            raise
        if complete:
            self._failed.pop(path, None)
        else:
            self._failed[path] = snap
            log.info("torch check of %s did not finish; its runtime facts stay unknown", path)
        await self._apply(snap)
