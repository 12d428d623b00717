"""Version arithmetic of the nearest-miss hints (:mod:`gpulayerd.core.matching.hints`): a specifier widened
to the version an environment has, a pre-release of the wanted release named as such, and how far
apart two versions are (for ranking). Pure; wraps ``packaging``.
"""

from __future__ import annotations

from functools import lru_cache

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from gpulayerd.core.matching.versions import VersionCheck, check_version

__all__ = ["distance", "first_bound", "widen"]


def _release(text: str) -> tuple[int, ...] | None:
    try:
        return Version(text).release
    except InvalidVersion:
        return None


def distance(a: str, b: str) -> float:
    """How far apart two versions are, relative (``590.0`` vs ``580.126.09``: 0.017); 1 unknown."""
    ra, rb = _release(a), _release(b)
    if not ra or not rb:
        return 1.0
    def weight(r: tuple[int, ...]) -> float:
        return sum(p / 1000.0**i for i, p in enumerate(r[:3]))
    wa, wb = weight(ra), weight(rb)
    return abs(wa - wb) / max(wa, wb, 1.0)


def first_bound(spec: str) -> str:
    """The first version a specifier names (``>=2.4,<3`` -> ``2.4``; ``==2.3.*`` -> ``2.3``)."""
    for clause in spec.split(","):
        text = clause.strip().lstrip("<>=!~ ").removesuffix(".*")
        if text:
            return text
    return spec


def _short(release: tuple[int, ...]) -> str:
    parts = list(release)
    while len(parts) > 2 and parts[-1] == 0:
        parts.pop()
    return ".".join(str(p) for p in parts)


@lru_cache(maxsize=4096)
def widen(spec: str, found: str) -> tuple[str, str] | None:
    """``spec`` rewritten so the installed ``found`` satisfies it, changing only the clauses it
    fails; with a note when ``found`` is a pre-release of a release ``spec`` accepts.

    Returns:
        ``(new spec, note)`` (note ``""`` for none), or None when no rewrite is sound.
    """
    try:
        version = Version(found)
        clauses = [Specifier(c.strip(), prereleases=True) for c in spec.split(",") if c.strip()]  # in order
    except (InvalidVersion, InvalidSpecifier):
        return None
    public = version.public
    out: list[str] = []
    for s in clauses:
        if s.contains(version, prereleases=True):
            out.append(str(s))
            continue
        op, bound = s.operator, s.version
        if op in (">=", ">"):
            out.append(f">={public}")
        elif op == "~=":
            prefix = ".".join(bound.split(".")[:-1])
            out += [f">={public}", f"=={prefix}.*"]
        elif op in ("<", "<="):
            out.append(f"<={public}")
        elif op == "==" and bound.endswith(".*"):
            depth = len(bound[:-2].split("."))
            out.append("==" + ".".join(str(p) for p in (*version.release, 0, 0)[:depth]) + ".*")
        elif op == "==":
            out.append(f"=={public}")
        elif op == "!=":
            continue
        else:
            return None
    new = ",".join(dict.fromkeys(out))
    if check_version(found, new) is not VersionCheck.OK:
        return None
    note = ""
    if version.is_prerelease or version.is_devrelease:
        final = Version(version.base_version)
        if SpecifierSet(spec).contains(final, prereleases=True):
            note = f"{found} is a pre-release of {_short(final.release)}"
    return new, note
