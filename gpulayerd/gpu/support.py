"""THE support matrix of gpulayer: which accelerators jobs may run on, and how far.

Validation and matching consult this table and nothing else: the daemon and the CLI
pass :data:`SUPPORT_MATRIX` to :mod:`gpulayerd.core.matching.evaluate`. It is plain data,
stdlib-only, so the pure core can be handed it without doing I/O.

What our own tests exercise (there is no NVIDIA, Apple or AMD hardware in CI): CPU
jobs run for real (torch 2.13.0 CPU build, gloo); CUDA, MPS and ROCm detection is
tested against recorded tool outputs replayed by fake executables, and CUDA
scheduling against fake GPUs.
"""

from __future__ import annotations

from gpulayerd.core.types import (
    Accelerator,
    AcceleratorSupport,
    ExecutionLevel,
    SupportMatrix,
)

__all__ = ["SUPPORT_MATRIX"]

SUPPORT_MATRIX = SupportMatrix(
    rows=(
        AcceleratorSupport(
            accelerator=Accelerator.CPU,
            independent=ExecutionLevel.TESTED,
            distributed=ExecutionLevel.TESTED,
            distributed_backends=("gloo",),
            multi_host=True,
            notes=(
                "No GPU libraries required. Jobs run for real in this project's tests "
                "(torch CPU build); distributed jobs use gloo."
            ),
        ),
        AcceleratorSupport(
            accelerator=Accelerator.CUDA,
            independent=ExecutionLevel.IMPLEMENTED,
            distributed=ExecutionLevel.IMPLEMENTED,
            distributed_backends=("nccl", "gloo"),
            multi_host=True,
            notes=(
                "Any CUDA workload on a working NVIDIA driver. Detection is tested against "
                "recorded nvidia-smi outputs and scheduling against fake GPUs; not yet run "
                "on NVIDIA hardware by this project's CI."
            ),
        ),
        AcceleratorSupport(
            accelerator=Accelerator.MPS,
            independent=ExecutionLevel.HARDWARE_VALIDATED,
            distributed=ExecutionLevel.UNSUPPORTED,
            distributed_backends=(),
            multi_host=False,
            notes=(
                "The Apple GPU through Metal (PyTorch MPS, MLX, ...), unified memory. "
                "Distributed MPS is unsupported. This project's CI has no Apple hardware: "
                "detection is tested with recorded macOS outputs."
            ),
        ),
        AcceleratorSupport(
            accelerator=Accelerator.ROCM,
            independent=ExecutionLevel.DETECTION_ONLY,
            distributed=ExecutionLevel.UNSUPPORTED,
            distributed_backends=(),
            multi_host=False,
            notes=(
                "Detection only (rocm-smi present): devices are reported with "
                "execution_supported=false and never scheduled."
            ),
        ),
    )
)
