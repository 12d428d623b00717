"""Which GPUs the daemon may schedule: its own ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``
and the admin's ``exclude_gpus``, read as CUDA reads them (pure: the environment comes in as values).

An admin who starts the service with ``CUDA_VISIBLE_DEVICES=1`` keeps GPU 0 (a display card, say)
out: nvidia-smi ignores the variable and lists every GPU, so the daemon applies it itself. CUDA's
reading: a comma-separated list of device indices, ``GPU-`` uuids (a unique prefix is enough) and
``MIG-`` uuids; parsing stops at the first entry that is none of these (the rest is ignored);
unset means every device, empty means none. Indices count in PCI bus order (nvidia-smi's
``index``), which is CUDA's when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the daemon sets it for every job).
``NVIDIA_VISIBLE_DEVICES`` (the container runtime's) takes ``all``, ``none``/``void`` or the same list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpulayerd.core.types import DeviceKind, DeviceSnapshot, DeviceState

__all__ = ["VISIBLE_VARIABLES", "Visibility", "apply_visibility", "exclusion_problem", "parse_visible"]

VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
"""The variables of the daemon's environment that restrict the GPUs it schedules, in this order."""


def _is_entry(token: str) -> bool:
    return token.isdigit() or token.startswith(("GPU-", "MIG-"))


def parse_visible(value: str | None, *, container: bool = False) -> tuple[str, ...] | None:
    """The entries of a visibility variable as CUDA reads them: None when it does not restrict
    (unset, or ``all`` for the container's variable); ``()`` when it allows no device.

    Args:
        value: the variable's value (None: unset).
        container: ``NVIDIA_VISIBLE_DEVICES`` (``all``, ``none`` and ``void`` have their meaning).
    """
    if value is None:
        return None
    text = value.strip()
    if container:
        if text in ("", "all"):
            return None
        if text in ("none", "void"):
            return ()
    out: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not _is_entry(token):
            break  # CUDA stops at the first entry it cannot read
        out.append(token)
    return tuple(out)


def exclusion_problem(entries: Sequence[object]) -> str | None:
    """Why ``exclude_gpus`` (the config key) is malformed, or None: each entry is a GPU index
    (an integer >= 0) or a uuid (``GPU-...`` or ``MIG-...``)."""
    for e in entries:
        if isinstance(e, bool) or not ((isinstance(e, int) and e >= 0)
                                       or (isinstance(e, str) and e.startswith(("GPU-", "MIG-")) and len(e) > 4)):
            return (f"exclude_gpus: {e!r} is not a GPU index (an integer >= 0) or a uuid (GPU-... or MIG-...); "
                    "allowed: a list of those, e.g. [0, \"GPU-8f3c...\"]")
    return None


@dataclass(frozen=True, slots=True)
class Visibility:
    """What restricts the GPUs this daemon schedules.

    Attributes:
        visible: per variable name, its entries (:func:`parse_visible`; a variable that does not
            restrict is left out).
        excluded: the ``exclude_gpus`` entries (indices as ``str``).
    """

    visible: Mapping[str, tuple[str, ...]]
    excluded: tuple[str, ...] = ()

    @classmethod
    def of(cls, environ: Mapping[str, str], exclude_gpus: Sequence[int | str] = ()) -> Visibility:
        """The visibility of a daemon started with ``environ`` and configured with ``exclude_gpus``."""
        visible = {}
        for name in VISIBLE_VARIABLES:
            entries = parse_visible(environ.get(name), container=name == "NVIDIA_VISIBLE_DEVICES")
            if entries is not None:
                visible[name] = entries
        return cls(visible, tuple(str(e) for e in exclude_gpus))

    @property
    def restricts(self) -> bool:
        """Whether anything restricts the GPUs (else every device is schedulable)."""
        return bool(self.visible) or bool(self.excluded)


def _matches(entry: str, d: DeviceSnapshot) -> bool:
    if entry.isdigit():
        return d.kind is DeviceKind.GPU and d.index == int(entry)
    return bool(d.uuid) and (d.uuid == entry or (d.uuid or "").startswith(entry))


def _with_instances(devices: Sequence[DeviceSnapshot], i: int) -> list[int]:
    """Device ``i`` and, for a whole GPU, its MIG instances (by position in ``devices``)."""
    d = devices[i]
    if d.kind is not DeviceKind.GPU or not d.uuid:
        return [i]
    return [i, *(k for k, m in enumerate(devices) if m.parent_uuid == d.uuid)]


def apply_visibility(devices: Sequence[DeviceSnapshot], vis: Visibility
                     ) -> tuple[tuple[DeviceSnapshot, ...], tuple[str, ...]]:
    """``devices`` with those this daemon may not schedule marked excluded (state ``excluded``,
    the reason: the variable or ``config``), and notes naming the entries that match no device.

    A GPU named by a variable is visible with its MIG instances; a MIG instance named alone is
    visible, its GPU and the other instances not. Only CUDA devices are restricted.
    """
    out = list(devices)
    notes: list[str] = []
    for name, entries in vis.visible.items():
        allowed: set[int] = set()
        for entry in entries:
            hit = [i for i, d in enumerate(devices) if _matches(entry, d)]
            if not entry.isdigit() and len(hit) > 1:
                hit = [i for i in hit if devices[i].uuid == entry]  # a prefix must name one GPU
            if not hit:
                notes.append(f"{name} entry {entry!r} matches no device here")
            for i in hit:
                allowed.update(_with_instances(devices, i))  # a GPU comes with its MIG instances
        for i, d in enumerate(out):
            if d.accelerator.value == "cuda" and i not in allowed and d.state is DeviceState.OK:
                out[i] = replace(d, state=DeviceState.EXCLUDED, state_reason=name)
    for entry in vis.excluded:
        hit = [i for i, d in enumerate(devices) if _matches(entry, d)]
        if not hit:
            notes.append(f"exclude_gpus entry {entry!r} matches no device here")
        for i in hit:
            for k in _with_instances(devices, i):
                if out[k].state is DeviceState.OK:
                    out[k] = replace(out[k], state=DeviceState.EXCLUDED, state_reason="config")
    return tuple(out), tuple(notes)
