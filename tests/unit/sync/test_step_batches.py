"""The sync step with ``emission.batch_index_acks``: the source's partly acked batches reach
the plan and the guard, the target's held indexes are not sent again, and a cursor holding
partly acked batches is asked again every batch while one without goes idle."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from cursorsync.core.batches import IndexAck, PartialBatch
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import SafePlan
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.pulsar.emitter import EmitResult
from cursorsync.sync.batch_reads import HeldBatches
from cursorsync.sync.step import StepSettings, SyncStep

KEY = PartitionKey("persistent://t/n/orders", 0)
TOPIC = "persistent://t/n/orders-partition-0"
NOW = datetime(2026, 11, 29, tzinfo=UTC)


class _Emitter:
    def __init__(self) -> None:
        self.sent: list[SafePlan] = []

    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None, unproven: RangeSet | None = None) -> EmitResult:
        self.sent.append(safe)
        plan = safe.plan
        return EmitResult(plan.to_ack.count_entries(), None, 0,
                          sum(len(a.indexes) for a in plan.index_acks))


class _Reads:
    def __init__(self, source: tuple[PartialBatch, ...],
                 target: dict[Position, PartialBatch] | None) -> None:
        self.held = HeldBatches(source, target)
        self.asked: list[list[tuple[str, str]]] = []

    def many(self, cursors: Sequence[tuple[str, str]]) -> dict[tuple[str, str], HeldBatches]:
        self.asked.append(list(cursors))
        return {c: self.held for c in cursors}


def _world() -> tuple[ObservedCursor, dict[PartitionKey, TopicMapping], CursorState]:
    """Source 5:0..5:9 -> target 7:0..7:9; the source acked up to 5:3, 5:4 partly."""
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]))
    source = CursorState(Position(5, 3), RangeSet(), Ledgers.of([(5, 10)]))
    target = CursorState(Position(7, 3), RangeSet(), Ledgers.of([(7, 10)]))
    return ObservedCursor(KEY, "sub", source, NOW), {KEY: mapping}, target


PARTIAL = PartialBatch(Position(5, 4), 5, frozenset({0, 2}))


def test_the_sources_partial_batches_become_guarded_index_acks() -> None:
    obs, mappings, target = _world()
    emitter, reads = _Emitter(), _Reads((PARTIAL,), None)
    step = SyncStep(StepSettings(), emitter, lambda t, s: target, batch_reads=reads)
    (record,) = step.run([obs], mappings).records
    assert reads.asked == [[(TOPIC, "sub")]]
    assert emitter.sent[-1].plan.index_acks == (IndexAck(Position(7, 4), 5,
                                                         frozenset({0, 2})),)
    assert record.plan.partial_batches_unacked == 0
    # Not idle while it holds a partly acked batch: asked again, sent again (no target plugin).
    step.run([obs], mappings)
    assert len(reads.asked) == 2 and emitter.sent[-1].plan.index_acks


def test_what_the_target_holds_is_not_sent_and_the_cursor_settles() -> None:
    obs, mappings, target = _world()
    held = {Position(7, 4): PartialBatch(Position(7, 4), 5, frozenset({0, 2}))}
    emitter, reads = _Emitter(), _Reads((PARTIAL,), held)
    step = SyncStep(StepSettings(), emitter, lambda t, s: target, batch_reads=reads)
    step.run([obs], mappings)
    assert all(not s.plan.index_acks for s in emitter.sent)


def test_without_partial_batches_the_cursor_goes_idle_and_is_not_asked() -> None:
    obs, mappings, target = _world()
    emitter, reads = _Emitter(), _Reads((), None)
    step = SyncStep(StepSettings(), emitter, lambda t, s: target, batch_reads=reads)
    for _ in range(3):
        step.run([obs], mappings)
    assert len(reads.asked[0]) == 1 and all(not a for a in reads.asked[2:])
