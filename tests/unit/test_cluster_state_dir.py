"""Which state dir `gpulayer cluster ...` works on: the system daemon's with --system (issue 11)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import gpulayerd.config
from gpulayerd.cli.cluster import _state_dir


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"state_dir": None, "system": False, **kw})


def test_system_flag_means_the_system_daemons_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system, personal = tmp_path / "var-lib-gpulayer", tmp_path / "personal"
    monkeypatch.setattr(gpulayerd.config, "SYSTEM_STATE_DIR", system)
    monkeypatch.setattr(gpulayerd.config, "default_state_dir", lambda: personal)
    assert _state_dir(_args(system=True)) == system
    assert _state_dir(_args(system=True, state_dir=str(tmp_path / "x"))) == tmp_path / "x"  # --state-dir wins
    assert _state_dir(_args()) == personal  # no system daemon enrolled here
    (system / "identity").mkdir(parents=True)
    assert _state_dir(_args()) == system  # root on an enrolled lab machine: `sudo gpulayer cluster show`
    (personal / "identity").mkdir(parents=True)
    assert _state_dir(_args()) == personal  # root's own personal daemon is enrolled: that one


def test_root_enrolling_the_system_state_dir_enrolls_it_in_system_mode(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayerd.cli.cluster import _mode

    system, personal = tmp_path / "var-lib-gpulayer", tmp_path / "personal"
    monkeypatch.setattr(gpulayerd.config, "SYSTEM_STATE_DIR", system)
    monkeypatch.setattr(gpulayerd.config, "default_state_dir", lambda: personal)
    (system / "identity").mkdir(parents=True)  # the system daemon has started here once
    args = _args(cluster_command="init")
    assert _state_dir(args) == system
    assert _mode(args) == "system"  # a personal certificate here would stop the system daemon
    assert _mode(_args(cluster_command="init", state_dir=str(tmp_path / "mine"))) == "personal"


def test_options_are_never_abbreviated() -> None:
    from gpulayerd.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit):  # --token is not --token-file (it would echo the secret in an error)
        parser.parse_args(["cluster", "join", "--token", "gpl2.secret"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--state", "/x", "jobs"])
