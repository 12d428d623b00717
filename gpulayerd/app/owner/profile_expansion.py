"""Profiles at submit: the owner daemon expands ``profile = "NAME"`` of a job it is given.

The CLI expands a job's profile before sending it (it reads the user's own profile file); a
spec that still names a profile without ``requirement_origins`` (another client) is expanded
here with the shipped and system profiles, plus the daemon's own user's file when it runs in
personal mode (then that is the submitter's file).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpulayerd.core.matching.profiles import UnknownProfile, expand_profile
from gpulayerd.errors import InvalidSpec
from gpulayerd.host.profile_files import ProfileFileError, load_profiles, profile_paths

__all__ = ["expand_at_submit"]


async def expand_at_submit(data: Mapping[str, Any], personal: bool) -> dict[str, Any]:
    """``data`` with its profile expanded (see :func:`gpulayerd.core.matching.profiles.expand_profile`);
    unchanged when it names none or was expanded already.

    Raises:
        InvalidSpec: an unknown profile (listing the known ones) or a bad profile file.
    """
    if not data.get("profile") or data.get("requirement_origins"):
        return dict(data)
    try:
        profiles = await asyncio.to_thread(load_profiles, profile_paths(include_user=personal))
        return expand_profile(data, profiles)[0]
    except (UnknownProfile, ProfileFileError) as e:
        raise InvalidSpec(f"job spec: profile: {e}") from e
