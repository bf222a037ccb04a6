"""Partially acknowledged batches: which batch indexes the target acknowledges.

A batch is one entry holding several messages, numbered by batch index. With
batch-index acknowledgement on, a source broker keeps which messages of a batch are acked
while the entry itself stays unacked (a *partial batch*). The replicator copies an entry
whole, so index *i* of a target copy is the copy of index *i* of its source entry.

**The rule for indexes.** Index *i* of a target entry is acknowledged only if the segment
that claims the entry maps it from a source entry that is acked on the source, whole or at
index *i*. :func:`plan_index_acks` maps the source's partial batches forward onto their
target copies; :func:`unbacked_index_acks` walks each planned index back to its source, on
the segments alone, for the guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import SegmentSet


@dataclass(frozen=True, order=True, slots=True)
class PartialBatch:
    """An entry of ``size`` messages of which ``acked`` (batch indexes) are acked and the
    rest are not: what a broker holds for a partly acked batch."""

    position: Position
    size: int
    acked: frozenset[int]

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"batch at {self.position} has size {self.size}")
        if not self.acked or min(self.acked) < 0 or max(self.acked) >= self.size:
            raise ValueError(f"batch at {self.position} of size {self.size}: acked indexes "
                             f"{sorted(self.acked)} are not a part of 0..{self.size - 1}")

    def __str__(self) -> str:
        return _named(self.position, self.acked, self.size)


@dataclass(frozen=True, order=True, slots=True)
class IndexAck:
    """Acknowledge the messages ``indexes`` of the batch of ``size`` at target ``target``."""

    target: Position
    size: int
    indexes: frozenset[int]

    def __post_init__(self) -> None:
        if self.size < 1 or not self.indexes or min(self.indexes) < 0 or (
                max(self.indexes) >= self.size):
            raise ValueError(f"index ack at {self.target}: indexes {sorted(self.indexes)} "
                             f"do not fit a batch of {self.size}")

    def __str__(self) -> str:
        return _named(self.target, self.indexes, self.size)


def _named(at: Position, indexes: frozenset[int], size: int) -> str:
    """``L:E[i,j/size]``: a batch's position, some of its indexes and its size."""
    return f"{at}[{','.join(map(str, sorted(indexes)))}/{size}]"


def plan_index_acks(partials: Iterable[PartialBatch], segments: SegmentSet,
                    target_acked: RangeSet,
                    target_partials: Mapping[Position, PartialBatch] | None = None,
                    ) -> tuple[IndexAck, ...]:
    """The index acks that carry the source's partial batches to their target copies.

    Every copy a segment names gets the source's acked indexes, except copies the target
    acks whole (``target_acked``: acked already or by the plan) and indexes the target's
    own partial batch holds (``target_partials``, when known). A target batch of another
    size is not the same batch: it gets nothing. Unmapped source entries wait.
    """
    out: list[IndexAck] = []
    for p in partials:
        for t in segments.copies(p.position):
            if t in target_acked:
                continue
            held = (target_partials or {}).get(t)
            if held is not None and held.size != p.size:
                continue
            todo = p.acked - held.acked if held is not None else p.acked
            if todo:
                out.append(IndexAck(t, p.size, frozenset(todo)))
    return tuple(sorted(out))


def unbacked_index_acks(acks: Sequence[IndexAck], partials: Iterable[PartialBatch],
                        source_acked: RangeSet, segments: SegmentSet) -> list[IndexAck]:
    """The index acks (or parts of them) that break the rule for indexes; empty when safe.

    Each ack's target entry goes back to its source through the segment whose target run
    holds it (one at most: no target entry is claimed twice). A source entry acked whole
    backs every index of a batch; a partial one backs its acked indexes at its own size.
    """
    of = {p.position: p for p in partials}
    rows = segments.rows
    bad: list[IndexAck] = []
    for a in acks:
        t = a.target
        hit = np.flatnonzero((rows[:, 2] == t.ledger) & (rows[:, 3] <= t.entry)
                             & (t.entry < rows[:, 3] + rows[:, 4]))
        if len(hit) != 1:
            bad.append(a)
            continue
        s_l, s_e, _, t_e, _ = (int(v) for v in rows[hit[0], :5])
        source = Position(s_l, s_e + t.entry - t_e)
        if source in source_acked:
            continue
        p = of.get(source)
        if p is None or p.size != a.size:
            bad.append(a)
        elif not a.indexes <= p.acked:
            bad.append(IndexAck(t, a.size, a.indexes - p.acked))
    return bad
