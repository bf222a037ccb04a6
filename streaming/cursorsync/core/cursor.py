"""A subscription cursor, how the broker folds acks into it, and the plan for a target cursor."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from cursorsync.core.batches import IndexAck, PartialBatch
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet


class Outcome(StrEnum):
    """How much of the source cursor a plan covers: every acked source entry mapped
    (exact), some waiting for evidence (partial), or no mapping at all (unknown). The
    values are what ``sync_progress.outcome`` holds."""

    EXACT = "exact"
    PARTIAL = "partial"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class CursorState:
    """A subscription cursor as the broker reports it, plus the topic's ledgers when known."""

    mark_delete: Position
    individually_deleted: RangeSet = field(default_factory=RangeSet)
    ledgers: Ledgers | None = None
    #: Partly acked batches after the markDeletePosition, when the broker's are known (its
    #: batch-index acks, through cursorsync's broker plugin); empty otherwise.
    batches: tuple[PartialBatch, ...] = ()
    #: :meth:`acked`, once asked: a plan and its guard ask it of the same state several times.
    _acked: RangeSet | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def parse(cls, mark_delete: str, individually_deleted: str = "[]",
              ledgers: Ledgers | None = None) -> CursorState:
        return cls(Position.parse(mark_delete), RangeSet.parse(individually_deleted), ledgers)

    def acked(self) -> RangeSet:
        """Every acked position: up to the markDeletePosition, and the individual ranges."""
        if self._acked is None:
            # A value derived from the fields, kept once: the state stays frozen in meaning.
            object.__setattr__(self, "_acked",
                               RangeSet.up_to(self.mark_delete) | self.individually_deleted)
            assert self._acked is not None
        return self._acked

    def forget(self) -> None:
        """Drops what was derived from the state and its ledger list (made again on use):
        for a state kept long while nothing asks it."""
        object.__setattr__(self, "_acked", None)
        if self.ledgers is not None:
            self.ledgers.forget()

    def __str__(self) -> str:
        text = f"markDelete={self.mark_delete} individual={self.individually_deleted}"
        if self.batches:
            text += " batches=" + ",".join(map(str, self.batches))
        return text


@dataclass(frozen=True, slots=True)
class AckPlan:
    """What the target cursor should become, and what must be sent to get there."""

    #: Target markDeletePosition after the plan is applied.
    mark_delete: Position
    #: Target individually acked ranges after it.
    individually_deleted: RangeSet
    #: Target entries to acknowledge: acked after the plan, not acked before.
    to_ack: RangeSet
    #: The target's markDeletePosition before the plan.
    previous_mark_delete: Position
    #: Source entries acked on the source that no segment maps yet (they wait).
    unmapped_acked_entries: int
    #: Source entries previously seen acked that are no longer acked (a rewind).
    rewound_entries: int
    #: Partially acked source batches: unacked at entry level, redelivered after failover.
    partial_batches_unacked: int
    #: Skippable target entries (markers) the plan acks.
    skippable_acked_entries: int
    outcome: Outcome
    #: Batch indexes to acknowledge on the target: the source's partly acked batches
    #: carried to their copies (:mod:`cursorsync.core.batches`).
    index_acks: tuple[IndexAck, ...] = ()

    def split(self, *, cumulative: bool) -> tuple[Position | None, RangeSet]:
        """(cumulative ack position or None, ranges to ack individually).

        With cumulative acks (Exclusive/Failover) one ack covers everything up
        to the new markDeletePosition; Shared/Key_Shared must ack every entry.
        """
        if cumulative and self.mark_delete > self.previous_mark_delete:
            return self.mark_delete, self.to_ack.after(self.mark_delete)
        return None, self.to_ack



def fold(
    mark_delete: Position, acked: RangeSet, ledgers: Ledgers | None = None
) -> tuple[Position, RangeSet]:
    """Fold acks into (markDeletePosition, individually deleted ranges) as the broker does.

    The markDeletePosition moves to the upper end of the range that reaches it
    with no unacked entry in between; what is left stays individual. "Reaches"
    is judged on canonical positions, so a range starting right after the last
    entry of the previous ledger reaches a markDeletePosition on that entry.
    """
    everything = (RangeSet.up_to(mark_delete) | acked).canonical(ledgers)
    floor = mark_delete
    if ledgers is not None and len(ledgers.ids):
        fl, fe = ledgers.canonical(np.array([mark_delete.ledger]), np.array([mark_delete.entry]))
        floor = Position(int(fl[0]), int(fe[0]))
    new_md = mark_delete
    if everything:
        lo0, hi0 = everything._range(0)
        if lo0 <= floor <= hi0:
            new_md = max(hi0, mark_delete)
    return new_md, everything.after(new_md)
