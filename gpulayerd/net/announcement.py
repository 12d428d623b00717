"""What a daemon advertises over mDNS, and its TXT record: encoding and decoding.

Each daemon advertises one :class:`Announcement`; its TXT record is a small versioned
summary (see :func:`encode_txt`) that peers read back with :func:`decode_txt`. Full
capabilities travel over the authenticated API. Pure functions over values: the
zeroconf service that sends and receives these records is :mod:`gpulayerd.net.mdns`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator

__all__ = [
    "TXT_ITEM_MAX_BYTES",
    "TXT_TOTAL_MAX_BYTES",
    "TXT_VERSION",
    "Announcement",
    "TxtRecord",
    "decode_txt",
    "encode_txt",
    "parse_txt",
]

TXT_VERSION = 1
"""The ``v`` we write. Readers accept any ``v >= 1`` and read the keys they know."""
TXT_ITEM_MAX_BYTES = 255
"""One ``key=value`` string (the DNS length byte's limit)."""
TXT_TOTAL_MAX_BYTES = 400
"""The whole TXT rdata (each item plus its length byte), kept well inside one packet."""
_NODE_ID_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
"""A node id must be one host-name label: it is also the SRV target ``<node id>.local.``."""
_NODE_ID_RE = re.compile(_NODE_ID_PATTERN)


@dataclass(frozen=True, slots=True, kw_only=True)
class Announcement:
    """What one daemon advertises, or what we read from a peer's advertisement.

    Attributes:
        node_id: the instance name and TXT ``id`` (one DNS label, 52 base32 characters in practice).
        name: the host's short name, for display (TXT ``name``; "" when a peer does not say).
        addresses: IP literals of the API (our chosen LAN addresses; a peer's A/AAAA records).
        port: the API's TCP port (TXT ``port`` and the SRV port).
        cluster: cluster id (TXT ``cluster``); peers of another cluster are foreign.
        ep: epoch, different on every daemon start (TXT ``ep``).
        version: TXT format version (``v``).
        gpus: number of GPUs (TXT ``gpus``); None when unknown.
        free: GPUs free for jobs right now (TXT ``free``); None when unknown.
    """

    node_id: str
    name: str
    addresses: tuple[str, ...]
    port: int
    cluster: str
    ep: str
    version: int = TXT_VERSION
    gpus: int | None = None
    free: int | None = None


class TxtRecord(TypedDict):
    """A peer's TXT record as :func:`decode_txt` reads it; None means the key was missing or unreadable."""

    v: int
    id: str
    port: int
    cluster: str
    ep: str
    gpus: int | None
    free: int | None
    name: str | None


def encode_txt(a: Announcement) -> dict[str, str]:
    """The TXT properties for ``a``: ``v, id, port, cluster, [gpus], [free], ep, [name]``.

    Keys whose value is unknown (None) or empty (``name``) are left out.

    Raises:
        ValueError: a field is out of range (node id not a DNS label, port, negative counts,
            empty epoch), an item is over :data:`TXT_ITEM_MAX_BYTES`, or the record is over
            :data:`TXT_TOTAL_MAX_BYTES`.
    """
    if not _NODE_ID_RE.match(a.node_id):
        raise ValueError(f"node id {a.node_id!r} is not a DNS label (letters, digits, '-'; at most 63)")
    if not 1 <= a.port <= 65535:
        raise ValueError(f"port {a.port} is not in 1..65535")
    if a.version < 1:
        raise ValueError(f"TXT version {a.version} is not >= 1")
    for key, count in (("gpus", a.gpus), ("free", a.free)):
        if count is not None and count < 0:
            raise ValueError(f"{key}={count} is negative")
    if not a.ep:
        raise ValueError("the epoch (ep) is empty")

    items: dict[str, str] = {"v": str(a.version), "id": a.node_id, "port": str(a.port), "cluster": a.cluster}
    if a.gpus is not None:
        items["gpus"] = str(a.gpus)
    if a.free is not None:
        items["free"] = str(a.free)
    items["ep"] = a.ep
    if a.name:
        items["name"] = a.name

    total_bytes = 0
    for key, value in items.items():
        item_bytes = len(f"{key}={value}".encode())
        if item_bytes > TXT_ITEM_MAX_BYTES:
            raise ValueError(f"TXT item {key!r} is {item_bytes} bytes; the limit is {TXT_ITEM_MAX_BYTES}")
        total_bytes += 1 + item_bytes
    if total_bytes > TXT_TOTAL_MAX_BYTES:
        raise ValueError(f"TXT record is {total_bytes} bytes; the limit is {TXT_TOTAL_MAX_BYTES}")
    return items


def decode_txt(props: Mapping[bytes, bytes | None]) -> TxtRecord | None:
    """Read a peer's TXT properties (zeroconf's ``ServiceInfo.properties``).

    Unknown keys are ignored and key case does not matter. A missing or unreadable
    ``gpus``, ``free`` or ``name`` becomes None.

    Returns:
        The record, or None when ``v``, ``id``, ``port``, ``cluster`` or ``ep`` is missing
        or invalid (the record cannot be used).
    """
    return parse_txt(props)[0]


class _TxtModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: int = Field(ge=1)
    id: str = Field(pattern=_NODE_ID_PATTERN)
    port: int = Field(ge=1, le=65535)
    cluster: str
    ep: str = Field(min_length=1)
    gpus: int | None = Field(default=None, ge=0)
    free: int | None = Field(default=None, ge=0)
    name: str | None = None

    @field_validator("gpus", "free", "name", mode="wrap")
    @classmethod
    def _unknown_if_unreadable(cls, value: object, handler: ValidatorFunctionWrapHandler) -> object:
        try:
            return handler(value)
        except ValidationError:
            return None


def parse_txt(props: Mapping[bytes, bytes | None]) -> tuple[TxtRecord | None, str]:
    """Read a peer's TXT properties like :func:`decode_txt`, and say why when it cannot.

    Returns:
        ``(record, "")``, or ``(None, reason)`` where ``reason`` names each unusable key
        and what is wrong with it.
    """
    fields: dict[str, str] = {}
    try:
        items = list(props.items())
    except (AttributeError, TypeError):
        return None, "not a TXT property mapping"
    for raw_key, raw_value in items:
        if not isinstance(raw_key, bytes) or not isinstance(raw_value, bytes):
            continue  # a boolean attribute (no '=') or not bytes at all
        try:
            key = raw_key.decode("ascii").lower()
            value = raw_value.decode("utf-8")
        except UnicodeDecodeError:
            continue
        fields.setdefault(key, value)
    try:
        m = _TxtModel.model_validate(fields)
    except ValidationError as e:
        reason = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        return None, reason
    record: TxtRecord = {
        "v": m.v,
        "id": m.id,
        "port": m.port,
        "cluster": m.cluster,
        "ep": m.ep,
        "gpus": m.gpus,
        "free": m.free,
        "name": m.name,
    }
    return record, ""
