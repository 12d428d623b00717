"""Real local accounts for tests (``useradd``/``userdel``), and gpulayer runnable by them.

Tests run as root (CI is root). :func:`accounts` makes throwaway users and groups with
names unique to the run and removes them afterwards, even when the test fails.

A virtual environment whose interpreter lives under ``/root`` (pyenv, the usual CI
layout) cannot be run by another account, so :func:`shared_python` copies gpulayer and
the libraries its CLI needs into a world-readable directory under ``/tmp`` and runs them
with the system's ``/usr/bin/python3`` (same minor version, so compiled extensions
load). :meth:`SharedPython.cli` runs ``gpulayer`` as a given account through it, and
:meth:`SharedPython.venv` is a virtual environment of that interpreter that imports that copy without
``PYTHONPATH`` (a daemon run by it starts helpers, e.g. a Slurm worker's proxy, as other accounts with
the job's own environment: ``sys.executable -m gpulayerd...`` must work for them as it is).

Every change of the user database here (``useradd``, ``userdel``, ``groupadd``, ``groupdel``: each
replaces ``/etc/passwd`` or ``/etc/group`` by a rename) holds :func:`etc_unchanged`, a lock shared by the
test processes of the machine. A rename over a file drops the bind mounts made over it in every mount
namespace (Linux >= 3.18), so a test that gives a namespace its own copy of those files
(``/etc/netns/NAME/``, bound by ``ip netns exec``) holds the lock while its daemons run: else another
test's ``useradd`` meanwhile hands that namespace the real files back.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Big packages the CLI never imports; everything else of the test venv is copied.
_SKIP = ("torch", "nvidia", "triton", "sympy", "networkx", "mypy", "pip", "setuptools", "hypothesis",
         "functorch", "torchgen", "_pytest", "pytest", "ruff", "jinja2", "mpmath", "fsspec", "filelock")


@dataclass(frozen=True)
class Account:
    """One throwaway account: ``name``, ``uid``, primary ``gid``, ``home`` (created, owned by it)."""

    name: str
    uid: int
    gid: int
    home: Path

    @property
    def groups(self) -> list[int]:
        """The account's group ids (primary first), from the user database."""
        return os.getgrouplist(self.name, self.gid)


ETC_LOCK = Path("/tmp/gpulayer-tests-etc.lock")
"""The lock file of :func:`etc_unchanged` (one per machine: every test process of every run)."""
_held = [0]  # how deep this process holds it (a test holding it may still add or remove accounts)


@contextlib.contextmanager
def etc_unchanged() -> Iterator[None]:
    """While it is held, no test on this machine changes the user database (see the module docstring);
    reentrant within a process. Blocks until the holder (another test process) lets go."""
    if _held[0]:
        _held[0] += 1
        try:
            yield
        finally:
            _held[0] -= 1
        return
    fd = os.open(ETC_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[0] = 1
        try:
            yield
        finally:
            _held[0] = 0
    finally:
        os.close(fd)  # (releases the lock)


@dataclass
class Accounts:
    """Makes accounts and groups for one test; :meth:`remove_all` deletes them."""

    run: str = field(default_factory=lambda: secrets.token_hex(3))
    users: list[str] = field(default_factory=list)
    group_names: list[str] = field(default_factory=list)

    def group(self, role: str) -> str:
        """A new group named ``gl<run>-<role>``; returns its name."""
        name = f"gl{self.run}-{role}"[:32]
        with etc_unchanged():
            subprocess.run(["groupadd", name], check=True, capture_output=True)
        self.group_names.append(name)
        return name

    def user(self, role: str, groups: Sequence[str] = ()) -> Account:
        """A new account ``gl<run>-<role>`` with a home directory, in the extra ``groups``."""
        name = f"gl{self.run}-{role}"[:32]
        argv = ["useradd", "--create-home", "--shell", "/bin/sh", "--user-group"]
        if groups:
            argv += ["--groups", ",".join(groups)]
        with etc_unchanged():
            subprocess.run([*argv, name], check=True, capture_output=True)
        self.users.append(name)
        pw = pwd.getpwnam(name)
        return Account(name=name, uid=pw.pw_uid, gid=pw.pw_gid, home=Path(pw.pw_dir))

    def remove_all(self) -> None:
        """Delete every account (with its home) and group made here; errors are ignored."""
        for name in reversed(self.users):
            subprocess.run(["pkill", "-KILL", "-u", name], check=False, capture_output=True)
            with etc_unchanged():
                subprocess.run(["userdel", "--remove", "--force", name], check=False, capture_output=True)
        for name in reversed(self.group_names):
            try:
                grp.getgrnam(name)
            except KeyError:
                continue
            with etc_unchanged():
                subprocess.run(["groupdel", name], check=False, capture_output=True)
        self.users.clear()
        self.group_names.clear()


@pytest.fixture
def accounts() -> Iterator[Accounts]:
    """Throwaway accounts and groups, removed after the test whatever its outcome."""
    made = Accounts()
    try:
        yield made
    finally:
        made.remove_all()


@dataclass(frozen=True)
class SharedPython:
    """gpulayer importable by every account: ``python`` (the system interpreter) + ``path``."""

    python: str
    path: Path

    def env(self, account: Account | None = None, **extra: str) -> dict[str, str]:
        """A minimal environment that runs gpulayer from :attr:`path` (as ``account``, if given)."""
        env = {"PYTHONPATH": str(self.path), "PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        if account is not None:
            env.update(HOME=str(account.home), USER=account.name, LOGNAME=account.name)
        env.update(extra)
        return env

    def venv(self) -> str:
        """The interpreter of a virtual environment (made on first use beside :attr:`path`, world-readable)
        whose site-packages find gpulayer in :attr:`path` (a ``.pth``): gpulayer's daemon run by it is a
        lab install every account can use."""
        venv = self.path.parent / "venv"
        python = venv / "bin" / "python"
        if not python.exists():
            subprocess.run([self.python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
            site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       check=True, capture_output=True, text=True).stdout.strip())
            (site / "gpulayer-shared.pth").write_text(f"{self.path}\n")
            for d, _dirs, files in os.walk(venv):
                os.chmod(d, 0o755)
                for f in files:
                    if not os.path.islink(os.path.join(d, f)):
                        os.chmod(os.path.join(d, f), 0o644 | (os.stat(os.path.join(d, f)).st_mode & 0o111))
        return str(python)

    def cli(self, account: Account | None, *args: str, timeout_s: float = 60.0,
            env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``gpulayer ARGS`` as ``account`` (None: as root); output captured as text."""
        full_env = self.env(account)
        full_env.update(env or {})
        user = account.name if account is not None else None
        return subprocess.run([self.python, "-m", "gpulayerd.cli", *args], check=False, env=full_env, user=user,
                              cwd=str(cwd or (account.home if account else "/")), capture_output=True,
                              text=True, timeout=timeout_s)


def _interpreter() -> str:
    """A system interpreter of this minor version that every account may run."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(f"no system python{version} under /usr/bin or /usr/local/bin for other accounts to run")


@pytest.fixture(scope="session")
def shared_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedPython]:
    """gpulayer and its libraries copied to a world-readable directory (see the module docstring)."""
    root = Path(f"/tmp/gpulayer-shared-{secrets.token_hex(3)}")
    site = root / "site"
    try:
        site.mkdir(parents=True)
        purelib = Path(sysconfig.get_paths()["purelib"])
        for entry in purelib.iterdir():
            if entry.name.startswith(_SKIP) or entry.name.endswith((".pth", ".egg-link")) \
                    or entry.name.startswith("__editable__") or entry.name == "__pycache__":
                continue
            target = site / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(entry, target)
        for package in ("gpulayerd", "tui/gpulayer_tui"):
            shutil.copytree(REPO_ROOT / package, site / Path(package).name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        for d, _dirs, files in os.walk(root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644 | (os.stat(os.path.join(d, f)).st_mode & 0o111))
        yield SharedPython(python=_interpreter(), path=site)
    finally:
        shutil.rmtree(root, ignore_errors=True)
