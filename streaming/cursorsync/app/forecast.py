"""The redelivery forecast: how many messages each subscription would get again on the
target if it failed over now, by cause (``cursorsync status --forecast``).

A message comes again after a failover when it is acked on the source and its copy is
unacked on the target. cursorsync leaves a copy unacked for four causes, counted apart:

* ``acked_unmapped``: the source entry was acked when the last sync observed the cursor,
  but no segment maps it, so the sync left its copy unacked (the rule: unknown means not
  acknowledged).
* ``acked_since_sync``: acked on the source after the last sync's observation; only a
  read of the source cursor now (``source_read``) shows them.
* ``partial_batches``: batches some of whose messages are acked. The broker's statistics
  show no batch-index acks: with brokers that keep none, the entry is unacked on the source
  too, and its acked messages come again there as well (not progress cursorsync drops), and
  the figure is a bound. With brokers that keep them and cursorsync's broker plugin on the
  source, the acked indexes are read: each one whose target copy is not acked, whole or at
  that index, comes again (exact with the plugin on the target too); an unacked batch it
  lists no indexes of adds a bound, as a consumer acking without batch-index acks leaves
  the broker no record of its acked messages.
* ``chunks``: the entries of chunked messages not mapped at the last sync (chunks map by
  their stamps, with ``position-property`` evidence only) or acked since.

Each figure says how far it can be trusted (:data:`Basis`): ``exact`` (cursorsync knows
every entry and how many messages it holds), ``bound`` (at most this many, with why) or
``unknown`` (at least ``at_least``, with why). Entries are counted from the tables and the
source's cursor; messages per entry, markers and chunks are read from the source's
admin API (one request per entry, at most :data:`FORECAST_LOOKUPS` a run) by
:mod:`cursorsync.app.forecast_read`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from cursorsync.app.status import DRY_RUN, StatusRow
from cursorsync.core.batches import PartialBatch
from cursorsync.core.cursor import CursorState, Outcome
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import TopicMapping
from cursorsync.core.translate import unmapped_source
from cursorsync.pulsar.raw_entry import RawEntry

Cause = Literal["acked_unmapped", "acked_since_sync", "partial_batches", "chunks"]
CAUSES: tuple[Cause, ...] = get_args(Cause)
Basis = Literal["exact", "bound", "unknown"]
_WORST: dict[str, int] = {"exact": 0, "bound": 1, "unknown": 2}

#: Source entries read (one admin request each) per forecast at most: the acked entries
#: first, then the unacked ones whose batches may be partly acked.
FORECAST_LOOKUPS = 4096

#: The outcomes of a last sync whose plan was not sent: the target may lack more.
_NOT_SENT = ("halted", "refused", "failed")


@dataclass(frozen=True)
class Figure:
    """One cause's share: entries, and messages exact, at most (``bound``), or unknown (at
    least ``at_least``); ``why`` says what makes it a bound or unknown."""

    entries: int | None
    messages: int | None
    basis: Basis
    why: str = ""
    at_least: int = 0

    def __add__(self, other: Figure) -> Figure:
        basis = max(self.basis, other.basis, key=_WORST.__getitem__)
        messages = (None if basis == "unknown" or self.messages is None
                    or other.messages is None else self.messages + other.messages)
        whys = [w for w in dict.fromkeys((self.why, other.why)) if w]
        return Figure(_plus(self.entries, other.entries), messages, basis, "; ".join(whys),
                      self.floor + other.floor if basis == "unknown" else 0)

    @property
    def floor(self) -> int:
        """Messages at least: exact messages, 0 for a bound, ``at_least`` when unknown."""
        if self.basis == "exact":
            return self.messages or 0
        return self.at_least if self.basis == "unknown" else 0

    def covers(self, measured: int) -> bool:
        """Whether ``measured`` redeliveries agree with the figure: equal when exact, at most
        the bound, at least the floor when unknown."""
        if self.basis == "exact":
            return measured == self.messages
        if self.basis == "bound":
            return self.messages is not None and measured <= self.messages
        return measured >= self.at_least

    def to_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "messages": self.messages, "basis": self.basis,
                "at_least": self.at_least if self.basis == "unknown" else None,
                "why": self.why or None}


NOTHING = Figure(0, 0, "exact")


def added(figures: Iterable[Figure]) -> Figure:
    """Figures added up (NOTHING when there are none)."""
    out = NOTHING
    for f in figures:
        out = out + f
    return out


def _plus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def unknown(why: str, *, entries: int | None = None, at_least: int = 0) -> Figure:
    return Figure(entries, None, "unknown", why, at_least)


@dataclass(frozen=True)
class EntryFacts:
    """What the source's admin API says of one entry."""

    messages: int = 1
    marker: bool = False
    #: (chunk id, chunk count) of a chunked message's entry.
    chunk: tuple[int, int] | None = None

    @classmethod
    def of(cls, raw: RawEntry) -> EntryFacts:
        chunk = (None if raw.chunk_id is None or raw.num_chunks is None
                 else (raw.chunk_id, raw.num_chunks))
        return cls(raw.messages, raw.is_marker, chunk)


@dataclass(frozen=True)
class PartitionForecast:
    """The forecast of one (topic partition, subscription)."""

    row: StatusRow
    causes: Mapping[Cause, Figure]
    #: Whether the source cursor was read now (else acks since the last sync are unknown).
    source_read: bool

    @property
    def total(self) -> Figure:
        return added(self.causes[c] for c in CAUSES)

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {"topic": r.topic, "partition": r.partition,
                "partition_topic": r.key.concrete_topic(), "subscription": r.subscription,
                "source_read": self.source_read,
                "causes": {c: self.causes[c].to_dict() for c in CAUSES},
                "total": self.total.to_dict()}


@dataclass(frozen=True)
class SubscriptionForecast:
    """One subscription's forecast over its partitions: each cause added up."""

    subscription: str
    partitions: int
    causes: Mapping[Cause, Figure]

    @property
    def total(self) -> Figure:
        return added(self.causes[c] for c in CAUSES)

    def to_dict(self) -> dict[str, Any]:
        return {"subscription": self.subscription, "partitions": self.partitions,
                "causes": {c: self.causes[c].to_dict() for c in CAUSES},
                "total": self.total.to_dict()}


def by_subscription(parts: Iterable[PartitionForecast]) -> list[SubscriptionForecast]:
    """Each subscription's causes added up over its partitions, sorted by name."""
    groups: dict[str, list[PartitionForecast]] = {}
    for p in parts:
        groups.setdefault(p.row.subscription, []).append(p)
    out = []
    for sub in sorted(groups):
        causes = {c: added(p.causes[c] for p in groups[sub]) for c in CAUSES}
        out.append(SubscriptionForecast(sub, len(groups[sub]), causes))
    return out


# ------------------------------------------------------------------ the figures


@dataclass(frozen=True)
class Sources:
    """What one partition's forecast is made from, besides its status row."""

    #: The source cursor as the last sync observed it (newest ``cursor_states`` row).
    last: CursorState | None = None
    mapping: TopicMapping | None = None
    #: The source cursor now, and the source partition's last entry (None: not read).
    now: CursorState | None = None
    last_entry: Position | None = None
    #: Why the source was not read (when ``now`` is None).
    not_read: str = "the source was not read"
    target_ledgers: Ledgers | None = None
    #: The source cursor's partly acked batches now, from cursorsync's broker plugin (None:
    #: not read whole), and the target cursor's, by position (None: not read).
    source_batches: tuple[PartialBatch, ...] | None = None
    target_batches: Mapping[Position, PartialBatch] | None = None
    #: The target cursor's acked entries now (None: not read).
    target_acked: RangeSet | None = None


@dataclass(frozen=True)
class Questions:
    """The source entries one partition's forecast asks about, by question."""

    unmapped: RangeSet | None
    since: RangeSet | None
    unacked: RangeSet | None
    ledgers: Ledgers | None

    def count(self, which: RangeSet | None) -> int | None:
        """Entries in ``which`` (None: not known)."""
        return None if which is None or self.ledgers is None else which.count_entries(
            self.ledgers)

    def listed(self, which: RangeSet | None) -> list[Position] | None:
        """The entries of ``which``, or None when not known or more than can be read."""
        n = self.count(which)
        if which is None or n is None or n > FORECAST_LOOKUPS:
            return None
        return list(which.iter_entries(self.ledgers))


def questions(src: Sources, row: StatusRow | None = None) -> Questions:
    """The entries acked at the last sync and unmapped, acked since, and unacked now.

    None acked at the last sync is unmapped when ``row``, that sync's, counted none and
    was planned from a source state at least as new as ``src.last``, with its ledger list:
    the sync explained each (mapped, or a marker it looked up on the source), which the
    tables' mapping alone does not, so they need no reads (at a thousand partitions,
    thousands of them)."""
    ledgers = src.now.ledgers if src.now is not None else (
        src.last.ledgers if src.last is not None else None)
    unmapped = None
    if _explained_by_sync(row, src.last):
        unmapped = RangeSet()
    elif src.last is not None and src.mapping is not None and len(src.mapping.segments):
        state = CursorState(src.last.mark_delete, src.last.individually_deleted, ledgers)
        unmapped = unmapped_source(state, src.mapping, src.target_ledgers)
    since = unacked = None
    if src.now is not None:
        if src.last is not None:
            since = src.now.acked() - src.last.acked()
        if src.last_entry is not None:
            unacked = RangeSet.up_to(src.last_entry) - src.now.acked()
    return Questions(unmapped, since, unacked, ledgers)


def _explained_by_sync(row: StatusRow | None, last: CursorState | None) -> bool:
    """Whether ``row``'s sync counted no acked source entry unmapped in ``last``, the newest
    source state recorded (``observed_at``): its plan was exact (an ``unknown`` one, with
    no segment, counts nothing), from a state known current since, and counted with that
    state's ledger list (without one its count is only a floor)."""
    return (row is not None and row.planned_outcome == Outcome.EXACT
            and row.unmapped_acked_entries == 0
            and row.planned_from is not None and row.observed_at is not None
            and row.planned_from >= row.observed_at
            and last is not None and last.ledgers is not None and len(last.ledgers.ids) > 0)


def partition_forecast(row: StatusRow, src: Sources, q: Questions,
                       facts: Mapping[Position, EntryFacts], *,
                       index_acks: bool | None = None) -> PartitionForecast:
    """The four figures of one partition from what was read (``facts``: the entries the
    source's admin API was asked about; ``index_acks``: whether the source's brokers keep
    batch-index acks, None: not known)."""
    synced = _synced(row)
    if synced is not None:
        first = unknown(synced, at_least=row.unmapped_acked_entries or 0)
    elif q.unmapped is None:
        n = row.unmapped_acked_entries or 0
        first = unknown("no cursor state or segment recorded (acks from snapshot anchors "
                        "alone are not followed)", entries=n or None, at_least=n)
    else:
        first = _acked(q, q.unmapped, facts, src)
    second = (unknown(_since_unread(src)) if q.since is None
              else _acked(q, q.since, facts, src))
    causes: dict[Cause, Figure] = {
        "acked_unmapped": first,
        "acked_since_sync": second,
        "partial_batches": _partial(q, facts, src, index_acks),
        "chunks": _chunks(q, facts, src, known=synced is None and q.unmapped is not None),
    }
    return PartitionForecast(row, causes, src.now is not None)


def _synced(row: StatusRow) -> str | None:
    """Why the last sync says nothing of what the target holds (None: it does)."""
    if row.emitted_at is None:
        return "never synced"
    if row.dry_run:
        return f"{DRY_RUN}: nothing acked on the target, every acked message comes again"
    if row.outcome in _NOT_SENT:
        return f"the last plan was not sent ({row.outcome}): the target may lack more"
    return None


def _since_unread(src: Sources) -> str:
    if src.now is not None:
        return "no cursor state recorded for the last sync"
    return f"acks since the last observation: unknown ({src.not_read})"


def _acked(q: Questions, which: RangeSet, facts: Mapping[Position, EntryFacts],
           src: Sources) -> Figure:
    """Acked source entries whose copies are unacked on the target: every message of each
    data entry comes again."""
    n = q.count(which)
    entries = q.listed(which)
    if entries is None or any(p not in facts for p in entries):
        read = [facts[p] for p in entries or () if p in facts]
        return unknown(_not_read(src), entries=n,
                       at_least=sum(f.messages for f in read if _data(f)))
    data = [facts[p] for p in entries if _data(facts[p])]
    return Figure(len(data), sum(f.messages for f in data), "exact")


def _data(f: EntryFacts) -> bool:
    """A message entry: a marker is never delivered, and chunks are counted apart."""
    return not f.marker and f.chunk is None


def _chunks(q: Questions, facts: Mapping[Position, EntryFacts], src: Sources, *,
            known: bool) -> Figure:
    """Chunked messages acked at the last sync and not mapped, or acked since: every one
    comes again. Exact when each has its first and its last chunk among them, else at most one
    message per chunk entry."""
    if not known:
        return unknown("the acked entries are not known (see acked_unmapped)")
    listed = [q.listed(q.unmapped), q.listed(q.since) if q.since is not None else []]
    entries = (None if any(x is None for x in listed)
               else [p for x in listed for p in x or ()])
    if entries is None or any(p not in facts for p in entries):
        return unknown(_not_read(src) + "; chunks among the acked entries unknown")
    chunks = [c for p in entries if (c := facts[p].chunk) is not None]
    firsts = sum(1 for c in chunks if c[0] == 0)
    lasts = sum(1 for c in chunks if c[0] == c[1] - 1)
    if firsts == lasts:
        return Figure(len(chunks), lasts, "exact")
    return Figure(len(chunks), len(chunks), "bound",
                  "some chunked messages are acked in part: at most one per chunk entry")


def _partial(q: Questions, facts: Mapping[Position, EntryFacts], src: Sources,
             index_acks: bool | None = None) -> Figure:
    """Unacked batches whose messages may be acked in part. Where the source's brokers keep
    batch-index acks and the plugin read them, those batches are counted from what it read
    (:func:`_partial_read`); a consumer that acks without batch-index acks leaves the broker
    no record of a batch's acked messages, so every other unacked batch may hold some: at
    most every message but one of each (a batch with every message acked is acked as an
    entry). They come again on the source too."""
    if q.unacked is None:
        return unknown(f"unacked batches not read ({src.not_read})")
    # The acked indexes the source's brokers keep, where read (None: not usable here).
    kept = src.source_batches if index_acks and src.mapping is not None else None
    read = NOTHING if kept is None else _partial_read(kept, src)
    listed = frozenset(()) if kept is None else frozenset(b.position for b in kept)
    entries = q.listed(q.unacked)
    if entries is None or any(p not in facts for p in entries):
        return read + unknown(_not_read(src))
    batches = [facts[p].messages for p in entries
               if facts[p].messages > 1 and _data(facts[p]) and p not in listed]
    if not batches:
        return read
    why = (_UNLISTED if kept is not None else "the broker shows no batch-index acks: at most "
           f"every message but one of each unacked batch, {_ON_THE_SOURCE[index_acks]}")
    return read + Figure(len(batches), sum(n - 1 for n in batches), "bound", why)


#: Why unacked batches the source's brokers list no acked indexes of are a bound.
_UNLISTED = ("a consumer acking without batch-index acks leaves the broker no record of a "
             "batch's acked messages: at most every message but one of each unacked batch "
             "the brokers list no acked indexes of, which comes again on the source too")


def _partial_read(batches: tuple[PartialBatch, ...], src: Sources) -> Figure:
    """The source's acked batch indexes, read: each whose target copy is not acked, whole or
    at that index, comes again (an unmapped batch's all do). Exact when the target's cursor
    and batch indexes were read too; else at most every index acked on the source."""
    assert src.mapping is not None
    if not batches:
        return NOTHING
    known = src.target_batches is not None and src.target_acked is not None
    entries = messages = 0
    for b in batches:
        copies: list[Position | None] = [*src.mapping.segments.copies(b.position)] or [None]
        for t in copies:
            if t is not None and src.target_acked is not None and t in src.target_acked:
                continue
            held = None if t is None else (src.target_batches or {}).get(t)
            todo = b.acked - held.acked if held is not None and held.size == b.size else b.acked
            if todo:
                entries += 1
                messages += len(todo)
    if known:
        return Figure(entries, messages, "exact")
    return Figure(entries, messages, "bound",
                  "the target's batch indexes not read (no cursorsync plugin there): at most "
                  "every index acked on the source")


#: What a restart on the source would deliver of those messages, by whether the source's
#: brokers keep batch-index acks.
_ON_THE_SOURCE: dict[bool | None, str] = {
    False: "which comes again on the source too (its brokers keep no batch-index acks)",
    True: "of which the acked ones would not come again on the source: its brokers keep "
          "batch-index acks (acknowledgmentAtBatchIndexLevelEnabled)",
    None: "which comes again on the source too unless its brokers keep batch-index acks "
          "(acknowledgmentAtBatchIndexLevelEnabled; not readable here)",
}


def _not_read(src: Sources) -> str:
    """Why a figure is unknown for want of entry reads. It names no count (the figure's
    ``entries`` holds it), so a sum over many partitions says it once."""
    if src.now is None:
        return f"messages per entry not read ({src.not_read})"
    return (f"not every entry read (at most {FORECAST_LOOKUPS} a forecast; or a read "
            "failed: see the log)")


__all__ = [
    "CAUSES",
    "FORECAST_LOOKUPS",
    "Basis",
    "Cause",
    "EntryFacts",
    "Figure",
    "PartitionForecast",
    "Questions",
    "Sources",
    "SubscriptionForecast",
    "by_subscription",
    "partition_forecast",
    "questions",
]
