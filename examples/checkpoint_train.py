"""A training loop that saves a checkpoint on its time limit's warning signal and resumes from it.

Run under gpulayer with a time limit and retries, e.g.::

    gpulayer submit --time 2h --signal USR1@300 --retries 3 --retry-on timeout \
        -- python examples/checkpoint_train.py --checkpoint ckpt.json --steps 100000

300 s before the limit the watchdog sends SIGUSR1: the handler only sets a flag, and the loop
saves its checkpoint at the end of the step it is in (atomically: a temporary file renamed over
the old one) and goes on. At the limit the job is stopped (SIGTERM, grace, SIGKILL) and ends
``timeout``; its retry starts from the checkpoint. SIGTERM saves a checkpoint too (a cancel, or
the default warning, ``TERM@60``) and then exits 143. Only the standard library is used, so the
"model" is a toy: a parameter fitted by gradient descent, one step every ``--step-s`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

_pending: list[int] = []  # signals received, handled at the end of the current step


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _pending.append(signum)


def _save(path: Path, step: int, w: float) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, "w": w}), encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoint.json"), help="the checkpoint file")
    p.add_argument("--steps", type=int, default=1000, help="steps in all (default 1000)")
    p.add_argument("--step-s", type=float, default=0.1, help="seconds per step (default 0.1)")
    args = p.parse_args(argv)
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, _on_signal)

    step, w = 0, 0.0
    if args.checkpoint.exists():
        saved = json.loads(args.checkpoint.read_text(encoding="utf-8"))
        step, w = int(saved["step"]), float(saved["w"])
        print(f"resumed from step {step} (w={w:.4f})", flush=True)
    attempt = os.environ.get("GPULAYER_ATTEMPT", "?")
    print(f"attempt {attempt}: training from step {step} to {args.steps}", flush=True)
    while step < args.steps:
        w -= 0.01 * 2 * (w - 3.0)  # gradient of (w - 3)^2
        step += 1
        time.sleep(args.step_s)
        while _pending:
            signum = _pending.pop(0)
            print(f"got {signal.Signals(signum).name} at step {step}", flush=True)
            _save(args.checkpoint, step, w)
            print(f"checkpoint saved at step {step}", flush=True)
            if signum == signal.SIGTERM:
                return 128 + signum
    _save(args.checkpoint, step, w)
    print(f"done: {step} steps, w={w:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
