"""Host limits of the recorded cases: CPU slots from affinity and cgroup quota (bug-35), the
interfaces advertised over mDNS (bug-37), torchrun's address (bug-36, the argv half).

The cgroup trees are crafted in a temporary directory (v1 and v2 layouts), so the quota
arithmetic is checked whatever cgroups the test machine has.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.gpu.cpus import cgroup_cpu_limit, parse_cpu_max, parse_proc_cgroup, usable_cpus
from gpulayerd.net.interfaces import is_virtual_interface, lan_addresses

CASES = Path(__file__).resolve().parents[1] / "data" / "cases"


def case(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text())
    return data


# ------------------------------------------------------------------------------ CPU slots (bug-35)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_tree(root: Path, leaf_max: str, parent_max: str) -> str:
    """A cgroup v2 tree: /system.slice (parent) / gpulayerd.service (leaf)."""
    _write(root, "cgroup.controllers", "cpuset cpu io memory pids\n")
    _write(root, "system.slice/cpu.max", parent_max)
    _write(root, "system.slice/gpulayerd.service/cpu.max", leaf_max)
    return "0::/system.slice/gpulayerd.service\n"


def v1_tree(root: Path, leaf: tuple[int, int], parent: tuple[int, int]) -> str:
    """A cgroup v1 tree with the cpu controller mounted at cpu,cpuacct: /docker (parent) / abc (leaf)."""
    for rel, (quota, period) in (("docker", parent), ("docker/abc", leaf)):
        _write(root, f"cpu,cpuacct/{rel}/cpu.cfs_quota_us", f"{quota}\n")
        _write(root, f"cpu,cpuacct/{rel}/cpu.cfs_period_us", f"{period}\n")
    _write(root, "memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")
    return "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("max 100000\n", None), ("150000 100000\n", 1.5), ("200000 100000", 2.0), ("50000", 0.5), ("x y", None)],
)
def test_parse_cpu_max(text: str, cpus: float | None) -> None:
    assert parse_cpu_max(text) == cpus


def test_parse_proc_cgroup_hybrid() -> None:
    unified, v1 = parse_proc_cgroup("0::/user.slice\n4:cpu,cpuacct:/a/b\n3:cpuset:/\n")
    assert unified == "/user.slice"
    assert v1["cpu"] == "/a/b" and v1["cpuacct"] == "/a/b" and v1["cpu,cpuacct"] == "/a/b"


def test_cgroup_v2_quota_is_the_minimum_over_ancestors(tmp_path: Path) -> None:
    # the service may use 3.5 CPUs, but its parent slice only 2.5: 2.5 CPUs, so 2 slots
    proc = v2_tree(tmp_path, "350000 100000\n", "250000 100000\n")
    assert cgroup_cpu_limit(tmp_path, proc) == 2.5
    assert usable_cpus(affinity=16, root=tmp_path, proc_cgroup=proc) == 2
    # the leaf has the tighter quota; an unlimited parent changes nothing
    proc = v2_tree(tmp_path, "120000 100000\n", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path, proc) == 1.2
    assert usable_cpus(affinity=16, root=tmp_path, proc_cgroup=proc) == 1


def test_cgroup_v2_without_quota_leaves_affinity(tmp_path: Path) -> None:
    proc = v2_tree(tmp_path, "max 100000\n", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path, proc) is None
    assert usable_cpus(affinity=6, root=tmp_path, proc_cgroup=proc) == 6


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    proc = v1_tree(tmp_path, leaf=(300000, 100000), parent=(-1, 100000))
    assert cgroup_cpu_limit(tmp_path, proc) == 3.0
    assert usable_cpus(affinity=8, root=tmp_path, proc_cgroup=proc) == 3
    proc = v1_tree(tmp_path, leaf=(300000, 100000), parent=(50000, 100000))
    assert cgroup_cpu_limit(tmp_path, proc) == 0.5
    assert usable_cpus(affinity=8, root=tmp_path, proc_cgroup=proc) == 1  # at least one slot


def test_cgroup_v1_container_view(tmp_path: Path) -> None:
    """Inside a container the host's path (/docker/abc) does not exist under the mount: the
    container's own cgroup is the mount point itself."""
    _write(tmp_path, "cpu/cpu.cfs_quota_us", "200000\n")
    _write(tmp_path, "cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path, "3:cpu:/docker/abc\n") == 2.0


def test_affinity_is_the_limit_when_smaller_than_quota(tmp_path: Path) -> None:
    proc = v2_tree(tmp_path, "800000 100000\n", "max 100000\n")
    assert usable_cpus(affinity=1, root=tmp_path, proc_cgroup=proc) == 1


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path, "0::/\n") is None
    assert usable_cpus(affinity=None, quota=None, read_system=False) == 1
    assert usable_cpus(affinity=4, quota=2.99, read_system=False) == 2


# ------------------------------------------------------------------------------ interfaces (bug-37)


@dataclass(frozen=True)
class _Addr:
    family: int
    address: str
    ptp: str | None = None


@dataclass(frozen=True)
class _Stats:
    isup: bool = True
    flags: str = "up,broadcast,running,multicast"


def test_bug_37_only_the_lan_interface_is_advertised() -> None:
    c = case("bug-37")
    addrs = {name: [_Addr(socket.AF_INET, ip)] for name, ip in c["input"]["psutil_net_if_addrs"].items()}
    stats = {name: _Stats() for name in addrs}
    got = lan_addresses(None, net_if_addrs=addrs, net_if_stats=stats)
    assert [list(pair) for pair in got] == c["expected"]["advertised"]
    # unless --interface names one of them
    assert lan_addresses("tun0", net_if_addrs=addrs, net_if_stats=stats) == [("tun0", "10.8.0.1")]


def test_point_to_point_interfaces_are_skipped_whatever_their_name() -> None:
    addrs = {
        "eth0": [_Addr(socket.AF_INET, "10.11.12.108")],
        "corpvpn": [_Addr(socket.AF_INET, "10.9.0.6")],  # flag pointopoint
        "myvpn1": [_Addr(socket.AF_INET, "10.10.0.2", ptp="10.10.0.1")],  # a point-to-point peer
    }
    stats = {"eth0": _Stats(), "corpvpn": _Stats(flags="up,pointopoint,running,noarp"), "myvpn1": _Stats()}
    assert lan_addresses(None, net_if_addrs=addrs, net_if_stats=stats) == [("eth0", "10.11.12.108")]


@pytest.mark.parametrize("name", ["eth0", "enp5s0", "wlp2s0", "en0", "br0", "bond0"])
def test_lan_interfaces_are_kept(name: str) -> None:
    """A veth-kind eth0 (a namespace's end, as on the test LAN) or a host bridge br0 is a LAN."""
    assert not is_virtual_interface(name, "up,broadcast,running,multicast")


@pytest.mark.parametrize("name", ["tun0", "tap1", "wg0", "utun3", "vmnet8", "vboxnet0", "lxdbr0", "podman0",
                                  "ham0", "zt7nnig26", "tailscale0", "docker0", "br-84e279891be5", "bridge100"])
def test_virtual_interfaces_are_skipped(name: str) -> None:
    assert is_virtual_interface(name)


# ------------------------------------------------------------------------------ mDNS `free`


def test_mdns_free_counts_free_gpus_not_gpu_jobs() -> None:
    """A 2-GPU job on a 4-GPU machine leaves 2 free (not 3: one job, two GPUs)."""
    from gpulayerd.app.common.ledger import Ledger
    from gpulayerd.app.worker.machine import Machine
    from gpulayerd.core.types import Accelerator, DeviceSnapshot
    from gpulayerd.models import Capabilities, DeviceModel, JobSpec

    gpus = [DeviceModel.from_core(DeviceSnapshot(Accelerator.CUDA, i, f"GPU-{i}", execution_supported=True))
            for i in range(4)]
    machine = Machine.__new__(Machine)  # only the two fields gpu_counts reads
    machine._caps = Capabilities(node_id="n", devices=gpus)
    machine._ledger = Ledger()
    assert machine.gpu_counts() == (4, 4)
    spec = JobSpec.model_validate({"command": ["python", "t.py"], "user": "ann",
                                   "requirements": {"accelerator": "cuda", "gpu_count": 2}})
    machine._ledger.starting(("job-1", 1), spec)
    assert machine.gpu_counts() == (4, 2)
    machine._ledger.started(("job-1", 1), None, spec, None, 30.0)  # type: ignore[arg-type]
    assert machine.gpu_counts() == (4, 2)


def test_mdns_counts_neither_lost_gpus_nor_mig_parents() -> None:
    """A lost GPU is never granted and a GPU in MIG mode is granted only as its instances: the
    TXT record counts what can be granted (here the MIG instance and the healthy whole GPU)."""
    from gpulayerd.app.common.ledger import Ledger
    from gpulayerd.app.worker.machine import Machine
    from gpulayerd.core.types import Accelerator, DeviceKind, DeviceSnapshot, DeviceState
    from gpulayerd.models import Capabilities, DeviceModel

    def dev(i: int, **kw: object) -> DeviceModel:
        return DeviceModel.from_core(DeviceSnapshot(Accelerator.CUDA, i, f"GPU-{i}", execution_supported=True,
                                                    **kw))  # type: ignore[arg-type]

    devices = [dev(0, mig_enabled=True), dev(1000, kind=DeviceKind.MIG, parent_uuid="GPU-0"),
               dev(1), dev(2, state=DeviceState.LOST, state_reason="Unable to determine the device handle")]
    machine = Machine.__new__(Machine)
    machine._caps = Capabilities(node_id="n", devices=devices)
    machine._ledger = Ledger()
    assert machine.gpu_counts() == (2, 2)
