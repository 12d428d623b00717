"""Environments a job's pre-flight check found broken here, kept until a probe shows them changed.

A pre-flight failure (:mod:`gpulayerd.runs.preflight`) marks (interpreter, framework) broken: the
environment is then shown with that framework's import error (``devices``, ``explain``) and
no job naming the framework is placed on it, exactly as if the probe had seen the import fail.
The mark holds while what the probe reads of that framework is the same as when it was made
(its version, the interpreter's Python version, the CUDA builds) and so is the machine's driver
state (the GPUs' driver, as :attr:`gpulayerd.gpu.discovery.HostInventory.driver_state` says it): a
reinstall, an upgrade, a fixed build or a driver that came back clears it at the next probe.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from gpulayerd.core.types import EnvironmentSnapshot

__all__ = ["MAX_MARKS", "PREFLIGHT_NOTE", "PreflightMarks"]

log = logging.getLogger(__name__)

MAX_MARKS = 256
"""The most marks (and remembered passes) kept (the oldest go first): a bound, whatever the jobs name."""

PASS_KEEP_S = 600.0
"""How long a passed import-only check (a CPU job's) stands for the same interpreter, frameworks and user
while the environment and the driver state are unchanged: the next such job skips it (seconds)."""

PassKey = tuple[str, tuple[str, ...], str, tuple[str, ...]]
"""(interpreter, frameworks, user, variables dropped) of an import-only check."""

PREFLIGHT_NOTE = "pre-flight check failed"


def _fingerprint(env: EnvironmentSnapshot, framework: str) -> tuple[object, ...]:
    fw = env.frameworks.get(framework)
    return (env.python_version, None if fw is None else (fw.version, fw.distribution),
            tuple(sorted(env.cuda_builds.items())))


class PreflightMarks:
    """(interpreter, framework) -> the pre-flight's error line, as long as the environment is unchanged."""

    def __init__(self) -> None:
        self._marks: dict[tuple[str, str], tuple[str, tuple[object, ...]]] = {}
        self._passes: dict[PassKey, tuple[float, tuple[object, ...]]] = {}

    @staticmethod
    def _state(envs: Sequence[EnvironmentSnapshot], key: PassKey, driver: str) -> tuple[object, ...] | None:
        env = next((e for e in envs if e.interpreter == key[0]), None)
        return None if env is None else (*(_fingerprint(env, fw) for fw in key[1]), driver)

    def record_pass(self, envs: Sequence[EnvironmentSnapshot], key: PassKey, driver: str, now: float) -> None:
        """An import-only check of ``key`` passed at ``now`` (monotonic s) under this probe and driver state."""
        state = self._state(envs, key, driver)
        if state is None:
            return
        self._passes.pop(key, None)
        self._passes[key] = (now, state)
        while len(self._passes) > MAX_MARKS:
            del self._passes[next(iter(self._passes))]

    def passed_recently(self, envs: Sequence[EnvironmentSnapshot], key: PassKey, driver: str, now: float) -> bool:
        """Whether an import-only check of ``key`` passed within :data:`PASS_KEEP_S` with the environment and
        the driver state as they are now (then the next one is skipped)."""
        kept = self._passes.get(key)
        return kept is not None and now - kept[0] < PASS_KEEP_S and kept[1] == self._state(envs, key, driver)

    def mark(self, envs: Sequence[EnvironmentSnapshot], interpreter: str, framework: str, line: str,
             driver: str = "") -> bool:
        """Mark ``framework`` broken in ``interpreter`` (as the last probe of ``envs`` shows it, under the
        driver state ``driver``) with ``line``; False (nothing marked) when no such environment is probed here."""
        env = next((e for e in envs if e.interpreter == interpreter), None)
        if env is None or not framework:
            return False
        self._marks.pop((interpreter, framework), None)
        self._marks[(interpreter, framework)] = (line, (*_fingerprint(env, framework), driver))
        while len(self._marks) > MAX_MARKS:
            del self._marks[next(iter(self._marks))]
        log.warning("environment %s: %s broken for jobs naming it (%s: %s) until a probe shows it changed",
                    interpreter, framework, PREFLIGHT_NOTE, line)
        return True

    def apply(self, envs: Sequence[EnvironmentSnapshot], driver: str = "") -> list[EnvironmentSnapshot]:
        """``envs`` with each mark that still holds as an import error and a note; a mark whose
        environment or driver state (``driver``) changed is dropped."""
        out: list[EnvironmentSnapshot] = []
        for env in envs:
            marked = {fw: line for (interp, fw), (line, fp) in self._marks.items()
                      if interp == env.interpreter and fp == (*_fingerprint(env, fw), driver)}
            for (interp, fw) in [k for k in self._marks if k[0] == env.interpreter and k[1] not in marked]:
                log.info("environment %s changed: %s is no longer marked broken", interp, fw)
                del self._marks[(interp, fw)]
            errors = {fw: f"{PREFLIGHT_NOTE}: {ln}" for fw, ln in sorted(marked.items())}
            out.append(dataclasses.replace(env, import_errors={**env.import_errors, **errors},
                                           notes=(*env.notes, *(f"{fw}: {e}" for fw, e in errors.items())))
                       if errors else env)
        return out
