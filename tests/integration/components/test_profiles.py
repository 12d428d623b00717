"""Runtime profiles: files, expansion with origins and overrides, submit, the matrix, capture."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from gpulayerd.cli import main
from gpulayerd.core.matching.profiles import Profile, UnknownProfile, check_profile, expand_profile
from gpulayerd.errors import InvalidSpec
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.host.profile_files import (
    SHIPPED_PROFILES,
    ProfileFileError,
    load_profiles,
    parse_profiles,
    write_user_profile,
)
from gpulayerd.models import SubmitRequest
from tests.fakes.daemons import Lab, d
from tests.fakes.envs import make_env

WORKERS = sorted((Path(__file__).resolve().parents[2] / "data" / "workers").glob("*.json"))
SHIPPED = load_profiles([SHIPPED_PROFILES])


@pytest.fixture(autouse=True)
def _own_profile_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    user = tmp_path / "user-profiles.toml"
    monkeypatch.setenv("GPULAYER_USER_PROFILES", str(user))
    monkeypatch.setenv("GPULAYER_SYSTEM_PROFILES", str(tmp_path / "no-system-profiles.toml"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return user


def test_shipped_profiles_are_documented_and_valid() -> None:
    assert {"torch-2.4-cu124", "torch-2.5-cu121", "torch-mps", "cpu-only"} <= set(SHIPPED)
    p = SHIPPED["torch-2.4-cu124"]
    assert p.items() == {"frameworks.torch": "==2.4.*", "python": ">=3.8", "cuda_runtime": "==12.4",
                         "min_driver_version": "525.60.13", "os": "linux"}
    assert all(p.description for p in SHIPPED.values())
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert "gpulayer profiles" in readme and "profiles.toml" in readme


def test_expansion_records_origins_and_the_job_wins() -> None:
    spec = {"command": ["python", "t.py"], "profile": "torch-2.4-cu124",
            "requirements": {"accelerator": "cuda", "python": ">=3.11", "frameworks": {"numpy": ">=2"}}}
    out, origins = expand_profile(spec, SHIPPED)
    assert out["requirements"] == {"accelerator": "cuda", "python": ">=3.11",
                                   "frameworks": {"numpy": ">=2", "torch": "==2.4.*"}, "cuda_runtime": "==12.4",
                                   "min_driver_version": "525.60.13", "os": "linux"}
    assert origins == {
        "frameworks.torch": "from profile torch-2.4-cu124",
        "python": "job (profile torch-2.4-cu124 says >=3.8)",
        "cuda_runtime": "from profile torch-2.4-cu124",
        "min_driver_version": "from profile torch-2.4-cu124",
        "os": "from profile torch-2.4-cu124",
    }
    assert out["requirement_origins"] == origins
    assert spec["requirements"] == {"accelerator": "cuda", "python": ">=3.11", "frameworks": {"numpy": ">=2"}}


def test_cuda_items_are_not_applied_to_a_cpu_job() -> None:
    out, origins = expand_profile({"command": ["x"], "profile": "torch-2.4-cu124"}, SHIPPED)
    assert "cuda_runtime" not in out["requirements"]
    assert origins["cuda_runtime"] == "not applied: not a CUDA job (profile torch-2.4-cu124 says ==12.4)"


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(UnknownProfile) as err:
        expand_profile({"command": ["x"], "profile": "torch-9"}, SHIPPED)
    assert str(err.value) == "unknown profile 'torch-9'; known profiles: cpu-only, torch-2.4-cu124, " \
                             "torch-2.5-cu121, torch-mps"


def test_submit_with_an_unknown_profile_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--socket", "/nonexistent/sock", "submit", "--profile", "nope", "--", "true"])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown profile 'nope'; known profiles: cpu-only, torch-2.4-cu124, torch-2.5-cu121, torch-mps" in err


def test_a_bad_profile_file_names_the_profile_and_field() -> None:
    with pytest.raises(ProfileFileError) as err:
        parse_profiles({"profile": {"x": {"os": "windows"}}}, "/etc/gpulayer/profiles.toml")
    assert "/etc/gpulayer/profiles.toml: profile 'x': invalid\nos: 'windows' is not one of: linux, darwin" \
        in str(err.value)
    with pytest.raises(ProfileFileError, match="gpu_count: unknown field"):
        parse_profiles({"profile": {"x": {"gpu_count": 2}}}, "f")


def test_user_profiles_replace_shipped_ones(_own_profile_files: Path) -> None:
    write_user_profile(Profile(name="cpu-only", frameworks={"numpy": "==1.26.*"}, python="==3.10.*"))
    assert load_profiles()["cpu-only"].frameworks == {"numpy": "==1.26.*"}
    assert load_profiles()["cpu-only"].source == str(_own_profile_files)


@pytest.mark.asyncio
async def test_owner_expands_a_profile_at_submit(lab: Lab, _own_profile_files: Path) -> None:
    await __import__("asyncio").to_thread(
        write_user_profile, Profile(name="lab-np", frameworks={"numpy": ">=1.20"}, python=">=3.8"))
    owner = d(lab, "owner").services.owner
    spec = {"command": ["python", "t.py"], "workdir": str(lab.workdir), "profile": "lab-np",
            "requirements": {"python": ">=3.9"}}
    view = await owner.submit(SubmitRequest(spec=spec, submitted_by="test"))
    assert view.spec.requirements.frameworks == {"numpy": ">=1.20"}
    assert view.spec.requirements.python == ">=3.9"
    assert view.spec.requirement_origins == {"frameworks.numpy": "from profile lab-np",
                                             "python": "job (profile lab-np says >=3.8)"}
    stored = await owner.get_job(view.id)
    assert stored.spec.profile == "lab-np" and stored.spec.requirement_origins == view.spec.requirement_origins
    from gpulayerd.cli.render import render_job

    text = render_job(stored)
    assert "  profile:   lab-np\n    frameworks.numpy: from profile lab-np\n" \
           "    python: job (profile lab-np says >=3.8)" in text
    with pytest.raises(InvalidSpec, match="unknown profile 'nope'; known profiles: cpu-only, lab-np"):
        await owner.submit(SubmitRequest(spec={**spec, "profile": "nope"}, submitted_by="test"))


# ------------------------------------------------------------------------ gpulayer profiles


def test_matrix_from_saved_capability_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--capabilities", *map(str, WORKERS)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = lines[0].split()
    assert head[0] == "PROFILE" and "lab-ws-02" in head and "mac-studio" in head
    mps = next(line.split() for line in lines if line.startswith("torch-mps "))
    assert mps[head.index("mac-studio")] == "✓" and mps[head.index("lab-ws-02")] == "✗"
    assert "torch-2.4-cu124 on lab-ws-02 (/opt/conda/envs/train/bin/python): cuda_runtime ==12.4 (has 12.1)" in out


def test_matrix_json_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--json", "--capabilities", *map(str, WORKERS)]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert len(cells) == len(SHIPPED) * len(WORKERS)
    cell = next(c for c in cells if c["profile"] == "torch-2.5-cu121" and c["name"] == "lab-ws-03")
    assert cell["ok"] is False
    assert cell["failures"] == [{"requirement": "cuda_runtime", "wanted": "==12.1", "found": "12.4",
                                 "message": "torch in /home/lab/.venvs/llm/bin/python is built for CUDA 12.4, "
                                 "which does not satisfy cuda_runtime ==12.1"}]
    assert next(c for c in cells if c["profile"] == "cpu-only" and c["name"] == "lab-ws-01")["ok"] is True


# ------------------------------------------------------------------------ capture


def _roundtrip(python: Path, name: str, file: Path, capsys: pytest.CaptureFixture[str]) -> Profile:
    assert main(["profiles", "capture", name, "--python", str(python), "--file", str(file)]) == 0
    capsys.readouterr()
    profile = load_profiles([file])[name]
    env = EnvironmentProber(60.0, None).probe(str(python), torch_check=False)
    from gpulayerd.core.types import WorkerSnapshot

    worker = WorkerSnapshot(node_id="me", name="me", environments=(env,), os=platform.system().lower())
    cell = check_profile(profile, worker, env)
    assert cell.ok, cell.failures
    return profile


def test_capture_round_trips_a_real_venv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python = Path(sys.executable)  # the test venv: torch built without CUDA
    file = tmp_path / "p.toml"
    profile = _roundtrip(python, "here", file, capsys)
    v = sys.version_info
    assert profile.python == f"=={v.major}.{v.minor}.*"
    assert profile.os == platform.system().lower()
    import importlib.metadata as md

    torch = md.version("torch")
    major, minor = torch.split(".")[:2]
    assert profile.frameworks["torch"] == f"=={major}.{minor}.*"
    assert profile.cuda_runtime is None  # a CPU build pins no CUDA


def test_capture_of_a_cuda_build_pins_cuda_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python, _ = make_env(tmp_path / "venv", {"torch": "2.4.0a0+3bcc3cddb5.nv24.7", "numpy": "1.26.4"},
                         {"torch/version.py": "__version__ = '2.4.0a0'\ncuda = '12.5'\n"})
    file = tmp_path / "p.toml"
    file.write_text('[profile."other"]\npython = ">=3.8"\n')
    profile = _roundtrip(python, "ngc", file, capsys)
    assert profile.frameworks == {"numpy": "==1.26.*", "torch": "==2.4.*"}  # accepts NGC's 2.4.0a0+...
    assert profile.cuda_runtime == "==12.5"
    assert set(load_profiles([file])) == {"other", "ngc"}
