"""Recorded nvidia-smi answers for MIG, lost GPUs and failed process lists (issue 15).

Built from NVIDIA's documented output formats (``nvidia-smi -L`` with MIG lines, ``nvidia-smi -q``
``MIG Devices`` and ``Processes`` sections, the ``Unable to determine the device handle`` line);
uuids are made up. Each scenario is a list of :func:`tests.fakes.response` answers for
:func:`tests.fakes.install_fake_tool`.
"""

from __future__ import annotations

from typing import Any

from tests.fakes import COMPUTE_APPS_ARGV, MIG_MODE_ARGV, gpu_query_argv, response, smi_header

__all__ = [
    "A100_MIG",
    "APPS_FAILED",
    "H100_MIG",
    "H100_WHOLE",
    "LAB_MIG_UUIDS",
    "LOST_AMONG_ROWS",
    "MIG_BOX",
    "MIG_UUIDS",
    "TWO_H100",
    "lab_box",
]

FULL = gpu_query_argv()
H100_MIG = "GPU-5a3c0e8e-0000-4000-8000-00000000a100"
H100_WHOLE = "GPU-7b4d1f9f-0000-4000-8000-00000000b100"
MIG_UUIDS = {
    "4g.40gb": "MIG-11111111-0000-4000-8000-000000000040",
    "2g.20gb": "MIG-22222222-0000-4000-8000-000000000020",
    "1g.10gb": "MIG-33333333-0000-4000-8000-000000000010",
}

TWO_H100 = (
    f"0, {H100_MIG}, NVIDIA H100 80GB HBM3, 81559, 61, 9.0, 550.54.15\n"
    f"1, {H100_WHOLE}, NVIDIA H100 80GB HBM3, 81559, 1, 9.0, 550.54.15\n"
)

_LIST = (
    f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {H100_MIG})\n"
    f"  MIG 4g.40gb     Device  0: (UUID: {MIG_UUIDS['4g.40gb']})\n"
    f"  MIG 2g.20gb     Device  1: (UUID: {MIG_UUIDS['2g.20gb']})\n"
    f"  MIG 1g.10gb     Device  2: (UUID: {MIG_UUIDS['1g.10gb']})\n"
    f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {H100_WHOLE})\n"
)


def _mig_block(index: int, gi: int, total_mib: int, used_mib: int) -> str:
    return (
        "        MIG Device\n"
        f"            Index                         : {index}\n"
        f"            GPU Instance ID               : {gi}\n"
        "            Compute Instance ID           : 0\n"
        "            Device Attributes\n"
        "                Shared\n"
        "                    Multiprocessor count  : 16\n"
        "            FB Memory Usage\n"
        f"                Total                     : {total_mib} MiB\n"
        "                Reserved                  : 0 MiB\n"
        f"                Used                      : {used_mib} MiB\n"
        f"                Free                      : {total_mib - used_mib} MiB\n"
        "            BAR1 Memory Usage\n"
        "                Total                     : 32767 MiB\n"
        "                Used                      : 0 MiB\n"
        "                Free                      : 32767 MiB\n"
    )


_QUERY = (
    "\n==============NVSMI LOG==============\n\n"
    "Timestamp                                 : Tue Dec  1 00:00:00 2026\n"
    "Driver Version                            : 550.54.15\n"
    "CUDA Version                              : 12.4\n\n"
    "Attached GPUs                             : 2\n"
    "GPU 00000000:19:00.0\n"
    "    FB Memory Usage\n"
    "        Total                             : 81559 MiB\n"
    "        Reserved                          : 0 MiB\n"
    "        Used                              : 61 MiB\n"
    "        Free                              : 81498 MiB\n"
    "    BAR1 Memory Usage\n"
    "        Total                             : 131072 MiB\n"
    "        Used                              : 1 MiB\n"
    "        Free                              : 131071 MiB\n"
    "    MIG Devices\n"
    + _mig_block(0, 1, 40192, 12)
    + _mig_block(1, 5, 19968, 6)
    + _mig_block(2, 9, 9856, 512)
    + "    Processes\n"
    "        GPU instance ID                   : 9\n"
    "        Compute instance ID               : 0\n"
    "        Process ID                        : 4242\n"
    "            Type                          : C\n"
    "            Name                          : python\n"
    "            Used GPU Memory               : 500 MiB\n\n"
    "GPU 00000000:3B:00.0\n"
    "    FB Memory Usage\n"
    "        Total                             : 81559 MiB\n"
    "        Reserved                          : 0 MiB\n"
    "        Used                              : 1 MiB\n"
    "        Free                              : 81558 MiB\n"
    "    Processes                             : None\n\n"
)

MIG_BOX: list[dict[str, Any]] = [
    response(FULL, TWO_H100),
    response(MIG_MODE_ARGV, f"0, {H100_MIG}, 00000000:19:00.0, Enabled, Default, P0\n"
                            f"1, {H100_WHOLE}, 00000000:3B:00.0, Disabled, Default, P0\n"),
    response(["-L"], _LIST),
    response(["-q", "-d", "MEMORY,PIDS"], _QUERY),
    response(COMPUTE_APPS_ARGV, f"{H100_MIG}, 4242, 500\n"),
]
"""An H100 in MIG mode (4g.40gb, 2g.20gb, 1g.10gb; pid 4242 on the 1g.10gb) beside an H100 without MIG."""

_G = "GPU-00000000-0000-4000-8000-0000000000"
LOST_AMONG_ROWS: list[dict[str, Any]] = [
    response(FULL,
             f"0, {_G}c0, NVIDIA A100-SXM4-40GB, 40960, 0, 8.0, 535.104.05\n"
             "Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error\n"
             f"2, {_G}c2, NVIDIA A100-SXM4-40GB, 40960, 0, 8.0, 535.104.05\n",
             exit_code=15),
    response(MIG_MODE_ARGV,
             f"0, {_G}c0, 00000000:07:00.0, Disabled, Default, P0\n"
             "Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error\n"
             f"2, {_G}c2, 00000000:C7:00.0, Disabled, Default, P0\n",
             exit_code=15),
    response(COMPUTE_APPS_ARGV, "No running processes found\n"),
]
"""Three A100s, the middle one (0000:41:00.0) unreadable: a diagnostic line between two rows, exit 15."""

APPS_FAILED: list[dict[str, Any]] = [
    response(FULL,
             f"0, {_G}d0, NVIDIA L40S, 46068, 30000, 8.9, 550.54.15\n"
             f"1, {_G}d1, NVIDIA L40S, 46068, 2048, 8.9, 550.54.15\n"
             f"2, {_G}d2, NVIDIA L40S, 46068, 3, 8.9, 550.54.15\n"),
    response(MIG_MODE_ARGV, f"0, {_G}d0, 00000000:01:00.0, [N/A], Default, P0\n"
                            f"1, {_G}d1, 00000000:02:00.0, [N/A], Default, P8\n"
                            f"2, {_G}d2, 00000000:03:00.0, [N/A], Default, P8\n"),
    response(COMPUTE_APPS_ARGV, f"{_G}d0, 111, 29000\nUnable to determine the process list: Unknown Error\n",
             exit_code=15),
]
"""Three L40S; ``--query-compute-apps`` fails after one valid row (pid 111 on GPU 0). GPU 1 uses
2048 MiB (busy by memory.used), GPU 2 uses 3 MiB (idle)."""

_L = "GPU-1abb0000-0000-4000-8000-0000000000"
A100_MIG = f"{_L}a3"
LAB_MIG_UUIDS = {
    "3g.40gb": "MIG-1abb0000-0000-4000-8000-000000003040",
    "2g.20gb": "MIG-1abb0000-0000-4000-8000-000000002020",
    "1g.10gb": "MIG-1abb0000-0000-4000-8000-000000001010",
}
_LAB_LOST = "Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error\n"
_LAB_ROWS = (
    f"0, {_L}a0, NVIDIA RTX A6000, 49140, 1, 8.6, 550.54.15\n"
    f"1, {_L}a1, NVIDIA RTX A6000, 49140, 1, 8.6, 550.54.15\n"
    f"2, {_L}a2, NVIDIA GeForce RTX 4090, 24564, 9000, 8.9, 550.54.15\n"
    + _LAB_LOST
    + f"4, {A100_MIG}, NVIDIA A100 80GB PCIe, 81920, 1, 8.0, 550.54.15\n"
)
_LAB_QUERY = (
    "\n==============NVSMI LOG==============\n\n"
    "Driver Version                            : 550.54.15\n"
    "Attached GPUs                             : 5\n"
    "GPU 00000000:01:00.0\n"
    "    Processes                             : None\n\n"
    "GPU 00000000:21:00.0\n"
    "    Processes                             : None\n\n"
    "GPU 00000000:31:00.0\n"
    "    Processes\n"
    "        Process ID                        : 999\n"
    "            Type                          : C\n"
    "            Name                          : blender\n"
    "            Used GPU Memory               : 8900 MiB\n\n"
    "GPU 00000000:81:00.0\n"
    "    FB Memory Usage\n"
    "        Total                             : 81920 MiB\n"
    "        Reserved                          : 0 MiB\n"
    "        Used                              : 1 MiB\n"
    "        Free                              : 81919 MiB\n"
    "    MIG Devices\n"
    + _mig_block(0, 2, 40192, 0)
    + _mig_block(1, 3, 19968, 0)
    + _mig_block(2, 9, 9856, 0)
    + "    Processes                             : None\n\n"
)


def lab_box(sample_argv: list[str]) -> list[dict[str, Any]]:
    """A lab workstation as people report theirs: two RTX A6000, an RTX 4090 used by a foreign
    process (pid 999, ``blender``), a GPU lost at 0000:41:00.0 (a diagnostic line where its row
    would be, exit 15) and an A100 80GB PCIe in MIG mode (3g.40gb, 2g.20gb, 1g.10gb); with the
    live metrics sampler's answer for ``sample_argv`` (:func:`gpulayerd.gpu.metrics.metrics_argv`'s
    arguments: one line per readable GPU every 200 ms, the diagnostic line among them)."""
    sample = (f"0, {_L}a0, 12, 41, 70.5, 300.0, 1, 49140\n"
              f"1, {_L}a1, 0, 35, 22.1, 300.0, 1, 49140\n"
              f"2, {_L}a2, 97, 77, 410.0, 450.0, 9000, 24564\n"
              + _LAB_LOST
              + f"4, {A100_MIG}, 0, 33, 40.0, 300.0, 1, 81920\n")
    return [
        response(FULL, _LAB_ROWS, exit_code=15),
        response(MIG_MODE_ARGV, f"0, {_L}a0, 00000000:01:00.0, Disabled, Default, P8\n"
                                f"1, {_L}a1, 00000000:21:00.0, Disabled, Default, P8\n"
                                f"2, {_L}a2, 00000000:31:00.0, Disabled, Default, P2\n"
                                + _LAB_LOST
                                + f"4, {A100_MIG}, 00000000:81:00.0, Enabled, Default, P0\n", exit_code=15),
        response(["-L"], f"GPU 0: NVIDIA RTX A6000 (UUID: {_L}a0)\n"
                         f"GPU 1: NVIDIA RTX A6000 (UUID: {_L}a1)\n"
                         f"GPU 2: NVIDIA GeForce RTX 4090 (UUID: {_L}a2)\n"
                         + _LAB_LOST
                         + f"GPU 4: NVIDIA A100 80GB PCIe (UUID: {A100_MIG})\n"
                         + "".join(f"  MIG {p:<11} Device  {i}: (UUID: {u})\n"
                                   for i, (p, u) in enumerate(LAB_MIG_UUIDS.items()))),
        response(["-q", "-d", "MEMORY,PIDS"], _LAB_QUERY),
        response(COMPUTE_APPS_ARGV, f"{_L}a2, 999, 8900\n"),
        {**response(sample_argv, sample), "loop_stdout": [sample], "loop_ms": 200},
        smi_header(),
    ]
