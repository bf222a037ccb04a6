"""Cross-cluster mappings: segments of source entries matched to target entries.

A segment says: ``count`` consecutive entries from ``source_ledger:source_entry``
are the entries from ``target_ledger:target_entry`` on the target, in order.
Evidence (pairs of source -> target positions) collapses into segments, so a
steady stream costs a handful of segments per ledger, not one per message.

Every target entry has at most one source entry; a source entry may have several
target copies. Pulsar's replicator is at least once: after a source broker
crash it sends again, from its last persisted position, entries the target
already holds, and each copy carries the same source position.

The store (:class:`TopicMapping`) only stores and looks up; translation lives
in :mod:`cursorsync.core.translate`, emission elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from cursorsync.core import sorting
from cursorsync.core.anchors import Anchors
from cursorsync.core.keys import I64
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import MappingConflictError

Evidence = Literal["position-property", "identity", "snapshot"]
EVIDENCE: tuple[Evidence, ...] = get_args(Evidence)
RunKind = Literal["skippable", "foreign", "unreplicated", "unpaired"]


def evidence_code(evidence: Evidence) -> int:
    try:
        return EVIDENCE.index(evidence)
    except ValueError:
        raise ValueError(
            f"{evidence!r} is not a valid evidence. Valid values are: {', '.join(EVIDENCE)}"
        ) from None


def evidence_mask(evidence: str) -> int:
    """A segment's evidence summary (kinds joined by commas) -> its bit-set (bit i is
    ``EVIDENCE[i]``). Evidence summarises a segment; it never breaks one."""
    mask = 0
    for kind in evidence.split(","):
        mask |= 1 << evidence_code(kind)  # type: ignore[arg-type]
    return mask


def evidence_names(mask: int) -> str:
    """The kinds present in an evidence bit-set, in :data:`EVIDENCE` order, joined by commas."""
    return ",".join(e for i, e in enumerate(EVIDENCE) if mask >> i & 1)


@dataclass(frozen=True, order=True, slots=True)
class Segment:
    """``count`` entries from source ``ledger:entry`` map one to one onto target ones."""

    source_ledger: int
    source_entry: int
    target_ledger: int
    target_entry: int
    count: int
    #: The evidence kinds that produced the segment's entries, joined by commas.
    evidence: str = "position-property"

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise ValueError(f"segment {self} has no entries")
        if self.source_entry < 0 or self.target_entry < 0:
            raise ValueError(f"segment {self} starts before entry 0")

    def lookup(self, position: Position) -> Position | None:
        k = position.entry - self.source_entry
        if position.ledger == self.source_ledger and 0 <= k < self.count:
            return Position(self.target_ledger, self.target_entry + k)
        return None

    def __str__(self) -> str:
        return (f"{self.source_ledger}:{self.source_entry}+{self.count}"
                f"->{self.target_ledger}:{self.target_entry} ({self.evidence})")


class SegmentSet:
    """Segments of one topic partition, sorted by source position (then target).

    Invariant (:meth:`conflicts` is empty): no target entry is claimed twice, so
    each target entry has one source. Source entries may be claimed more than once
    (copies a replicator sent again), and then target order and source order need
    not agree. Arrays, not objects, so that translation never loops over segments
    in Python. Evidence is a per-segment bit-set of the kinds that produced it
    (:func:`evidence_mask`): runs join whatever evidence produced them.
    """

    __slots__ = ("_a", "_ev", "_source")

    def __init__(self, rows: I64 | None = None, evidence: npt.NDArray[np.int8] | None = None,
                 *, validate: bool = True) -> None:
        a = np.empty((0, 5), dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        a = a.reshape(-1, 5)
        ev = (np.full(len(a), 1, np.int8) if evidence is None
              else np.asarray(evidence, np.int8))
        order = sorting.lexsort((a[:, 3], a[:, 2], a[:, 1], a[:, 0]))
        a, ev = a[order], ev[order]
        a.setflags(write=False)
        ev.setflags(write=False)
        self._a: I64 = a
        self._ev = ev
        self._source: RangeSet | None = None
        if validate:
            bad = self.conflicts()
            if bad:
                shown = "; ".join(f"{self[i]} vs {self[j]}: {why}" for i, j, why in bad[:10])
                more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
                raise MappingConflictError(f"conflicting segments: {shown}{more}")

    @classmethod
    def of(cls, segments: Iterable[Segment], *, validate: bool = True) -> SegmentSet:
        segs = list(segments)
        rows = np.array(
            [(s.source_ledger, s.source_entry, s.target_ledger, s.target_entry, s.count)
             for s in segs], dtype=np.int64).reshape(-1, 5)
        ev = np.array([evidence_mask(s.evidence) for s in segs], dtype=np.int8)
        return cls(rows, ev, validate=validate)

    @classmethod
    def from_pairs(
        cls,
        source_ledger: I64,
        source_entry: I64,
        target_ledger: I64,
        target_entry: I64,
        evidence: Evidence | npt.NDArray[np.int8] = "position-property",
        *,
        validate: bool = True,
    ) -> SegmentSet:
        """Collapse (source -> target) entry pairs into runs: one segment per unbroken run.

        ``evidence``: one kind, or each pair's :func:`evidence_code`. Runs follow the
        target: a run breaks where either side changes ledger or skips an entry; the
        evidence of its pairs is kept as the run's bit-set. Duplicate identical pairs are
        dropped; two sources claimed for one target entry are left for validation
        to name.
        """
        sl = np.asarray(source_ledger, np.int64)
        se = np.asarray(source_entry, np.int64)
        tl = np.asarray(target_ledger, np.int64)
        te = np.asarray(target_entry, np.int64)
        if isinstance(evidence, str):
            ev = np.full(len(sl), evidence_code(evidence), np.int8)
        else:
            ev = np.asarray(evidence, np.int8)
        ev = np.left_shift(np.int8(1), ev).astype(np.int8)
        if len(sl) == 0:
            return cls(validate=validate)
        order = sorting.lexsort((se, sl, te, tl))
        sl, se, tl, te, ev = sl[order], se[order], tl[order], te[order], ev[order]
        dup = np.concatenate(([False], (sl[1:] == sl[:-1]) & (se[1:] == se[:-1])
                              & (tl[1:] == tl[:-1]) & (te[1:] == te[:-1])))
        # A run (and so a duplicate) keeps every kind of evidence its pairs had.
        cont = np.concatenate(([False], (sl[1:] == sl[:-1]) & (se[1:] == se[:-1] + 1)
                               & (tl[1:] == tl[:-1]) & (te[1:] == te[:-1] + 1)))
        starts = np.flatnonzero(~(cont | dup))
        ev = np.bitwise_or.reduceat(ev, starts)
        keep = ~dup
        sl, se, tl, te = sl[keep], se[keep], tl[keep], te[keep]
        cont = cont[keep]
        starts = np.flatnonzero(~cont)
        counts = np.diff(np.concatenate((starts, [len(sl)])))
        rows = np.stack([sl[starts], se[starts], tl[starts], te[starts], counts], axis=1)
        return cls(rows, ev, validate=validate)

    # -- access
    @property
    def rows(self) -> I64:
        """(n, 5): source ledger, source entry, target ledger, target entry, count."""
        return self._a

    @property
    def evidence_codes(self) -> npt.NDArray[np.int8]:
        """Each segment's evidence bit-set (:func:`evidence_mask`)."""
        return self._ev

    def __len__(self) -> int:
        return len(self._a)

    def __getitem__(self, i: int) -> Segment:
        r = self._a[i].tolist()
        return Segment(r[0], r[1], r[2], r[3], r[4], evidence_names(int(self._ev[i])))

    def __iter__(self) -> Iterator[Segment]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SegmentSet) and np.array_equal(self._a, other._a)
                and np.array_equal(self._ev, other._ev))

    def __repr__(self) -> str:
        return f"SegmentSet({len(self)} segments, {self.entry_count()} entries)"

    def entry_count(self) -> int:
        return int(self._a[:, 4].sum())

    def source_ranges(self) -> RangeSet:
        """Every source entry mapped (kept: a set outlives many plans)."""
        if self._source is None:
            self._source = RangeSet.entries(self._a[:, 0], self._a[:, 1], self._a[:, 4])
        return self._source

    def target_ranges(self) -> RangeSet:
        return RangeSet.entries(self._a[:, 2], self._a[:, 3], self._a[:, 4])

    # -- invariant
    def conflicts(self) -> list[tuple[int, int, str]]:
        """Pairs of segment indexes that claim one target entry.

        Neighbours in target order are enough: if any two segments of a ledger overlap,
        the first of them overlaps the one right after it.
        """
        a = self._a
        if len(a) < 2:
            return []
        order = sorting.lexsort((a[:, 3], a[:, 2]))
        tl, te, cnt = a[order, 2], a[order, 3], a[order, 4]
        clash = (tl[1:] == tl[:-1]) & (te[1:] < te[:-1] + cnt[:-1])
        return [(int(order[k]), int(order[k + 1]), "overlap on the target")
                for k in np.flatnonzero(clash).tolist()]

    # -- lookup and combination
    def lookup(self, position: Position) -> Position | None:
        """Source position -> its first target copy, or None when not mapped (never
        extrapolated)."""
        found = self.covering(position)
        return self[found[0]].lookup(position) if found else None

    def copies(self, position: Position) -> list[Position]:
        """Every target copy of a source position, in target order."""
        return [t for i in self.covering(position) if (t := self[i].lookup(position))]

    def covering(self, position: Position) -> list[int]:
        """Indexes of the segments that map ``position``, in target order."""
        a = self._a
        lo = int(sorting.searchsorted(a[:, 0], position.ledger, side="left"))
        hi = int(sorting.searchsorted(a[:, 0], position.ledger, side="right"))
        # Segments of the ledger starting at or before the entry; copies may start earlier.
        hi = lo + int(sorting.searchsorted(a[lo:hi, 1], position.entry, side="right"))
        cand = lo + np.flatnonzero(a[lo:hi, 1] + a[lo:hi, 4] > position.entry)
        order = sorting.lexsort((a[cand, 3], a[cand, 2]))
        return [int(i) for i in cand[order]]

    @classmethod
    def collapsed(cls, rows: I64, evidence: npt.NDArray[np.int8]) -> SegmentSet:
        """Segments from rows that may repeat or continue each other (rows of many
        batches): identical rows merge, continuations join, contradictions raise."""
        a = np.asarray(rows, np.int64).reshape(-1, 5)
        return _from_segment_rows(a, np.asarray(evidence, np.int8)) if len(a) else cls()

    def union(self, other: SegmentSet) -> SegmentSet:
        """Both sets of evidence; identical segments merge, contradictions raise."""
        if len(other) == 0:
            return self
        if len(self) == 0:
            return other
        return _from_segment_rows(np.concatenate((self._a, other._a)),
                                  np.concatenate((self._ev, other._ev)))

    __or__ = union


def _from_segment_rows(rows: I64, ev: npt.NDArray[np.int8]) -> SegmentSet:
    """Re-collapse segment rows (expanding only to run boundaries, never to entries).

    Rows of one claim (source ledger to target ledger at one offset, target entry minus
    source entry) that overlap or touch join, their evidence bit-sets too: a row a retried
    batch repeats, a batch continuing the last, a maintenance-merged row meeting the rows
    it merged. Rows at other offsets stay apart; validation refuses any that claim one
    target entry."""
    offset = rows[:, 3] - rows[:, 1]
    order = sorting.lexsort((rows[:, 1], offset, rows[:, 2], rows[:, 0]))
    rows, ev, offset = rows[order], ev[order], offset[order]
    start = rows[:, 1]
    end = start + rows[:, 4]
    claim = np.concatenate(([True], (rows[1:, 0] != rows[:-1, 0]) | (rows[1:, 2] != rows[:-1, 2])
                            | (offset[1:] != offset[:-1])))
    # A running maximum of the ends per claim: each claim's entries shifted into a band of
    # its own, above every earlier claim's, so one running maximum serves them all.
    first = np.flatnonzero(claim)
    group = np.cumsum(claim) - 1
    low = start[first][group]
    span = int((end - low).max()) + 1
    if len(first) * span >= 1 << 62:
        raise ValueError("segment rows too wide to collapse")  # entry ids near 2**62
    band = group * span - low
    reach = np.maximum.accumulate(end + band)
    new = claim.copy()
    new[1:] |= start[1:] + band[1:] > reach[:-1]
    starts = np.flatnonzero(new)
    out = rows[starts].copy()
    out[:, 4] = np.maximum.reduceat(end, starts) - start[starts]
    return SegmentSet(out, np.bitwise_or.reduceat(ev, starts))


@dataclass(frozen=True, eq=False, slots=True)
class Runs:
    """Runs of entries of one kind on one side: (ledger, first entry, count) rows."""

    rows: I64 = field(default_factory=lambda: np.empty((0, 3), dtype=np.int64))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Runs) and np.array_equal(self.rows, other.rows)

    def __hash__(self) -> int:
        return hash(self.rows.tobytes())

    @classmethod
    def from_positions(cls, ledgers: I64, entries: I64) -> Runs:
        """Collapse single positions into maximal runs."""
        ledgers = np.asarray(ledgers, np.int64)
        entries = np.asarray(entries, np.int64)
        if len(ledgers) == 0:
            return cls()
        order = sorting.lexsort((entries, ledgers))
        ledgers, entries = ledgers[order], entries[order]
        keep = np.concatenate(
            ([True], (ledgers[1:] != ledgers[:-1]) | (entries[1:] != entries[:-1])))
        ledgers, entries = ledgers[keep], entries[keep]
        cont = np.concatenate(([False], (ledgers[1:] == ledgers[:-1])
                               & (entries[1:] == entries[:-1] + 1)))
        starts = np.flatnonzero(~cont)
        counts = np.diff(np.concatenate((starts, [len(ledgers)])))
        return cls(np.stack([ledgers[starts], entries[starts], counts], axis=1))

    @classmethod
    def of(cls, *runs: tuple[int, int, int]) -> Runs:
        return cls(np.array(runs, dtype=np.int64).reshape(-1, 3))

    def __len__(self) -> int:
        return len(self.rows)

    def ranges(self) -> RangeSet:
        return RangeSet.entries(self.rows[:, 0], self.rows[:, 1], self.rows[:, 2])

    def entry_count(self) -> int:
        return int(self.rows[:, 2].sum())

    def first(self) -> Position:
        """The earliest position any run starts at (the rows need not be in order)."""
        row = self.rows[sorting.lexsort((self.rows[:, 1], self.rows[:, 0]))[0]]
        return Position(int(row[0]), int(row[1]))

    def union(self, other: Runs) -> Runs:
        r = self.ranges() | other.ranges()
        b = r.bounds
        return Runs(np.stack([b[:, 0], b[:, 1] + 1, b[:, 3] - b[:, 1]], axis=1))


@dataclass(frozen=True, slots=True)
class TopicMapping:
    """Everything known about one topic partition's correspondence, source to target.

    ``skippable``: target entries no consumer ever receives (markers), safe to ack.
    ``foreign``: target entries that did not come from the source; never acked by us.
    ``unreplicated``: source entries that are never replicated (markers, skipped by
    replicate_to, expired); they are not "unmapped yet", they are never mapped.
    ``written_at``: when its newest row was written (epoch seconds; None: not from the
    table), which tells a process that just started whether the mapping still moves.
    ``unpaired``: target entries known to be copies of source entries (their identity is on
    the source) whose source entry is not known; only snapshot anchors ever ack them.
    ``anchors``: the source's snapshot markers (:mod:`cursorsync.core.anchors`).
    """

    segments: SegmentSet = field(default_factory=SegmentSet)
    skippable: Runs = field(default_factory=Runs)
    foreign: Runs = field(default_factory=Runs)
    unreplicated: Runs = field(default_factory=Runs)
    written_at: float | None = None
    unpaired: Runs = field(default_factory=Runs)
    anchors: Anchors = field(default_factory=Anchors)

    def lookup(self, position: Position) -> Position | None:
        return self.segments.lookup(position)

    def vouched(self) -> TopicMapping:
        """The mapping with its segments cut at the newest anchor's target position (all of
        them without an anchor): what the source's snapshot anchors have checked so far."""
        top = self.anchors.newest_target()
        rows = self.segments.rows
        if top is None:
            return replace(self, segments=SegmentSet())
        tl, te, n = rows[:, 2], rows[:, 3], rows[:, 4]
        keep = np.where(tl < top.ledger, n,
                        np.where(tl == top.ledger, np.clip(top.entry - te + 1, 0, n), 0))
        sel = keep > 0
        cut = rows[sel].copy()
        cut[:, 4] = keep[sel]
        return replace(self, segments=SegmentSet(cut, self.segments.evidence_codes[sel],
                                                 validate=False))

    def union(self, other: TopicMapping) -> TopicMapping:
        """Everything either knows (segments that disagree raise MappingConflictError),
        written when the newer of the two was."""
        times = [t for t in (self.written_at, other.written_at) if t is not None]
        return TopicMapping(self.segments | other.segments, self.skippable.union(other.skippable),
                            self.foreign.union(other.foreign),
                            self.unreplicated.union(other.unreplicated),
                            written_at=max(times) if times else None,
                            unpaired=self.unpaired.union(other.unpaired),
                            anchors=self.anchors.union(other.anchors))


# -------------------------------------------------------------------- evidence


def holes(
    ledgers: I64, entries: I64, *, previous: Position | None = None
) -> Runs:
    """Entry ids a reader skipped over, as runs: where markers sit on a reader's stream.

    ``ledgers``/``entries`` are the positions a reader returned, in order, and
    ``previous`` the last one it returned before them (None at the very start
    of the stream, where nothing before the first entry is claimed). Within a
    ledger every skipped id is a hole; when the ledger changes, the ids before
    the first one seen in the new ledger are holes. The end of a ledger after
    its last delivered entry cannot be seen by a reader and is not claimed
    (:func:`ledger_ends` says where it may lie).
    """
    ledgers = np.asarray(ledgers, np.int64)
    entries = np.asarray(entries, np.int64)
    if previous is not None:
        ledgers = np.concatenate(([previous.ledger], ledgers))
        entries = np.concatenate(([previous.entry], entries))
    if len(ledgers) < 2:
        return Runs()
    same = ledgers[1:] == ledgers[:-1]
    first = np.where(same, entries[:-1] + 1, 0)
    count = entries[1:] - first
    keep = count > 0
    return Runs(np.stack([ledgers[1:][keep], first[keep], count[keep]], axis=1))


def ledger_ends(ledgers: I64, entries: I64, *,
                previous: Position | None = None) -> list[Position]:
    """The last entry a reader returned in each ledger it then left for a later one (same
    inputs as :func:`holes`): ids after it in that ledger, if the ledger has any, were
    skipped unseen (markers written after a ledger's last message, before it rolled)."""
    ledgers = np.asarray(ledgers, np.int64)
    entries = np.asarray(entries, np.int64)
    if previous is not None:
        ledgers = np.concatenate(([previous.ledger], ledgers))
        entries = np.concatenate(([previous.entry], entries))
    left = np.flatnonzero(ledgers[1:] > ledgers[:-1])
    return [Position(int(lg), int(e)) for lg, e in
            zip(ledgers[left].tolist(), entries[left].tolist(), strict=True)]
