"""Every known machine's Python environments and probe health (from the capabilities the daemon serves).

One row per (machine, interpreter): the python version, frameworks, whether torch sees CUDA
or MPS, the distributed backends, and the probe's health. Below it, one line per machine
with the health of each hardware probe (nvidia-smi, rocm-smi, ...). Text from peers is
escaped before it reaches the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.reactive import reactive

from gpulayer_tui.widgets.keyed_table import Cell, KeyedTable
from gpulayerd import text as fmt
from gpulayerd.models import EnvironmentModel, PeerView

__all__ = ["EnvironmentsTable", "environment_rows", "probe_lines", "torch_sees"]

FRAMEWORK_CELLS = 30
"""Most cells of the FRAMEWORKS column."""
INTERPRETER_CELLS = 30
"""Most cells of the INTERPRETER column (cut on the left: the end of a path says most)."""


def torch_sees(env: EnvironmentModel) -> str:
    """What torch can use: "cuda", "mps", "cuda, mps", "cpu only", or "—" (no torch, or not checked)."""
    if env.torch_cuda is None and env.torch_mps is None:
        return fmt.DASH
    seen = [name for name, ok in (("cuda", env.torch_cuda), ("mps", env.torch_mps)) if ok]
    return ", ".join(seen) if seen else "cpu only"


def _left_cut(value: str, cells: int) -> str:
    if fmt.width(value) <= cells:
        return value
    return "…" + fmt.cut(value[::-1], cells - 1).removesuffix("…")[::-1]


def environment_rows(peers: Sequence[PeerView]) -> dict[str, tuple[Cell, ...]]:
    """One row per interpreter of every peer, keyed node:interpreter; a peer without any gets one row."""
    rows: dict[str, tuple[Cell, ...]] = {}
    for peer in peers:
        node = fmt.escape(peer.name)
        caps = peer.capabilities
        envs = [] if caps is None else caps.environments
        if not envs:
            rows[f"{peer.node_id}:-"] = (node, "no report yet" if caps is None else "none probed", fmt.DASH,
                                        fmt.DASH, fmt.DASH, fmt.DASH, fmt.DASH)
            continue
        for env in envs:
            frameworks = ", ".join(f"{fmt.escape(name)} {fmt.escape(f.version or 'version unknown')}"
                                   + ("" if f.valid else " (broken)") for name, f in sorted(env.frameworks.items(),
                                                                              key=lambda kv: (kv[0] != "torch", kv[0])))
            backends = fmt.DASH if env.distributed_backends is None else (
                ", ".join(fmt.escape(b) for b in env.distributed_backends) or "none")
            health: Cell = Text("ok", style="green") if env.ok else Text(
                fmt.cut(fmt.escape(env.notes[0]) if env.notes else "failed", 48), style="bold red")
            rows[f"{peer.node_id}:{env.interpreter}"] = (
                node,
                _left_cut(fmt.escape(env.interpreter), INTERPRETER_CELLS),
                fmt.escape(fmt.text(env.python_version)),
                fmt.cut(frameworks, FRAMEWORK_CELLS) or fmt.DASH,
                torch_sees(env),
                backends,
                health,
            )
    return rows


def probe_lines(peers: Sequence[PeerView]) -> Text:
    """One line per peer with a report: "NODE: nvidia-smi ok · rocm-smi not found" (a failing probe: its message)."""
    lines = []
    for peer in peers:
        if peer.capabilities is None:
            continue
        parts = []
        for h in peer.capabilities.health:
            status = h.status.value.replace("_", " ")
            bad = h.status.value not in ("ok", "not_found", "no_devices")
            word = Text(f"{fmt.escape(h.source)} {status}", style="bold red" if bad else "")
            if bad and h.message:
                word.append(f" ({fmt.cut(fmt.escape(h.message), 60)})")
            parts.append(word)
        lines.append(Text.assemble((f"{fmt.escape(peer.name)}: ", "bold"),
                                   Text(" · ").join(parts) if parts else fmt.DASH))
    return Text("\n").join(lines)


class EnvironmentsTable(KeyedTable):
    """The Python environments of every peer in :attr:`peers`, this machine first."""

    COLUMNS: ClassVar[Sequence[tuple[str, str]]] = (
        ("node", "NODE"),
        ("interpreter", "INTERPRETER"),
        ("python", "PYTHON"),
        ("frameworks", "FRAMEWORKS"),
        ("torch", "TORCH SEES"),
        ("backends", "BACKENDS"),
        ("health", "PROBE"),
    )

    peers: reactive[tuple[PeerView, ...]] = reactive((), init=False, always_update=True)
    """The peers (with capabilities) whose environments are shown."""

    def watch_peers(self, peers: tuple[PeerView, ...]) -> None:
        self.sync_rows(environment_rows(peers))
