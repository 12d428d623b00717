"""The environment a job is launched with (pure).

CPU jobs get ``CUDA_VISIBLE_DEVICES=""`` (set to the empty string, not removed: an
unset variable exposes every GPU). CUDA jobs get the granted nvidia-smi indices,
comma-separated without spaces, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA
numbers devices as nvidia-smi does (CUDA's default order is FASTEST_FIRST). Inside
the job the first granted GPU is then ``cuda:0``.

Environment masking is a convenience, not isolation: a runtime may ignore it.


(Same name as :mod:`gpulayerd.runs.launch`: the same idea, a job's launch, decided here (pure) and
carried out there.)
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulayerd.core.types import Accelerator

__all__ = ["cuda_visible_devices", "launch_env", "visible_cuda_devices"]


def cuda_visible_devices(indices: Sequence[int]) -> str:
    """Format granted device indices for ``CUDA_VISIBLE_DEVICES``: ``"0,3"``; ``""`` for none."""
    return ",".join(str(i) for i in sorted(indices))


def launch_env(
    accelerator: Accelerator,
    device_indices: Sequence[int],
    job_id: str,
    attempt: int,
    device_uuids: Sequence[str | None] = (),
) -> dict[str, str]:
    """Variables gpulayer sets for a job (merged over the job's own ``env``).

    A MIG instance is granted by its uuid: when ``device_uuids`` holds a ``MIG-...`` uuid,
    ``CUDA_VISIBLE_DEVICES`` is that uuid (one MIG instance per process), not an index.

    Args:
        accelerator: the accelerator of the placement.
        device_indices: granted nvidia-smi indices (CUDA), empty for CPU jobs.
        job_id: the job's id, exported as ``GPULAYER_JOB_ID``.
        attempt: the attempt number (1 for the first run), as ``GPULAYER_ATTEMPT``.
        device_uuids: the granted devices' uuids, in the order of ``device_indices`` (optional).

    Returns:
        A new dict of environment variables.
    """
    env = {"GPULAYER_JOB_ID": job_id, "GPULAYER_ATTEMPT": str(attempt)}
    migs = [u for u in device_uuids if u is not None and u.startswith("MIG-")]
    if accelerator is Accelerator.CUDA:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(migs) if migs else cuda_visible_devices(device_indices)
    else:
        # No GPU granted: hide every CUDA (and ROCm/HIP) device from the job.
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["HIP_VISIBLE_DEVICES"] = ""
    return env


def visible_cuda_devices(value: str | None, physical: Sequence[int]) -> list[int]:
    """Which physical device indices a ``CUDA_VISIBLE_DEVICES`` value exposes, in order.

    Unset (None) exposes every device; an empty or blank value exposes none; parsing
    stops at the first invalid token (CUDA documents "0,2,-1,1" as exposing 0 and 2),
    so "-1" exposes none. Only index tokens are understood; a UUID token (``GPU-...``)
    also ends the list here, since indices alone cannot resolve it.

    Args:
        value: the variable's value, or None when unset.
        physical: the device indices present, e.g. ``[0, 1, 2]``.
    """
    if value is None:
        return list(physical)
    out: list[int] = []
    present = set(physical)
    for token in value.split(","):
        t = token.strip()
        if not t.isdigit():
            break
        i = int(t)
        if i not in present or i in out:
            break
        out.append(i)
    return out
