"""Cost of the hardware re-probe done before a grant (issue 15): ``python bench/hardware.py``.

Runs :func:`gpulayerd.gpu.discovery.discover_host` against the fake nvidia-smi (tests/fakes) for a
plain two-GPU box and for the MIG box (two more nvidia-smi calls), and the pure MIG parsing alone.
The fake is a Python script, so each call costs an interpreter start (~30-60 ms): a real
nvidia-smi call is of the same order. Prints figures; asserts nothing.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from bench.bench_report import line, percentile
from gpulayerd.gpu.discovery import DiscoveryConfig, discover_host
from gpulayerd.gpu.nvidia.mig import parse_list_gpus, parse_query
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.fakes import install_fake_tool
from tests.fakes.nvidia_recorded import APPS_FAILED, MIG_BOX


def probe_ms(answers: list[dict[str, object]], runs: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        install_fake_tool(Path(tmp) / "bin", "nvidia-smi", answers)
        config = DiscoveryConfig(path_env=str(Path(tmp) / "bin"), extra_search_dirs=(), rocm_search_dirs=(),
                                 system="Linux", machine="x86_64")
        out = []
        for _ in range(runs):
            t = time.perf_counter()
            discover_host(config, SUPPORT_MATRIX)
            out.append((time.perf_counter() - t) * 1000)
        return out


def main() -> None:
    plain = probe_ms(APPS_FAILED, 15)
    line("re-probe, 3 GPUs (3 nvidia-smi calls), p50", percentile(plain, 50), "ms", 1000)
    mig = probe_ms(MIG_BOX, 15)
    line("re-probe, MIG box (5 nvidia-smi calls), p50", percentile(mig, 50), "ms", 1000)
    text_q, text_l = MIG_BOX[3]["stdout"], MIG_BOX[2]["stdout"]
    assert isinstance(text_q, str) and isinstance(text_l, str)
    t = time.perf_counter()
    for _ in range(1000):
        parse_query(text_q)
        parse_list_gpus(text_l)
    line("parse -q and -L of the MIG box", (time.perf_counter() - t) * 1000, "us per parse", 1000)


if __name__ == "__main__":
    main()
