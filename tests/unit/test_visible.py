"""The GPUs a daemon may schedule (:mod:`gpulayerd.core.visible`): its own CUDA_VISIBLE_DEVICES and
NVIDIA_VISIBLE_DEVICES read as CUDA reads them, and the admin's exclude_gpus (bug-45's kind)."""

from __future__ import annotations

import pytest

from gpulayerd.core.types import GB, Accelerator, DeviceKind, DeviceSnapshot, DeviceState, MemoryKind
from gpulayerd.core.visible import Visibility, apply_visibility, exclusion_problem, parse_visible


def _gpu(i: int, uuid: str, kind: DeviceKind = DeviceKind.GPU, parent: str | None = None) -> DeviceSnapshot:
    return DeviceSnapshot(Accelerator.CUDA, i, uuid, "NVIDIA A100", 40 * GB, 0, MemoryKind.DEDICATED, (8, 0),
                          "550.54.15", True, True, kind=kind, parent_uuid=parent)


GPUS = (_gpu(0, "GPU-aaaa-0001"), _gpu(1, "GPU-bbbb-0002"), _gpu(2, "GPU-cccc-0003"),
        _gpu(2, "MIG-dddd-0004", DeviceKind.MIG, "GPU-cccc-0003"))


@pytest.mark.parametrize(("value", "entries"), [
    (None, None), ("", ()), ("1", ("1",)), ("0,2", ("0", "2")), (" 1 , 0 ", ("1", "0")),
    ("1,x,0", ("1",)),  # CUDA stops at the first entry it cannot read
    ("-1,0", ()), ("GPU-bbbb,0", ("GPU-bbbb", "0")), ("MIG-dddd-0004", ("MIG-dddd-0004",)),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value: str | None, entries: tuple[str, ...] | None) -> None:
    assert parse_visible(value) == entries


@pytest.mark.parametrize(("value", "entries"), [("all", None), ("", None), ("none", ()), ("void", ()),
                                                ("0,1", ("0", "1"))])
def test_nvidia_visible_devices_has_its_words(value: str, entries: tuple[str, ...] | None) -> None:
    assert parse_visible(value, container=True) == entries


def _states(vis: Visibility) -> list[tuple[str, str]]:
    devices, _ = apply_visibility(GPUS, vis)
    return [(d.state.value, d.state_reason) for d in devices]


def test_bug45_only_the_visible_gpu_is_scheduled() -> None:
    vis = Visibility.of({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert _states(vis) == [("excluded", "CUDA_VISIBLE_DEVICES"), ("ok", ""),
                            ("excluded", "CUDA_VISIBLE_DEVICES"), ("excluded", "CUDA_VISIBLE_DEVICES")]


def test_uuids_prefixes_and_mig_instances() -> None:
    assert [s for s, _ in _states(Visibility.of({"CUDA_VISIBLE_DEVICES": "GPU-cccc"}))] == [
        "excluded", "excluded", "ok", "ok"]  # a GPU comes with its MIG instances
    assert [s for s, _ in _states(Visibility.of({"CUDA_VISIBLE_DEVICES": "MIG-dddd-0004"}))] == [
        "excluded", "excluded", "excluded", "ok"]
    devices, notes = apply_visibility(GPUS, Visibility.of({"CUDA_VISIBLE_DEVICES": "GPU-zzzz,7"}))
    assert all(d.state is DeviceState.EXCLUDED for d in devices)
    assert notes == ("CUDA_VISIBLE_DEVICES entry 'GPU-zzzz' matches no device here",
                     "CUDA_VISIBLE_DEVICES entry '7' matches no device here")


def test_unset_allows_all_empty_allows_none_and_the_container_variable_narrows_too() -> None:
    assert not Visibility.of({}).restricts
    assert [s for s, _ in _states(Visibility.of({"CUDA_VISIBLE_DEVICES": ""}))] == ["excluded"] * 4
    assert [s for s, _ in _states(Visibility.of({"NVIDIA_VISIBLE_DEVICES": "all"}))] == ["ok"] * 4
    both = Visibility.of({"CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": "1"})
    assert [s for s, _ in _states(both)] == ["excluded", "ok", "excluded", "excluded"]


def test_exclude_gpus_by_index_or_uuid() -> None:
    assert _states(Visibility.of({}, [0, "GPU-cccc-0003"])) == [
        ("excluded", "config"), ("ok", ""), ("excluded", "config"), ("excluded", "config")]


@pytest.mark.parametrize("bad", [[-1], ["1"], ["gpu0"], [True], [1.5], ["GPU-"]])
def test_a_malformed_exclude_gpus_names_the_key_and_the_allowed_values(bad: list[object]) -> None:
    problem = exclusion_problem(bad)
    assert problem is not None and problem.startswith("exclude_gpus: ") and "GPU-... or MIG-..." in problem
    assert exclusion_problem([0, 3, "GPU-8f3c", "MIG-1"]) is None


@pytest.mark.parametrize("bad", [[-1, 1.5], [1.5], [-1]])
def test_the_config_key_is_checked_before_its_types_and_names_itself(bad: list[object]) -> None:
    from pydantic import ValidationError

    from gpulayerd.config import DaemonConfig

    with pytest.raises(ValidationError) as e:
        DaemonConfig(exclude_gpus=bad)  # type: ignore[arg-type]
    text = str(e.value)
    assert "is not a GPU index (an integer >= 0) or a uuid" in text and "allowed:" in text, text
