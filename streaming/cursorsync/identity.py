"""The identity digest of a message, the evidence of identity alignment.

The replicator copies producer name, sequence id, publish and event time,
keys, properties and payload unchanged, so a digest over those fields is the
same on both clusters for the same message. The encoding is canonical and
unambiguous: every field present is written as a one-byte tag plus a
length-prefixed value, in one fixed order whatever order the caller lists the
fields in; properties are sorted by key. Properties the brokers add
themselves (every ``__``-prefixed key, among them the replication
source-position stamp, which exists on the target only) are left out, or
source and target would never match.

Pure: no Pulsar, no Spark.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cursorsync.errors import ConfigError

#: The property brokers since 3.0.11 / 3.3.6 / 4.0.4 stamp on replicated entries ("L:E").
REPL_SOURCE_POSITION_PROPERTY = "__MSG_PROP_REPL_SOURCE_POSITION"

#: Every field the digest can cover, in the fixed order it encodes them.
IDENTITY_FIELDS: tuple[str, ...] = (
    "producer_name",
    "sequence_id",
    "publish_time",
    "event_time",
    "partition_key",
    "ordering_key",
    "properties",
    "payload",
)

#: The default: what the Python client exposes (it does not expose sequence_id).
DEFAULT_IDENTITY_FIELDS: tuple[str, ...] = tuple(f for f in IDENTITY_FIELDS if f != "sequence_id")

DIGEST_SIZE = 16
_PERSON_MESSAGE = b"cursorsync.msg1"
_PERSON_ENTRY = b"cursorsync.ent1"
_TAGS = {name: i + 1 for i, name in enumerate(IDENTITY_FIELDS)}
_ABSENT = b"\x00"
_PRESENT = b"\x01"


@dataclass(frozen=True)
class MessageIdentity:
    """The replicated fields of one message; None means the field is not set / not known."""

    producer_name: str | None = None
    sequence_id: int | None = None
    publish_time: int | None = None
    event_time: int | None = None
    partition_key: str | None = None
    ordering_key: bytes | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    payload: bytes = b""


def parse_identity_fields(spec: str | Iterable[str]) -> tuple[str, ...]:
    """Validate a field list (comma-separated string or iterable) into canonical order.

    Raises ConfigError naming the unknown field and the valid ones.
    """
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    if not names:
        raise ConfigError(
            f"identityFields is empty. Valid values are: {', '.join(IDENTITY_FIELDS)}"
        )
    unknown = sorted(set(names) - set(IDENTITY_FIELDS))
    if unknown:
        raise ConfigError(
            f"identityFields: {', '.join(unknown)} is not a valid field. "
            f"Valid values are: {', '.join(IDENTITY_FIELDS)}"
        )
    chosen = set(names)
    return tuple(f for f in IDENTITY_FIELDS if f in chosen)


def is_broker_property(key: str, extra_excluded: Iterable[str] = ()) -> bool:
    """True for properties the brokers add (``__`` prefix) or that the caller excludes."""
    return key.startswith("__") or key in set(extra_excluded)


_U64 = struct.Struct(">Q").pack
_I64 = struct.Struct(">q").pack


def _lp(data: bytes) -> bytes:
    return _U64(len(data)) + data


def _encode_str(value: str | None) -> bytes:
    return _ABSENT if value is None else _PRESENT + _lp(value.encode("utf-8"))


def _encode_int(value: int | None) -> bytes:
    return _ABSENT if value is None else _PRESENT + _I64(value)


def _encode_bytes(value: bytes | None) -> bytes:
    return _ABSENT if value is None else _PRESENT + _lp(bytes(value))


def _encode_properties(props: Mapping[str, str], excluded: frozenset[str]) -> bytes:
    kept = sorted(
        (k.encode("utf-8"), v.encode("utf-8"))
        for k, v in props.items()
        if not (k.startswith("__") or k in excluded)
    )
    out = [_PRESENT, _U64(len(kept))]
    for k, v in kept:
        out.append(_lp(k))
        out.append(_lp(v))
    return b"".join(out)


#: How each field is encoded (after its one-byte tag).
_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "producer_name": _encode_str,
    "sequence_id": _encode_int,
    "publish_time": _encode_int,
    "event_time": _encode_int,
    "partition_key": _encode_str,
    "ordering_key": _encode_bytes,
    "payload": _encode_bytes,
}


@functools.lru_cache(maxsize=64)
def _plan(fields: tuple[str, ...], excluded: tuple[str, ...]
          ) -> tuple[tuple[tuple[bytes, str], ...], frozenset[str]]:
    """Canonical (tag, field) order and the excluded set, once per field list: the digest
    runs for every message read."""
    chosen = parse_identity_fields(fields)
    return tuple((bytes([_TAGS[n]]), n) for n in chosen), frozenset(excluded)


def message_digest(
    message: MessageIdentity,
    fields: Sequence[str] = DEFAULT_IDENTITY_FIELDS,
    *,
    excluded_properties: Iterable[str] = (REPL_SOURCE_POSITION_PROPERTY,),
) -> bytes:
    """blake2b-128 over the canonical encoding of the chosen fields of ``message``.

    ``fields`` may be in any order (it is canonicalised); properties starting
    with ``__`` and those in ``excluded_properties`` never count.
    """
    order, excluded = _plan(tuple(fields), tuple(excluded_properties))
    parts: list[bytes] = []
    for tag, name in order:
        parts.append(tag)
        if name == "properties":
            parts.append(_encode_properties(message.properties, excluded))
        else:
            parts.append(_ENCODERS[name](getattr(message, name)))
    return hashlib.blake2b(b"".join(parts), digest_size=DIGEST_SIZE,
                           person=_PERSON_MESSAGE).digest()


def entry_digest(message_digests: Sequence[bytes]) -> bytes:
    """Digest of a (batched) entry: its messages' digests in batch order, plus the batch size."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE, person=_PERSON_ENTRY)
    h.update(struct.pack(">Q", len(message_digests)))
    for d in message_digests:
        if len(d) != DIGEST_SIZE:
            raise ValueError(f"a message digest has {DIGEST_SIZE} bytes, got {len(d)}")
        h.update(d)
    return h.digest()
