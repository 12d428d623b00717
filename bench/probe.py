"""The environment probe, staged: ``python bench/probe.py [--interpreter PY] [--runs N]``.

The daemon's first answer about an environment comes from package metadata
(:meth:`EnvironmentProber.metadata_first`); the import-based torch check runs in the
background and lands later (:class:`gpulayerd.app.worker.envchecks.TorchChecks`). Figures, each
beside its target:

- metadata answer, cold: a fresh prober on an empty cache directory (no gpulayer cache), a
  fresh probed interpreter each run (OS caches cannot be dropped here), p50 of ``--runs``;
  target 300 ms (issue 17).
- the full check (torch imported in the probed interpreter), cold: p50 of 3; no target, it
  is off the critical path now.
- the next start: a fresh prober on the cache directory the full check filled (what a
  restarted daemon answers first), p50 of 20; target 5 ms.
- the daemon's path (``TorchChecks`` in an event loop): first answer, then the check landing.

Asserts nothing; it is not run by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from bench.bench_report import line, percentile
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.worker.envchecks import TorchChecks
from gpulayerd.core.types import EnvironmentSnapshot
from gpulayerd.gpu.environments import EnvironmentProber

TIMEOUT_S = 120.0


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def _cold_metadata(interpreter: str) -> float:
    with tempfile.TemporaryDirectory(prefix="gl-bench-probe-") as cache:
        prober = EnvironmentProber(TIMEOUT_S, Path(cache))
        start = time.perf_counter()
        snap, needs_check = prober.metadata_first(interpreter)
        ms = (time.perf_counter() - start) * 1000
    if not snap.ok:
        raise SystemExit(f"probe of {interpreter} failed: {snap.notes}")
    if "torch" in snap.frameworks and not needs_check:
        raise SystemExit("torch is installed but the cold answer was not metadata-only")
    return ms


async def _staged(interpreter: str, cache: Path) -> tuple[float, float, EnvironmentSnapshot]:
    """(first answer ms, check landed ms, landed snapshot) through the daemon's TorchChecks."""
    signals = Signals()
    landed: asyncio.Future[EnvironmentSnapshot] = asyncio.get_running_loop().create_future()

    async def apply(env: EnvironmentSnapshot) -> None:
        if not landed.done():
            landed.set_result(env)

    checks = TorchChecks(EnvironmentProber(TIMEOUT_S, cache), signals, apply)
    start = time.perf_counter()
    first = await checks.answers([interpreter])
    first_ms = (time.perf_counter() - start) * 1000
    if not first[0].torch_pending:
        landed.set_result(first[0])
    env = await landed
    land_ms = (time.perf_counter() - start) * 1000
    await signals.close()
    return first_ms, land_ms, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interpreter", default=sys.executable, help="the probed Python (default: this one)")
    ap.add_argument("--runs", type=int, default=10, help="cold metadata answers to measure")
    args = ap.parse_args()
    interpreter: str = args.interpreter

    print(f"machine: {platform.node()} {platform.machine()}, Python {platform.python_version()}; "
          f"probed interpreter {interpreter}", flush=True)
    first = EnvironmentProber(TIMEOUT_S, None).probe(interpreter, use_cache=False, torch_check=False)
    torch = first.frameworks.get("torch")
    print(f"torch in it: {torch.version if torch else 'not installed'}"
          f"{'' if torch else ' (the figures below then say little: nothing to defer)'}", flush=True)

    cold = [_cold_metadata(interpreter) for _ in range(args.runs)]
    line(f"probe metadata answer, cold (no gpulayer cache), p50 of {len(cold)}", percentile(cold, 50), "ms", 300.0)
    line(f"probe metadata answer, cold, max of {len(cold)}", max(cold), "ms")

    with tempfile.TemporaryDirectory(prefix="gl-bench-probe-") as tmp:
        cache = Path(tmp)
        full = [_timed(lambda: EnvironmentProber(TIMEOUT_S, cache).probe(interpreter, use_cache=False))
                for _ in range(3)]
        line("full check (imports torch), cold, p50 of 3 (background now)", percentile(full, 50), "ms")
        nxt = [_timed(lambda: EnvironmentProber(TIMEOUT_S, cache).metadata_first(interpreter)) for _ in range(20)]
        line("next start: cached full answer, fresh prober, p50 of 20", percentile(nxt, 50), "ms", 5.0, fmt=".2f")

    with tempfile.TemporaryDirectory(prefix="gl-bench-probe-") as tmp:
        first_ms, land_ms, env = asyncio.run(_staged(interpreter, Path(tmp)))
    line("daemon path (TorchChecks): first answer, cold", first_ms, "ms", 300.0)
    line("daemon path (TorchChecks): torch check landed, from the same start", land_ms, "ms")
    print(f"landed: torch_cuda={env.torch_cuda} torch_mps={env.torch_mps} "
          f"backends={env.distributed_backends} pending={env.torch_pending}", flush=True)


if __name__ == "__main__":
    main()
