"""Which distribution provides a framework, unknown versions, extras, PEP 440 edges.

Crafted ``site-packages`` in temporary directories: two distributions that both install
``onnxruntime/`` (only RECORD hashes tell whose files are on disk), a leftover
``*.dist-info`` without METADATA (bug-31), NGC pre-release versions (bug-28); the PEP 440
pairs of bug-30; extras in TOML and in ``--framework``, refused alike.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.cli import build_parser
from gpulayerd.cli.exits import UsageError
from gpulayerd.cli.jobs import _spec_from_flags
from gpulayerd.core.matching.evaluate import match
from gpulayerd.core.matching.versions import VersionCheck, check_version
from gpulayerd.core.types import EnvironmentSnapshot, FrameworkVersion, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Placement, RejectionCode
from gpulayerd.gpu.dist_files import mark_files_on_disk
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.probe import read_frameworks
from gpulayerd.gpu.probe_report import snapshot_from_report
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import EnvironmentModel, JobSpec, SpecError, job_spec_from_mapping
from tests.fakes.envs import make_env

CASES = Path(__file__).resolve().parents[2] / "data" / "cases"


def case(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text())
    return data


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install(site: Path, name: str, version: str, files: dict[str, bytes], *, write_files: bool = True) -> None:
    """A wheel-installed distribution: METADATA, RECORD with hashes, and (optionally) its files."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = [f"{rel},{record_hash(data)},{len(data)}" for rel, data in files.items()]
    rows += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    if write_files:
        for rel, data in files.items():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(data)


def snapshot_of(site: Path) -> EnvironmentSnapshot:
    """What the environment probe reports for ``site`` (metadata part, run in this process)."""
    notes: list[str] = []
    paths: dict[str, dict[str, str]] = {}
    report: dict[str, Any] = {"probe_version": 1, "python_version": "3.11.9", "torch_stage": "skipped",
                              "frameworks": read_frameworks(notes, [str(site)], paths), "notes": notes,
                              "dist_info_paths": paths}
    json.loads(json.dumps(report))  # the report is plain JSON (null, never "None")
    mark_files_on_disk(report)
    return snapshot_from_report("/x/python", report)


CPU_BUILD = {"onnxruntime/__init__.py": b"__version__ = '1.19.2'\n", "onnxruntime/LICENSE": b"MIT\n",
             "onnxruntime/capi/build.py": b"cuda = None\n"}
GPU_BUILD = {"onnxruntime/__init__.py": b"__version__ = '1.20.1'\n", "onnxruntime/LICENSE": b"MIT\n",
             "onnxruntime/capi/build.py": b"cuda = '12.2'\n",
             "onnxruntime/capi/libonnxruntime_providers_cuda.so": b"\x7fELF" + b"\0" * 64}


@pytest.mark.parametrize("last", ["onnxruntime-gpu", "onnxruntime"])
def test_two_distributions_the_files_on_disk_decide(tmp_path: Path, last: str) -> None:
    """Both list onnxruntime/ in RECORD; the one installed last owns the files on disk."""
    site = tmp_path / "site-packages"
    order = [("onnxruntime", "1.19.2", CPU_BUILD), ("onnxruntime-gpu", "1.20.1", GPU_BUILD)]
    if last == "onnxruntime":
        order.reverse()
    for name, version, files in order:
        install(site, name, version, files)
    snap = snapshot_of(site)
    fw = snap.frameworks["onnxruntime"]
    expected = dict((n, v) for n, v, _ in order)
    other = next(n for n in expected if n != last)
    assert (fw.distribution, fw.version) == (last, expected[last])
    assert fw.others == (f"{other} {expected[other]}",)
    assert fw.note == "RECORD hashes match the files on disk"
    (note,) = [n for n in snap.notes if n.startswith("onnxruntime:")]
    assert "conflicting distributions installed" in note and f"the files on disk are {last}'s" in note
    # devices --json: listed and flagged
    model = EnvironmentModel.from_core(snap).frameworks["onnxruntime"]
    assert (model.distribution, model.conflict, model.others) == (last, True, [f"{other} {expected[other]}"])


def test_record_paths_outside_the_package_and_special_files_are_never_read(tmp_path: Path) -> None:
    """A crafted RECORD cannot make the daemon hash files outside the package (``..``) or read a
    device or a FIFO that never ends: only regular files inside site-packages/PACKAGE count."""
    from gpulayerd.gpu.dist_files import read_record

    site = tmp_path / "site-packages"
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:x:0:0\n")
    install(site, "onnxruntime", "1.19.2", {"onnxruntime/LICENSE": b"MIT\n"})
    install(site, "onnxruntime-gpu", "1.20.1", {"onnxruntime/LICENSE": b"MIT\n"})
    gpu_info = next(site.glob("onnxruntime_gpu-*.dist-info"))
    with (gpu_info / "RECORD").open("a") as fh:
        fh.write(f"onnxruntime/../../secret,{record_hash(secret.read_bytes())},11\n")
        fh.write("onnxruntime/zero,sha256=AAAA,1\n")
        fh.write("onnxruntime/fifo,sha256=AAAA,1\n")
    (site / "onnxruntime" / "zero").symlink_to("/dev/zero")
    os.mkfifo(site / "onnxruntime" / "fifo")
    record = read_record(gpu_info, "onnxruntime")
    assert record is not None and not any(".." in rel for rel in record)
    fw = snapshot_of(site).frameworks["onnxruntime"]  # returns: /dev/zero and the FIFO are not read
    assert (fw.distribution, fw.version) == ("onnxruntime", "1.19.2")  # nothing telling: the canonical name


def test_two_distributions_without_telling_files_keep_the_canonical_name(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    install(site, "onnxruntime", "1.19.2", {"onnxruntime/LICENSE": b"MIT\n"})
    install(site, "onnxruntime-gpu", "1.20.1", {"onnxruntime/LICENSE": b"MIT\n"})
    fw = snapshot_of(site).frameworks["onnxruntime"]
    assert (fw.distribution, fw.version, fw.others) == ("onnxruntime", "1.19.2", ("onnxruntime-gpu 1.20.1",))


def test_two_distributions_end_to_end_through_the_prober(tmp_path: Path) -> None:
    """The real probe subprocess in a venv, then the daemon-side hash comparison."""
    python, site = make_env(tmp_path / "env", {})
    install(site, "onnxruntime", "1.19.2", CPU_BUILD)
    install(site, "onnxruntime-gpu", "1.20.1", GPU_BUILD)
    snap = EnvironmentProber(30.0, None).probe(str(python), torch_check=False)
    fw = snap.frameworks["onnxruntime"]
    assert (fw.distribution, fw.version, fw.others) == ("onnxruntime-gpu", "1.20.1", ("onnxruntime 1.19.2",))
    # a job pinned to the CPU build's version does not fit: 1.20.1 is what imports
    w = WorkerSnapshot(node_id="w", environments=(snap,))
    res = match(JobRequest(frameworks={"onnxruntime": "==1.19.2"}), w, SUPPORT_MATRIX)
    assert not isinstance(res, Placement) and [r.code for r in res] == [RejectionCode.FRAMEWORK_VERSION]


# ------------------------------------------------------------------------------ bug-31


def write_case_site(site: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


def test_bug_31_dist_info_without_metadata_is_ignored_with_a_note(tmp_path: Path) -> None:
    c = case("bug-31")
    site = tmp_path / "site-packages"
    write_case_site(site, c["input"]["site_packages"])
    snap = snapshot_of(site)
    assert snap.frameworks["torch"] == FrameworkVersion("torch", "1.13.1+cu116", "torch")
    assert any("torch-1.12.1+cu116.dist-info has no METADATA file; ignored" in n for n in snap.notes)
    w = WorkerSnapshot(node_id="w", environments=(snap,))
    assert isinstance(match(JobRequest(frameworks=c["input"]["job"]["frameworks"]), w, SUPPORT_MATRIX), Placement)


def test_bug_31_variant_only_record_gives_null_version(tmp_path: Path) -> None:
    c = case("bug-31")
    assert "metadata file missing" in c["expected"]["variant"]
    site = tmp_path / "site-packages"
    write_case_site(site, {"torch-2.4.1.dist-info/RECORD": "torch/__init__.py,,\n"})
    snap = snapshot_of(site)
    fw = snap.frameworks["torch"]
    assert (fw.version, fw.note) == (None, "metadata file missing")
    dumped = EnvironmentModel.from_core(snap).model_dump(mode="json")
    assert dumped["frameworks"]["torch"]["version"] is None
    assert "None" not in json.dumps(dumped)
    w = WorkerSnapshot(node_id="w", environments=(snap,))
    res = match(JobRequest(frameworks={"torch": ">=1.13"}), w, SUPPORT_MATRIX)
    assert not isinstance(res, Placement)
    assert [r.code for r in res] == [RejectionCode.UNKNOWN_METRIC]
    assert "metadata file missing" in res[0].message and "None" not in res[0].message


def test_old_probe_report_with_the_string_none_reads_as_unknown() -> None:
    report = {"probe_version": 1, "python_version": "3.11.9", "torch_stage": "absent", "notes": [],
              "frameworks": {"torch": [{"distribution": "torch", "version": "None"}]}}
    assert snapshot_from_report("/x/python", report).frameworks["torch"].version is None


# ------------------------------------------------------------------------------ bug-28 / bug-30


def test_bug_28_ngc_prerelease_versions(tmp_path: Path) -> None:
    c = case("bug-28")
    expected = list(c["expected"].values())
    for (rel, text), job, want in zip(c["input"]["site_packages"].items(), c["input"]["jobs"], expected, strict=True):
        site = tmp_path / rel.split()[0].split("/")[0]
        write_case_site(site, {rel.split()[-1]: text})
        fw = snapshot_of(site).frameworks["torch"]
        assert fw.version == job["against"] and fw.valid
        w = WorkerSnapshot(node_id="w", environments=(EnvironmentSnapshot("/py", frameworks={"torch": fw}),))
        res = match(JobRequest(frameworks=job["frameworks"]), w, SUPPORT_MATRIX)
        assert isinstance(res, Placement) is want.startswith("ok"), (job, res)
        if not isinstance(res, Placement):
            assert [r.code for r in res] == [RejectionCode.FRAMEWORK_VERSION]
    assert check_version("2.4.0a0+3bcc3cddb5.nv24.07", ">=2.4.0a0") is VersionCheck.OK


def test_bug_30_pep440_edges_and_bad_specs() -> None:
    c = case("bug-30")
    for (version, spec), want in zip(c["input"]["pairs"], c["expected"]["pairs"], strict=True):
        assert check_version(version, spec) is (VersionCheck.OK if want == "ok" else VersionCheck.MISMATCH), (
            version, spec)
    for bad in c["input"]["bad_specs"]:
        with pytest.raises(SpecError, match="not a PEP 440 specifier") as exc:
            job_spec_from_mapping({"command": ["python", "x.py"], "requirements": {"frameworks": {"torch": bad}}})
        assert repr(bad) in str(exc.value)
    ok = JobSpec.model_validate({"command": ["python", "x.py"], "requirements": {"frameworks": {"torch": ">= 2.4"}}})
    assert ok.requirements.frameworks == {"torch": ">= 2.4"}


# ------------------------------------------------------------------------------ extras


def test_extras_refused_in_toml_with_a_hint() -> None:
    with pytest.raises(SpecError) as exc:
        job_spec_from_mapping({"command": ["python", "x.py"],
                               "requirements": {"frameworks": {"torch[opt-einsum]": ">=2.4"}}})
    text = str(exc.value)
    assert "extras ([opt-einsum]) are not checked" in text and "write the base name: torch = '>=2.4'" in text
    assert "unknown framework" not in text


def test_extras_refused_in_the_framework_flag_with_the_same_hint() -> None:
    args = build_parser().parse_args(["submit", "--framework", "torch[opt-einsum]>=2.4", "--", "python", "x.py"])
    with pytest.raises(UsageError) as exc:
        _spec_from_flags(args)
    text = str(exc.value)
    assert "extras ([opt-einsum]) are not checked" in text and "write the base name: torch = '>=2.4'" in text
