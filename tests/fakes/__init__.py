"""Install fake command-line tools (tests/fakes/bin) with a recorded scenario.

A test copies the fake into its own ``tmp_path`` directory under the tool's name,
writes the scenario beside it, and puts that directory on the search path through
``DiscoveryConfig.path_env``; nothing global changes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMPUTE_APPS_ARGV",
    "FAKE_BIN",
    "MIG_MODE_ARGV",
    "FakeTool",
    "gpu_query_argv",
    "insert_memory_used",
    "install_fake_tool",
    "response",
    "smi_header",
]

FAKE_BIN = Path(__file__).resolve().parent / "bin"
FORMAT = "--format=csv,noheader,nounits"
COMPUTE_APPS_ARGV = ["--query-compute-apps=gpu_uuid,pid,used_memory", FORMAT]
MIG_MODE_ARGV = ["--query-gpu=index,uuid,pci.bus_id,mig.mode.current,compute_mode,pstate", FORMAT]
"""The MIG-mode query the daemon runs after ``--query-gpu`` (gpulayerd.gpu.nvidia.followup)."""


def gpu_query_argv(compute_cap: bool = True, memory_used: bool = True) -> list[str]:
    """The daemon's ``--query-gpu`` arguments, optionally without a rejected field."""
    fields = ["index", "uuid", "name", "memory.total"]
    fields += ["memory.used"] if memory_used else []
    fields += ["compute_cap"] if compute_cap else []
    fields += ["driver_version"]
    return [f"--query-gpu={','.join(fields)}", FORMAT]


def smi_header(driver: str = "550.54.15", cuda: str = "12.4") -> dict[str, Any]:
    """Plain ``nvidia-smi``'s answer (no arguments): its banner with ``CUDA Version:``, which the
    probe reads once per binary and driver (gpulayerd.gpu.nvidia.query.query_driver_cuda)."""
    banner = (
        "Tue Dec  1 00:00:00 2026       \n"
        "+-----------------------------------------------------------------------------------------+\n"
        f"| NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {cuda:<9}|\n"
        "|-----------------------------------------+------------------------+----------------------+\n"
    )
    return response([], banner)


def response(
    argv: Sequence[str],
    stdout: str = "",
    stderr: str = "",
    exit_code: int | None = 0,
    sleep_s: float = 0.0,
    spawn_sleeper_s: float = 0.0,
) -> dict[str, Any]:
    """One recorded answer: what the tool prints and returns for exactly ``argv``."""
    return {
        "argv": list(argv),
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": exit_code,
        "sleep_s": sleep_s,
        "spawn_sleeper_s": spawn_sleeper_s,
    }


@dataclass(frozen=True)
class FakeTool:
    """An installed fake tool and the log of its calls."""

    path: Path

    def calls(self) -> list[dict[str, Any]]:
        """One record per call so far: argv, pid, pgid, sid, sleeper_pid, LC_ALL, LANG."""
        log = self.path.with_name(self.path.name + ".calls.jsonl")
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]

    def argvs(self) -> list[list[str]]:
        """The arguments of each call so far, in order."""
        return [c["argv"] for c in self.calls()]


def install_fake_tool(
    bin_dir: Path,
    name: str,
    responses: Sequence[Mapping[str, Any]],
    default: Mapping[str, Any] | None = None,
) -> FakeTool:
    """Copy the fake into ``bin_dir`` as ``name`` and give it these answers.

    The copy runs under this interpreter (its ``#!`` line is rewritten), so no
    ``python3`` on PATH is needed and start-up stays fast.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    source = (FAKE_BIN / "nvidia-smi").read_text(encoding="utf-8")
    body = source.split("\n", 1)[1]
    target = bin_dir / name
    target.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    target.chmod(0o755)
    scenario: dict[str, Any] = {"responses": [dict(r) for r in responses]}
    if default is not None:
        scenario["default"] = dict(default)
    target.with_name(name + ".json").write_text(json.dumps(scenario), encoding="utf-8")
    return FakeTool(target)


def insert_memory_used(stdout: str, recorded_fields: Sequence[str], memory_used: str = "0") -> str:
    """Convert recorded CSV rows to the daemon's column set by adding ``memory.used``.

    The recorded cases asked nvidia-smi for fields without ``memory.used``; the daemon
    asks for it right after ``memory.total``. Lines with the recorded field count get
    ``memory_used`` inserted there; any other line (an error message) is kept verbatim.
    """
    position = list(recorded_fields).index("memory.total") + 1
    out = []
    for line in stdout.splitlines(keepends=True):
        parts = line.rstrip("\n").split(", ")
        if line.strip() and len(parts) == len(recorded_fields):
            parts.insert(position, memory_used)
            out.append(", ".join(parts) + ("\n" if line.endswith("\n") else ""))
        else:
            out.append(line)
    return "".join(out)
