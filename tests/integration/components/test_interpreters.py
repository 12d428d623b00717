"""Shims, wrappers and conda activation (gpulayerd.gpu.interpreters) with real files and processes.

Tests run as root: a shim or interpreter that belongs to another account (``nobody`` here) must run
as that account, never as root; a wrapper of the admin's is not mistaken for a shim; what a conda
environment's activation scripts print never becomes a variable, and they cannot override the
account's variables or gpulayer's.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.interpreters import MAX_ACTIVATION_VARS, InterpreterResolver, launcher_kind, run_identity

PYTHON3 = shutil.which("python3", path="/usr/bin:/bin")
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A directory of nobody's that nobody can reach (not under pytest's root-only tmp)."""
    d = Path(tempfile.mkdtemp(prefix="glit-nobody-", dir="/tmp"))
    d.chmod(0o755)
    os.chown(d, NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def script(path: Path, text: str, owner: pwd.struct_passwd | None = None) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return path


def test_a_shim_and_an_interpreter_of_another_account_never_run_as_root(nobody_dir: Path) -> None:
    assert PYTHON3 is not None and os.geteuid() == 0
    ran = nobody_dir / "ran-as"
    shim = script(nobody_dir / "python",  # pyenv's template, its hand-over replaced by a plain exec
                  f'#!/bin/sh\n# was: exec "$PYENV_ROOT/libexec/pyenv" exec "$program" "$@"\nid -u >> "{ran}"\n'
                  f'exec {PYTHON3} "$@"\n', NOBODY)
    assert launcher_kind(str(shim)) == "pyenv shim"
    assert run_identity(str(shim)) == (NOBODY.pw_uid, NOBODY.pw_gid)
    found = InterpreterResolver(dict(os.environ), 20.0).resolve(str(shim))
    assert found.problem is None and found.path == PYTHON3 and found.launcher == "pyenv shim"
    assert ran.read_text().split() == [str(NOBODY.pw_uid)]

    # A wrapper of nobody's (not a shim) is probed as it is, as nobody, with the probe's source on its
    # command line (nobody cannot read this installation's files).
    wrapper = script(nobody_dir / "wrapped-python", f'#!/bin/sh\nid -u >> "{ran}"\nexec {PYTHON3} "$@"\n', NOBODY)
    assert launcher_kind(str(wrapper)) is None
    snap = EnvironmentProber(60.0, None).probe(str(wrapper), torch_check=False)
    assert snap.ok, snap.notes
    assert snap.interpreter == str(wrapper) and snap.python_version is not None
    assert ran.read_text().split() == [str(NOBODY.pw_uid)] * 2
    assert run_identity(PYTHON3) is None  # root's own interpreter, in root's directories: as root


def test_root_files_in_a_directory_others_can_change_run_as_nobody(nobody_dir: Path) -> None:
    open_dir = Path(tempfile.mkdtemp(prefix="glit-open-", dir="/tmp"))
    try:
        open_dir.chmod(0o777)  # root's, but anyone may swap what is inside
        inside = script(open_dir / "python", "#!/bin/sh\nexit 0\n")
        assert run_identity(str(inside)) == (NOBODY.pw_uid, NOBODY.pw_gid)
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


@pytest.mark.parametrize(("text", "kind"), [
    ('#!/usr/bin/env bash\nexport PYENV_ROOT="/h/.pyenv"\nexec "/h/.pyenv/libexec/pyenv" exec "$program" "$@"\n',
     "pyenv shim"),
    ('#!/usr/bin/env bash\nexec /h/.asdf/bin/asdf exec "python" "$@"\n', "asdf shim"),
    ('#!/bin/sh\n# rtx 4090 nodes: keep NCCL off P2P (mise of settings, see premise)\nexport NCCL_P2P_DISABLE=1\n'
     'exec /usr/bin/python3 "$@"\n', None),
])
def test_only_version_manager_templates_are_shims(tmp_path: Path, text: str, kind: str | None) -> None:
    assert launcher_kind(str(script(tmp_path / "python", text))) == kind


def test_conda_activation_output_names_and_limits(tmp_path: Path) -> None:
    prefix = tmp_path / "envs" / "ml"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "conda-meta").mkdir()
    many = {f"V{i}": "x" for i in range(MAX_ACTIVATION_VARS + 20)}
    state = {"env_vars": {"HOME": "/attacker", "PATH": "/evil", "GPULAYER_JOB_ID": "x", "LD_PRELOAD": "", **many}}
    (prefix / "conda-meta" / "state").write_text(json.dumps(state), encoding="utf-8")
    activate = prefix / "etc" / "conda" / "activate.d"
    activate.mkdir(parents=True)
    (activate / "a.sh").write_text('echo "Note: setting CUDA_HOME=/usr/local/cuda"\nexport CUDA_HOME=/opt/cuda\n'
                                   'export USER=mallory\n', encoding="utf-8")
    python = script(prefix / "bin" / "python", "#!/bin/sh\nexit 0\n")
    found = InterpreterResolver(dict(os.environ), 20.0).resolve(str(python))
    act = found.activation
    assert act["CONDA_PREFIX"] == str(prefix) and act["CUDA_HOME"] == "/opt/cuda"
    assert not [k for k in act if " " in k or "\n" in act[k]]  # the script's echo never became a variable
    assert not {"HOME", "USER", "GPULAYER_JOB_ID"} & set(act)
    assert act["PATH"] == f"{prefix}/bin"  # the directory put first, never the state's "/evil"
    assert len(act) <= MAX_ACTIVATION_VARS and "conda activation variable(s) dropped" in found.activation_note
