"""AMD GPUs through ``rocm-smi``: detection only, never scheduled.

The support matrix marks ROCm detection-only, so devices found here always carry
``execution_supported=False`` (taken from the matrix, not assumed). The product-name
query is best effort: any failure leaves a health entry that says why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpulayerd.core.types import (
    Accelerator,
    DeviceSnapshot,
    ProbeHealth,
    ProbeStatus,
    SupportMatrix,
)
from gpulayerd.gpu.command import CommandRunner, decisive_line

__all__ = ["ROCM_SMI_SEARCH_DIRS", "RocmCard", "RocmProbe", "parse_rocm_product_names", "probe_rocm"]

SOURCE = "rocm-smi"
ROCM_SMI_SEARCH_DIRS: tuple[str, ...] = ("/opt/rocm/bin", "/usr/bin", "/usr/local/bin")
"""Directories searched for rocm-smi after PATH, in order."""

_CARD_KEY = re.compile(r"^card(\d+)$", re.IGNORECASE)
_NAME_KEYS = ("card series", "card model", "device name", "market name")
_NO_DEVICES = re.compile(r"no (?:amd )?(?:gpus?|devices)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RocmCard:
    """One card from ``rocm-smi --showproductname --json``.

    Attributes:
        index: N of the ``cardN`` key.
        name: ``Card series`` (or ``Card model``) as printed; None if absent.
        gfx_version: ``GFX Version`` (``gfx90a``); None if absent.
    """

    index: int
    name: str | None = None
    gfx_version: str | None = None


@dataclass(frozen=True, slots=True)
class RocmProbe:
    """Devices, health and notes from rocm-smi.

    Attributes:
        devices: one ``rocm`` device per card, ``execution_supported`` from the matrix.
        health: how detection went (source ``rocm-smi``).
        notes: what the operator should know, in words.
    """

    devices: tuple[DeviceSnapshot, ...]
    health: ProbeHealth
    notes: tuple[str, ...] = ()


def parse_rocm_product_names(stdout: str) -> tuple[RocmCard, ...] | None:
    """Parse ``rocm-smi --showproductname --json``; None if there is no JSON object.

    Warnings printed before the JSON are skipped; keys other than ``cardN`` are ignored.
    """
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        data, _ = json.JSONDecoder().raw_decode(stdout[start:])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    cards: list[RocmCard] = []
    for key, value in data.items():
        match = _CARD_KEY.match(str(key))
        if match is None:
            continue
        props = (
            {str(k).strip().lower(): str(v).strip() for k, v in value.items()}
            if isinstance(value, Mapping)
            else {}
        )
        name = next((props[k] for k in _NAME_KEYS if props.get(k)), None)
        cards.append(RocmCard(index=int(match.group(1)), name=name, gfx_version=props.get("gfx version")))
    return tuple(sorted(cards, key=lambda c: c.index))


def probe_rocm(
    path: str | None, runner: CommandRunner, timeout_s: float, support: SupportMatrix
) -> RocmProbe:
    """Detect AMD GPUs with rocm-smi (when found); never raises for tool failures.

    Args:
        path: the rocm-smi executable; None when it was not found.
        runner: runs the command with a hard timeout.
        timeout_s: limit for the call, in seconds.
        support: the support matrix; its ROCm row decides ``execution_supported``.
    """
    if path is None:
        return RocmProbe((), ProbeHealth(SOURCE, ProbeStatus.NOT_FOUND, "rocm-smi not found"))
    try:
        schedulable = support.row(Accelerator.ROCM).schedulable
    except KeyError:
        schedulable = False
    policy = (
        "ROCm devices are detection-only: reported with execution_supported=false, never scheduled"
        if not schedulable
        else "ROCm devices are schedulable per the support matrix"
    )
    notes = [f"rocm-smi found at {path}; {policy}"]
    result = runner([path, "--showproductname", "--json"], timeout_s)
    if result.not_found:
        return RocmProbe((), ProbeHealth(SOURCE, ProbeStatus.NOT_FOUND, "rocm-smi not found", path))
    if result.timed_out:
        message = f"rocm-smi timed out after {timeout_s:g} s; its process group was killed"
        return RocmProbe((), ProbeHealth(SOURCE, ProbeStatus.TIMEOUT, message, path), tuple(notes))
    cards = parse_rocm_product_names(result.stdout)
    if cards is None:
        lines = [ln.strip() for ln in (result.stdout + "\n" + result.stderr).splitlines() if ln.strip()]
        first = decisive_line(lines) or f"rocm-smi exited with status {result.returncode}"
        status = ProbeStatus.NO_DEVICES if any(_NO_DEVICES.search(ln) for ln in lines) else ProbeStatus.ERROR
        return RocmProbe((), ProbeHealth(SOURCE, status, first, path), tuple(notes))
    devices = tuple(
        DeviceSnapshot(
            accelerator=Accelerator.ROCM,
            index=card.index,
            uuid=f"rocm-{card.index}",
            name=card.name,
            execution_supported=schedulable,
        )
        for card in cards
    )
    if not devices:
        return RocmProbe(
            (), ProbeHealth(SOURCE, ProbeStatus.NO_DEVICES, "rocm-smi listed no card", path), tuple(notes)
        )
    message = f"{len(devices)} AMD GPU(s); " + (policy if schedulable else "detection-only, never scheduled")
    return RocmProbe(devices, ProbeHealth(SOURCE, ProbeStatus.OK, message, path), tuple(notes))
