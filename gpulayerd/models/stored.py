"""The JSON kept in the store's columns, read and written in one place (the services decode no JSON).

- ``attempts.placement_json``: a one-host attempt's :class:`PlacementModel` (``worker``,
  ``device_indices``, ...), or a gang's ``{"gang": [node ids in rank order], "master":
  "addr:port", "hold_id": ...}``; an older or damaged value reads as no placement.
- ``jobs.spec_json`` and ``remote_runs.spec_json``: a :class:`JobSpec`.
- ``jobs.explanation_json``: the last :class:`ExplanationModel` of a waiting job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpulayerd.models.explanation import ExplanationModel, PlacementModel
from gpulayerd.models.spec import JobSpec

__all__ = ["StoredPlacement", "dump_placement", "explanation_of", "gang_placement", "read_placement", "spec_name",
           "spec_of", "spec_user"]


@dataclass(frozen=True, slots=True)
class StoredPlacement:
    """An attempt's stored placement.

    Attributes:
        placement: a one-host attempt's placement (None for a gang, or when unreadable).
        gang: a multi-host attempt's members, node ids in rank order (empty for one host).
        device_indices: the granted device indices of a one-host attempt (ints only).
        environment: the environment it runs in, when named.
    """

    placement: PlacementModel | None = None
    gang: list[str] = field(default_factory=list)
    device_indices: list[int] = field(default_factory=list)
    environment: str | None = None


def read_placement(text: str | None) -> StoredPlacement:
    """``attempts.placement_json`` read; anything unreadable is an empty placement (never an error)."""
    try:
        raw = json.loads(text or "{}")
    except ValueError:
        return StoredPlacement()
    if not isinstance(raw, dict):
        return StoredPlacement()
    placement = None
    if "worker" in raw:
        try:
            placement = PlacementModel.model_validate(raw)
        except ValidationError:
            placement = None
    gang = raw.get("gang", [])
    devices = raw.get("device_indices", [])
    env = raw.get("environment")
    return StoredPlacement(placement=placement, environment=env if isinstance(env, str) else None,
                           gang=[m for m in gang if isinstance(m, str)] if isinstance(gang, list) else [],
                           device_indices=[i for i in devices if isinstance(i, int)] if isinstance(devices, list)
                           else [])


def dump_placement(placement: Mapping[str, Any] | None, worker: str) -> str:
    """A claim's placement, as the claiming ``worker`` sent it, as ``attempts.placement_json``: only
    the fields of a one-host placement (:class:`PlacementModel`), its ``worker`` the claimer's proven
    node id. Nothing the claimer sends can name other nodes (a ``gang`` list is the owner's own,
    :func:`gang_placement`)."""
    if not placement:
        return "{}"
    kept = {k: v for k, v in placement.items() if k in PlacementModel.model_fields}
    kept["worker"] = worker
    return json.dumps(kept)


def gang_placement(members: Sequence[str], master: str, hold_id: str) -> str:
    """A gang attempt's ``attempts.placement_json``: its members in rank order, rank 0's
    ``address:port`` and the hold."""
    return json.dumps({"gang": list(members), "master": master, "hold_id": hold_id})


def spec_of(text: str) -> JobSpec:
    """A stored spec (``spec_json``).

    Raises:
        pydantic.ValidationError: the text is not a spec (a damaged row).
    """
    return JobSpec.model_validate_json(text)


def _field(text: str, name: str) -> str | None:
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    value = raw.get(name) if isinstance(raw, dict) else None
    return value if isinstance(value, str) else None


def spec_user(text: str) -> str:
    """The ``user`` of a stored spec without validating the rest ("" when there is none or it does not parse)."""
    return _field(text, "user") or ""


def spec_name(text: str) -> str | None:
    """The ``name`` of a stored spec without validating the rest (None when there is none)."""
    return _field(text, "name")


def explanation_of(text: str | None) -> ExplanationModel | None:
    """A stored explanation (``jobs.explanation_json``); None when there is none or it does not parse."""
    if not text:
        return None
    try:
        return ExplanationModel.model_validate_json(text)
    except ValidationError:
        return None
