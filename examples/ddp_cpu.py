"""A small real training run on the CPU with torch.distributed (gloo).

Each process trains the same tiny regression model on its own shard of a synthetic
data set; DistributedDataParallel all-reduces the gradients over gloo, so every rank
ends with identical parameters. Prints the loss per step and a final parameter
checksum (equal on every rank when the all-reduce worked).

Run it through gpulayer (examples/jobs/ddp_cpu.toml), or by hand:
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/ddp_cpu.py
"""

from __future__ import annotations

import argparse
import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def say(line: str) -> None:
    """Print one whole line with a single write: the ranks may share one log file."""
    os.write(1, (line + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    # gpulayer hands an explicit collective timeout (GPULAYER_DIST_TIMEOUT_S) instead of
    # torch's 30-minute default, so a lost peer fails the job in minutes, not half an hour.
    timeout_s = float(os.environ.get("GPULAYER_DIST_TIMEOUT_S", "300"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    # The same synthetic problem on every rank (fixed seed); each rank takes its shard.
    gen = torch.Generator().manual_seed(1234)
    n, d = 512, 16
    x = torch.randn(n, d, generator=gen)
    true_w = torch.randn(d, 1, generator=gen)
    y = x @ true_w + 0.01 * torch.randn(n, 1, generator=gen)
    xs, ys = x[rank::world], y[rank::world]

    torch.manual_seed(0)  # identical initial weights on every rank
    model = DistributedDataParallel(nn.Sequential(nn.Linear(d, 32), nn.Tanh(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    say(f"rank {rank}/{world}: {len(xs)} samples, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()  # gradients are all-reduced (averaged) across ranks here
        opt.step()
        if step == 1 or step % 5 == 0 or step == args.steps:
            say(f"rank {rank} step {step:3d} loss {loss.item():.6f}")

    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in model.parameters())
    say(f"rank {rank} final parameter checksum {checksum:.10f}")
    dist.barrier()
    # DDP keeps a reference to the process group: drop it (and the optimizer's to the model)
    # before destroying the group, or gloo's worker threads outlive it into interpreter exit,
    # where destroying their work aborts the process ("terminate called without an active
    # exception", exit -6) after a run that succeeded.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
