"""Guarded plans for the emitter's tests: the target entries whose fake source (900:e) is acked."""

from __future__ import annotations

from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import SafePlan, guard
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import translate

SRC = 900  # the fake source ledger


# --------------------------------------------------------------------------- helpers


def _plan(ledger: int, n: int, md: int, individual: str = "[]",
          target: CursorState | None = None) -> tuple[SafePlan, CursorState]:
    """A guarded plan acking the target entries whose source (900:e) is acked.

    Returns the plan and the target state after it (for the next sync).
    """
    mapping = TopicMapping(SegmentSet.of([Segment(SRC, 0, ledger, 0, n)]))
    source = CursorState.parse(f"{SRC}:{md}", individual, Ledgers.of([(SRC, n)]))
    if target is None:
        target = CursorState(Position(ledger, -1), RangeSet(), Ledgers.of([(ledger, n)]))
    plan = translate(source, mapping, target)
    after = CursorState(plan.mark_delete, plan.individually_deleted, target.ledgers)
    return guard(plan, source, mapping, target), after
