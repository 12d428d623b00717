"""Runtime profile files: where they live, how they are read, and how ``profiles capture`` writes one.

Three files, read in this order; a later file's profile replaces an earlier one of the same name:

- shipped: ``gpulayerd/profiles/shipped.toml`` (documented there);
- system (admins): ``/etc/gpulayer/profiles.toml``, or ``$GPULAYER_SYSTEM_PROFILES``;
- user: ``profiles.toml`` in platformdirs' user config dir (``~/.config/gpulayer`` on Linux,
  ``~/Library/Application Support/gpulayer`` on macOS), or ``$GPULAYER_USER_PROFILES``.

Format: one table per profile, ``[profile."NAME"]`` with the items of
:data:`gpulayerd.core.matching.profiles.PROFILE_ITEMS` and ``description``, validated as a job's
``[requirements]`` are (same messages). Blocking file I/O: call from a thread in the event loop.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpulayerd.core.matching.profiles import PROFILE_ITEMS, Profile
from gpulayerd.host.atomic import write_atomic
from gpulayerd.models.spec import Requirements, format_validation_error

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "SHIPPED_PROFILES",
    "ProfileFileError",
    "capture_profile",
    "load_profiles",
    "parse_profiles",
    "profile_paths",
    "render_profile",
    "system_profiles_path",
    "user_profiles_path",
    "write_user_profile",
]

SHIPPED_PROFILES = Path(__file__).parents[1] / "profiles" / "shipped.toml"
"""The profiles that come with gpulayer."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


class ProfileFileError(ValueError):
    """A profile file cannot be read or has an invalid profile; the message names file and field."""


def system_profiles_path() -> Path:
    """The admins' profile file: ``$GPULAYER_SYSTEM_PROFILES`` or ``/etc/gpulayer/profiles.toml``."""
    return Path(os.environ.get("GPULAYER_SYSTEM_PROFILES") or "/etc/gpulayer/profiles.toml")


def user_profiles_path() -> Path:
    """The user's profile file: ``$GPULAYER_USER_PROFILES`` or ``profiles.toml`` in platformdirs'
    user config dir for gpulayer."""
    env = os.environ.get("GPULAYER_USER_PROFILES")
    if env:
        return Path(env)
    from platformdirs import user_config_dir

    return Path(user_config_dir("gpulayer")) / "profiles.toml"


def profile_paths(include_user: bool = True) -> list[Path]:
    """The profile files in reading order: shipped, system, and (``include_user``) the user's."""
    paths = [SHIPPED_PROFILES, system_profiles_path()]
    if include_user:
        paths.append(user_profiles_path())
    return paths


def parse_profiles(data: Mapping[str, Any], source: str) -> dict[str, Profile]:
    """Validate the parsed TOML of one profile file.

    Raises:
        ProfileFileError: naming ``source``, the profile and each bad field.
    """
    unknown = [k for k in data if k != "profile"]
    if unknown:
        raise ProfileFileError(f"{source}: unknown top-level key {unknown[0]!r}; profiles are [profile.\"NAME\"]")
    tables = data.get("profile", {})
    if not isinstance(tables, Mapping):
        raise ProfileFileError(f"{source}: profile must be a table of [profile.\"NAME\"] tables")
    out: dict[str, Profile] = {}
    for name, table in tables.items():
        where = f"{source}: profile {name!r}"
        if not _NAME.match(name):
            raise ProfileFileError(f"{where}: a name is letters, digits and . _ + - (at most 100)")
        if not isinstance(table, Mapping):
            raise ProfileFileError(f"{where}: must be a table")
        extra = [k for k in table if k not in (*PROFILE_ITEMS, "description")]
        if extra:
            allowed = ", ".join((*PROFILE_ITEMS, "description"))
            raise ProfileFileError(f"{where}: {extra[0]}: unknown field (allowed: {allowed})")
        description = table.get("description", "")
        if not isinstance(description, str):
            raise ProfileFileError(f"{where}: description: must be a string")
        items = {k: v for k, v in table.items() if k in PROFILE_ITEMS}
        try:
            req = Requirements.model_validate(items)
        except ValidationError as e:
            raise ProfileFileError(f"{where}: invalid\n{format_validation_error(e)}") from e
        out[name] = Profile(name=name, description=description, frameworks=dict(req.frameworks),
                            python=req.python, cuda_runtime=req.cuda_runtime,
                            min_driver_version=req.min_driver_version, os=req.os, source=source)
    return out


def load_profiles(paths: Iterable[Path] | None = None) -> dict[str, Profile]:
    """Read every profile file that exists (default: :func:`profile_paths`); later files win.

    Raises:
        ProfileFileError: a file exists but cannot be read, is not TOML, or has a bad profile.
    """
    out: dict[str, Profile] = {}
    for path in profile_paths() if paths is None else paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as e:
            raise ProfileFileError(f"{path}: cannot read: {e}") from e
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ProfileFileError(f"{path}: malformed TOML: {e}") from e
        except RecursionError:  # tomllib recurses per nesting level
            raise ProfileFileError(f"{path}: malformed TOML: arrays or tables nested too deeply") from None
        source = "shipped" if path == SHIPPED_PROFILES else str(path)
        out.update(parse_profiles(data, source))
    return out


def _toml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string


def render_profile(profile: Profile) -> str:
    """One ``[profile."NAME"]`` table as TOML text (ends with a newline)."""
    lines = [f"[profile.{_toml_str(profile.name)}]"]
    if profile.description:
        lines.append(f"description = {_toml_str(profile.description)}")
    if profile.frameworks:
        inner = ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in sorted(profile.frameworks.items()))
        lines.append(f"frameworks = {{ {inner} }}")
    for key in PROFILE_ITEMS[1:]:
        value = getattr(profile, key)
        if value is not None:
            lines.append(f"{key} = {_toml_str(value)}")
    return "\n".join(lines) + "\n"


def write_user_profile(profile: Profile, path: Path | None = None) -> Path:
    """Add ``profile`` to the user's profile file (replacing one of the same name), atomically.

    Raises:
        ProfileFileError: the existing file is not a valid profile file, or cannot be written.
    """
    target = path or user_profiles_path()
    existing: dict[str, Profile] = load_profiles([target]) if target.exists() else {}
    existing[profile.name] = profile
    header = "# gpulayer runtime profiles of this user (format: gpulayerd/profiles/shipped.toml)\n"
    body = "\n".join(render_profile(p) for _, p in sorted(existing.items()))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, header + "\n" + body)
    except OSError as e:
        raise ProfileFileError(f"{target}: cannot write: {e.strerror or e}") from e
    return target


def _minor_pin(version: str) -> str | None:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return f"=={m.group(1)}.{m.group(2)}.*" if m else None


def capture_profile(name: str, env: Any, os_name: str | None, description: str = "") -> Profile:
    """A profile from a working environment (an :class:`~gpulayerd.core.types.EnvironmentSnapshot`):
    python and every framework pinned ``==X.Y.*`` (which also accepts local and pre-release builds),
    torch's CUDA build as ``cuda_runtime ==X.Y`` (none for a torch without CUDA), and ``os``.

    Raises:
        ProfileFileError: a bad name, or an environment that could not be probed.
    """
    from gpulayerd.core.matching.runtime_checks import torch_cuda_build

    if not _NAME.match(name):
        raise ProfileFileError(f"profile {name!r}: a name is letters, digits and . _ + - (at most 100)")
    if not env.ok:
        raise ProfileFileError(f"{env.interpreter}: cannot be probed: {'; '.join(env.notes)}")
    frameworks = {}
    for fw_name, fw in sorted(env.frameworks.items()):
        pin = _minor_pin(fw.version or "") if fw.valid else None
        if pin is not None and fw_name in _known_frameworks():
            frameworks[fw_name] = pin
    build = torch_cuda_build(env)
    return Profile(
        name=name,
        description=description or f"captured from {env.interpreter}",
        frameworks=frameworks,
        python=_minor_pin(env.python_version or ""),
        cuda_runtime=f"=={build}" if build else None,
        os=os_name if os_name in ("linux", "darwin") else None,
    )


def _known_frameworks() -> tuple[str, ...]:
    from gpulayerd.models.spec import KNOWN_FRAMEWORKS

    return KNOWN_FRAMEWORKS
