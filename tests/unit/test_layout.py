"""The layout shows the design (issue 25): the limits a newcomer can see from the folders.

- at most 7 modules at the top of ``gpulayerd/`` (the composition root, config, errors, text and
  the entry points); no folder with more than 16 modules; no file over 600 lines in ``gpulayerd/``
  or ``tui/``;
- two modules share a file name only when their docstrings say why ("Same name as ..." or, for the
  entry points, "Every ``__main__.py``");
- each package says in its ``__init__`` docstring what it owns.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "gpulayerd"


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py"))


def test_the_top_level_and_every_folder_stay_small() -> None:
    top = [p.name for p in _modules(PKG)]
    assert len(top) <= 7, top
    crowded = {str(d.relative_to(ROOT)): len(_modules(d)) for d in PKG.rglob("*") if d.is_dir()
               and d.name != "__pycache__" and len(_modules(d)) > 16}
    assert crowded == {}, crowded


def test_no_file_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for base in (PKG, ROOT / "tui") for p in base.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}, long


def test_modules_that_share_a_name_say_why() -> None:
    by_name: dict[str, list[Path]] = defaultdict(list)
    for p in PKG.rglob("*.py"):
        if p.name != "__init__.py" and "__pycache__" not in p.parts:
            by_name[p.name].append(p)
    for d in PKG.rglob("__init__.py"):  # a module named as a package elsewhere (store/runs.py, runs/)
        same = [p for p in by_name.get(d.parent.name + ".py", []) if p.parent != d.parent]
        if same and "__pycache__" not in d.parts:
            by_name[d.parent.name + ".py"] = [*same, *([] if len(same) > 1 else same)]
    silent = []
    for _name, paths in sorted(by_name.items()):
        if len(paths) < 2:
            continue
        for p in paths:
            doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
            if "Same name as" not in doc and "Every ``__main__.py``" not in doc:
                silent.append(str(p.relative_to(ROOT)))
    assert silent == [], f"modules sharing a file name whose docstring does not say why: {silent}"


def test_every_package_says_what_it_owns() -> None:
    """Each package's ``__init__`` docstring names every module and sub-package in it."""
    import re

    unnamed = []
    for init in PKG.rglob("__init__.py"):
        if "__pycache__" in init.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        words = set(re.findall(r"[a-z_]+", doc))
        here = init.parent
        parts = [p.stem for p in here.glob("*.py") if p.stem not in ("__init__", "__main__")]
        parts += [d.name for d in here.iterdir() if (d / "__init__.py").is_file()]
        unnamed += [f"{here.relative_to(ROOT)}/{name}" for name in parts if name not in words]
    assert unnamed == [], f"not named in their package's __init__ docstring: {sorted(unnamed)}"


def test_one_definition_of_the_finished_states_and_of_a_jobs_user() -> None:
    import re

    finished = re.compile(r'"succeeded", "failed", "cancelled", "lost", "rejected"')
    user = re.compile(r"spec\.user or [a-z_.]*submitted_by|submitted_by or [a-z_.]*spec\.user")
    found = [(str(p.relative_to(ROOT)), what) for base in (PKG, ROOT / "tui") for p in base.rglob("*.py")
             for what, pattern in (("finished states", finished), ("a job's user", user))
             if pattern.search(p.read_text(encoding="utf-8")) and p.name != "job_facts.py"]
    assert found == [], f"defined again (use gpulayerd.core.job_facts): {found}"
