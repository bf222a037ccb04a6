"""Parse the Pulsar admin API's JSON into cursorsync values (pure, no I/O).

``internalStats`` lists the topic's ledgers with their entry counts, but the
count of the last (open) ledger is 0 until the ledger is closed: the broker
copies it from the ledger's metadata, which is only written on close (the
live count is in ``currentLedgerEntries`` / ``lastConfirmedEntry``). We take
the open ledger's count from ``lastConfirmedEntry`` when it points into that
ledger, else from ``currentLedgerEntries``.

Cursors named ``pulsar.repl.<cluster>`` belong to replicators, not
subscriptions, and are kept apart. Anything malformed raises MalformedAdminOutputError naming
the topic and the field.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import INT64_MAX, INT64_MIN, Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import MalformedAdminOutputError, PositionFormatError, show_name
from cursorsync.pulsar.topics import TopicName

REPLICATOR_CURSOR_PREFIX = "pulsar.repl."


@dataclass(frozen=True)
class CursorStats:
    """One cursor of internalStats: its state for translation plus what we record about it."""

    name: str
    state: CursorState
    read_position: Position | None
    messages_consumed_counter: int
    individually_deleted_text: str
    properties: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_replicator(self) -> bool:
        return self.name.startswith(REPLICATOR_CURSOR_PREFIX)


@dataclass(frozen=True)
class TopicInternalStats:
    """internalStats of one topic partition."""

    topic: str
    ledgers: Ledgers
    last_confirmed_entry: Position
    entries_added_counter: int
    state: str
    subscriptions: Mapping[str, CursorStats]
    replicators: Mapping[str, CursorStats]
    #: Entries and bytes over the ledgers kept (None: not in the answer).
    number_of_entries: int | None = None
    total_size: int | None = None


@dataclass(frozen=True)
class PartitionedInternalStats:
    """partitioned-internalStats: the partition count and each partition's internalStats."""

    topic: str
    partitions: int
    stats: Mapping[str, TopicInternalStats]


def parse_json(what: str, text: str | bytes) -> Any:
    """JSON, or MalformedAdminOutputError naming what was being read."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedAdminOutputError(
            f"{what}: the admin API returned malformed JSON ({e})"
        ) from e
    except RecursionError:
        raise MalformedAdminOutputError(
            f"{what}: the admin API returned JSON nested too deeply to read"
        ) from None


def _field(topic: str, doc: Mapping[str, Any], name: str, kind: type | tuple[type, ...],
           where: str = "") -> Any:
    if not isinstance(doc, Mapping):
        raise MalformedAdminOutputError(f"{topic}: {where or 'response'} is not a JSON object")
    if name not in doc:
        raise MalformedAdminOutputError(
            f"{topic}: field {where + '.' if where else ''}{name} is missing"
        )
    value = doc[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedAdminOutputError(
            f"{topic}: field {where + '.' if where else ''}{name} has an unexpected type "
            f"({type(value).__name__}: {value!r})"
        )
    return value


def _int_field(topic: str, doc: Mapping[str, Any], name: str, where: str = "",
               default: int | None = None) -> int:
    if default is not None and isinstance(doc, Mapping) and doc.get(name) is None:
        return default
    value = _field(topic, doc, name, int, where)
    assert isinstance(value, int)
    if not INT64_MIN <= value <= INT64_MAX:
        raise MalformedAdminOutputError(
            f"{topic}: field {where + '.' if where else ''}{name} does not fit in a 64-bit "
            f"long ({value})"
        )
    return value


def _optional(topic: str, doc: Mapping[str, Any], name: str, kind: type,
              where: str = "") -> Any:
    """A field that may be absent or null (None then), else of ``kind``."""
    return None if doc.get(name) is None else _field(topic, doc, name, kind, where)


#: A read position the broker writes with its ack set: ``7326:1 (ackSet is null)`` (a cursor
#: whose consumer seeks or acks by message id, as the probe's does).
_ANNOTATED = re.compile(r"(-?\d+:-?\d+) \(ackSet [^()]*\)")


def _position(topic: str, text: str, where: str) -> Position:
    try:
        return Position.parse(text)
    except PositionFormatError as e:
        raise MalformedAdminOutputError(
            f"{topic}: field {where} is not a position: {text!r}"
        ) from e


def parse_ledgers(topic: str, doc: Mapping[str, Any]) -> tuple[Ledgers, Position]:
    """The topic's ledgers with the open ledger's count fixed, and lastConfirmedEntry."""
    lce = _position(topic, _field(topic, doc, "lastConfirmedEntry", str), "lastConfirmedEntry")
    rows = _field(topic, doc, "ledgers", list)
    pairs: list[tuple[int, int]] = []
    for i, row in enumerate(rows):
        where = f"ledgers[{i}]"
        pairs.append((_int_field(topic, row, "ledgerId", where),
                      _int_field(topic, row, "entries", where, default=0)))
        if pairs[-1][1] < 0:
            raise MalformedAdminOutputError(
                f"{topic}: field {where}.entries is negative ({pairs[-1][1]})"
            )
    pairs.sort()
    if pairs:
        last_id, reported = pairs[-1]
        if lce.ledger == last_id:
            live = lce.entry + 1
        else:
            live = _int_field(topic, doc, "currentLedgerEntries", default=0)
        if live > INT64_MAX:
            raise MalformedAdminOutputError(
                f"{topic}: field lastConfirmedEntry {lce} leaves no room for its entry count"
            )
        pairs[-1] = (last_id, max(reported, live))
    ids = [p[0] for p in pairs]
    if len(set(ids)) != len(ids):
        twice = next(a for a, b in itertools.pairwise(ids) if a == b)
        raise MalformedAdminOutputError(
            f"{topic}: field ledgers lists ledger id {twice} twice"
        )
    try:
        ledgers = Ledgers.of(pairs)
    except ValueError as e:
        raise MalformedAdminOutputError(f"{topic}: field ledgers is inconsistent: {e}") from e
    return ledgers, lce


def parse_cursor(topic: str, name: str, doc: Mapping[str, Any], ledgers: Ledgers) -> CursorStats:
    where = f"cursors.{show_name(name)}"
    md = _position(topic, _field(topic, doc, "markDeletePosition", str, where),
                   f"{where}.markDeletePosition")
    idm_text = doc.get("individuallyDeletedMessages") if isinstance(doc, Mapping) else None
    idm_text = "[]" if idm_text is None else idm_text
    if not isinstance(idm_text, str):
        raise MalformedAdminOutputError(
            f"{topic}: field {where}.individuallyDeletedMessages is not a string"
        )
    try:
        idm = RangeSet.parse(idm_text)
    except (PositionFormatError, ValueError) as e:
        shown = idm_text if len(idm_text) <= 200 else f"{idm_text[:200]}..."
        raise MalformedAdminOutputError(
            f"{topic}: field {where}.individuallyDeletedMessages is malformed: {shown!r} ({e})"
        ) from e
    rp_text = _optional(topic, doc, "readPosition", str, where)
    if rp_text is not None and (annotated := _ANNOTATED.fullmatch(rp_text)):
        rp_text = annotated[1]
    read_position = (None if rp_text is None
                     else _position(topic, rp_text, f"{where}.readPosition"))
    props = doc.get("properties")
    props = {} if props is None else props
    if not isinstance(props, Mapping):
        raise MalformedAdminOutputError(f"{topic}: field {where}.properties is not an object")
    return CursorStats(
        name=name,
        state=CursorState(md, idm, ledgers),
        read_position=read_position,
        messages_consumed_counter=_int_field(topic, doc, "messagesConsumedCounter", where,
                                             default=0),
        individually_deleted_text=idm_text,
        properties=dict(props),
    )


def parse_internal_stats(topic: str | TopicName, doc: Any) -> TopicInternalStats:
    """``GET .../internalStats`` of one topic partition."""
    name = str(topic)
    if not isinstance(doc, Mapping):
        raise MalformedAdminOutputError(f"{name}: internalStats is not a JSON object")
    ledgers, lce = parse_ledgers(name, doc)
    cursors = doc.get("cursors")
    cursors = {} if cursors is None else cursors
    if not isinstance(cursors, Mapping):
        raise MalformedAdminOutputError(f"{name}: field cursors is not an object")
    subs: dict[str, CursorStats] = {}
    repls: dict[str, CursorStats] = {}
    for cname in sorted(cursors):
        cs = parse_cursor(name, cname, cursors[cname], ledgers)
        (repls if cs.is_replicator else subs)[cname] = cs
    state = _optional(name, doc, "state", str)
    return TopicInternalStats(
        topic=name,
        ledgers=ledgers,
        last_confirmed_entry=lce,
        entries_added_counter=_int_field(name, doc, "entriesAddedCounter", default=0),
        state=state or "",
        subscriptions=subs,
        replicators=repls,
        number_of_entries=_optional(name, doc, "numberOfEntries", int),
        total_size=_optional(name, doc, "totalSize", int),
    )


def parse_partitioned_internal_stats(topic: str | TopicName, doc: Any) -> PartitionedInternalStats:
    """``GET .../partitioned-internalStats``: keys are partition topic names (full or local)."""
    name = str(topic)
    base = TopicName.parse(name)
    meta = _field(name, doc, "metadata", Mapping)
    n = _int_field(name, meta, "partitions", "metadata")
    parts = _field(name, doc, "partitions", Mapping)
    out: dict[str, TopicInternalStats] = {}
    for key in sorted(parts):
        if not key:
            raise MalformedAdminOutputError(f"{name}: field partitions has an empty topic key")
        try:
            pname = TopicName.parse(key) if "/" in key else TopicName(
                base.tenant, base.namespace, key)
        except ValueError as e:
            raise MalformedAdminOutputError(
                f"{name}: field partitions has a bad topic key {key!r}"
            ) from e
        out[str(pname)] = parse_internal_stats(pname, parts[key])
    return PartitionedInternalStats(name, n, out)


def parse_partitions(topic: str | TopicName, doc: Any) -> int:
    """``GET .../partitions`` -> partition count (0 = not partitioned)."""
    name = str(topic)
    n = _int_field(name, doc, "partitions")
    if n < 0:
        raise MalformedAdminOutputError(f"{name}: field partitions is negative ({n})")
    return n


def parse_creation_date(topic: str | TopicName, doc: Any) -> datetime:
    """``GET .../internal-info`` -> the managed ledger's ``creationDate`` (ISO 8601, UTC)."""
    name = str(topic)
    text = _field(name, doc, "creationDate", str)
    assert isinstance(text, str)
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise MalformedAdminOutputError(
            f"{name}: field creationDate is not an ISO 8601 time ({text[:40]!r})") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def parse_topic_list(namespace: str, doc: Any) -> list[str]:
    """``GET /admin/v2/persistent/{tenant}/{namespace}[/partitioned]`` -> topic names."""
    if not isinstance(doc, list) or not all(isinstance(t, str) for t in doc):
        raise MalformedAdminOutputError(
            f"namespace {namespace}: the topic list is not a JSON list of strings"
        )
    return list(doc)
