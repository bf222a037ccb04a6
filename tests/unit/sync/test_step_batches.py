"""The sync step with ``emission.batch_index_acks``: the source's partly acked batches reach
the plan and the guard, the target's held indexes are not sent again, a cursor holding
partly acked batches is asked again every batch while one without goes idle, and an idle
one whose batches alone changed (the plugin's digests say so) is planned again."""

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
from cursorsync.errors import AdminUnavailableError, CursorSyncError
from cursorsync.pulsar.cursor_digests import CursorDigest, TopicDigest
from cursorsync.pulsar.emitter import EmitResult
from cursorsync.sync.batch_moves import BatchMoves
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


class _Digests:
    """The source brokers' cursor digests as the plugin answers them, set by the test."""

    def __init__(self) -> None:
        self.batches = "0" * 16
        self.failing: CursorSyncError | None = None

    def __call__(self) -> dict[str, TopicDigest]:
        if self.failing is not None:
            raise self.failing
        return {TOPIC: TopicDigest("1:1:5:9", {"sub": CursorDigest("a" * 16, self.batches)})}


def test_an_idle_cursor_whose_batches_alone_changed_is_planned_again() -> None:
    """A consumer acks part of a batch and nothing else: internalStats stay as they were,
    the plugin's batches digest moves, and the idle cursor's new indexes are carried."""
    obs, mappings, target = _world()
    emitter, reads, digests = _Emitter(), _Reads((), None), _Digests()
    step = SyncStep(StepSettings(), emitter, lambda t, s: target, batch_reads=reads,
                    batch_moves=BatchMoves(digests))
    for _ in range(3):
        step.note_batches()
        step.run([obs], mappings)
    assert (KEY, "sub") in step.kept.idle and not reads.asked[-1]
    reads.held = HeldBatches((PARTIAL,), None)
    digests.batches = "1" * 16
    step.note_batches()
    assert step.batches_moved == {(KEY, "sub")}
    step.run([obs], mappings)
    assert reads.asked[-1] == [(TOPIC, "sub")]
    assert emitter.sent[-1].plan.index_acks == (IndexAck(Position(7, 4), 5,
                                                         frozenset({0, 2})),)
    # The digest stands: nothing moved.
    step.note_batches()
    assert step.batches_moved == frozenset()


def test_digests_that_cannot_be_read_move_nothing_and_a_change_meanwhile_shows_after() -> None:
    digests = _Digests()
    moves = BatchMoves(digests)
    assert moves.next_batch() == frozenset()  # first seen: unchanged
    digests.failing = AdminUnavailableError("cluster a: refused")
    assert moves.next_batch() == frozenset()
    digests.batches = "2" * 16  # changed while they could not be read
    assert moves.next_batch() == frozenset()
    digests.failing = None
    assert moves.next_batch() == {(KEY, "sub")}
    assert moves.next_batch() == frozenset()
