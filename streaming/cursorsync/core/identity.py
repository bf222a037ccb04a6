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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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


_U64 = struct.Struct(">Q").pack
_I64 = struct.Struct(">q").pack


class Digester:
    """:func:`message_digest` for one field list, planned once: the entries source digests
    every message it reads, so the field list is not re-validated, nor a
    MessageIdentity built, per message. Called with the field values (None: not set).
    """

    __slots__ = ("_excluded", "_flags", "_hasher")

    def __init__(self, fields: Sequence[str] = DEFAULT_IDENTITY_FIELDS,
                 excluded_properties: Iterable[str] = (REPL_SOURCE_POSITION_PROPERTY,)) -> None:
        want = set(parse_identity_fields(tuple(fields)))
        self._flags = tuple(name in want for name in IDENTITY_FIELDS)
        self._excluded = frozenset(excluded_properties)
        # Copied per message: cheaper than a new hasher's keyword parsing.
        self._hasher = hashlib.blake2b(digest_size=DIGEST_SIZE, person=_PERSON_MESSAGE)

    def __call__(self, producer_name: str | None = None, sequence_id: int | None = None,
                 publish_time: int | None = None, event_time: int | None = None,
                 partition_key: str | None = None, ordering_key: bytes | None = None,
                 properties: Mapping[str, str] | None = None, payload: bytes = b"") -> bytes:
        # One buffer, in IDENTITY_FIELDS order: the tag (the field's 1-based place in
        # IDENTITY_FIELDS), then 0 for absent or 1 + the value (strings and bytes
        # length-prefixed, integers as signed 64-bit). Written inline, as pieces joined
        # once: this runs for every message the entries source reads.
        f_prod, f_seq, f_pub, f_ev, f_pkey, f_okey, f_props, f_pay = self._flags
        parts: list[bytes] = []
        if f_prod:
            if producer_name is None:
                parts.append(b"\x01\x00")
            else:
                data = producer_name.encode("utf-8")
                parts += (b"\x01\x01", _U64(len(data)), data)
        if f_seq:
            parts.append(b"\x02\x00" if sequence_id is None else b"\x02\x01" + _I64(sequence_id))
        if f_pub:
            parts.append(b"\x03\x00" if publish_time is None
                         else b"\x03\x01" + _I64(publish_time))
        if f_ev:
            parts.append(b"\x04\x00" if event_time is None else b"\x04\x01" + _I64(event_time))
        if f_pkey:
            if partition_key is None:
                parts.append(b"\x05\x00")
            else:
                data = partition_key.encode("utf-8")
                parts += (b"\x05\x01", _U64(len(data)), data)
        if f_okey:
            if ordering_key is None:
                parts.append(b"\x06\x00")
            else:
                data = bytes(ordering_key)
                parts += (b"\x06\x01", _U64(len(data)), data)
        if f_props:
            excluded = self._excluded
            kept = [(k.encode("utf-8"), v.encode("utf-8")) for k, v in (properties or {}).items()
                    if not (k.startswith("__") or k in excluded)]
            if len(kept) > 1:
                kept.sort()
            parts += (b"\x07\x01", _U64(len(kept)))
            for k, v in kept:
                parts += (_U64(len(k)), k, _U64(len(v)), v)
        if f_pay:
            data = bytes(payload)
            parts += (b"\x08\x01", _U64(len(data)), data)
        hasher = self._hasher.copy()
        hasher.update(b"".join(parts))
        return hasher.digest()


@functools.lru_cache(maxsize=64)
def _digester(fields: tuple[str, ...], excluded: tuple[str, ...]) -> Digester:
    return Digester(fields, excluded)


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
    m = message
    return _digester(tuple(fields), tuple(excluded_properties))(
        m.producer_name, m.sequence_id, m.publish_time, m.event_time, m.partition_key,
        m.ordering_key, m.properties, m.payload)


def entry_digest(message_digests: Sequence[bytes]) -> bytes:
    """Digest of a (batched) entry: its messages' digests in batch order, plus the batch size."""
    for d in message_digests:
        if len(d) != DIGEST_SIZE:
            raise ValueError(f"a message digest has {DIGEST_SIZE} bytes, got {len(d)}")
    h = _ENTRY_HASHER.copy()
    h.update(_U64(len(message_digests)) + b"".join(message_digests))
    return h.digest()


#: Copied per entry (see Digester._hasher).
_ENTRY_HASHER = hashlib.blake2b(digest_size=DIGEST_SIZE, person=_PERSON_ENTRY)
