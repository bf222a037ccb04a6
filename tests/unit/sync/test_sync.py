"""The sync step: unmapped source entries that are markers are looked up, once each, and
those past the last mapped entry only once the mapping has stopped moving."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

import cursorsync.sync.marker_lookups as marker_lookups_module
import cursorsync.sync.step as step_module
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.guard import SafePlan
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.errors import AdminError, AdminUnavailableError
from cursorsync.pulsar.admin import TopicCreation
from cursorsync.pulsar.emitter import EmitError, EmitResult
from cursorsync.sync.marker_lookups import (
    MARKER_LOOKUP_SETTLE_S,
    MARKER_LOOKUP_WAIT_MAX_S,
    MARKER_LOOKUPS_IN_FLIGHT,
    MARKER_LOOKUPS_PER_BATCH,
    MARKER_TAIL_LOOKUPS,
    MarkerLookup,
)
from cursorsync.sync.plans import IDLE_TARGET_READ_EVERY, read_offset
from cursorsync.sync.step import StepSettings, SyncStep, Target

KEY = PartitionKey("persistent://t/n/orders", 0)
NOW = datetime(2026, 11, 23, tzinfo=UTC)


def _world(tail: int) -> tuple[ObservedCursor, dict[PartitionKey, TopicMapping], CursorState]:
    """Source 5:0..5:9 mapped to target 7:0..7:9; then ``tail`` source entries (markers,
    say) that nothing maps, all acked on the source."""
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]))
    source = CursorState(Position(5, 9 + tail), RangeSet(), Ledgers.of([(5, 10 + tail)]))
    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 10)]))
    return ObservedCursor(KEY, "sub", source, NOW), {KEY: mapping}, target


def _step(target: CursorState, lookup: MarkerLookup, *, background: bool = False,
          ) -> tuple[SyncStep, Callable[[float], None]]:
    """A step whose clock the test moves."""
    step = SyncStep(StepSettings(dry_run=True), None, lambda t, s: target, lookup,
                    lookups_in_background=background)
    now = [0.0]
    step.lookups.clock = lambda: now[0]

    def advance(seconds: float) -> None:
        now[0] += seconds

    return step, advance


def test_unmapped_markers_are_looked_up_once_and_the_plan_becomes_exact() -> None:
    obs, mappings, target = _world(3)
    asked: list[list[Position]] = []

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        assert topic == KEY.concrete_topic()
        asked.append(positions)
        return [p for p in positions if p.entry != 11]  # 5:11 is data (a chunk, say)

    step, advance = _step(target, lookup)
    # Past the last mapped entry, while the mapping may still be moving: not looked up.
    assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 3
    advance(MARKER_LOOKUP_SETTLE_S - 0.1)
    assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 3
    assert asked == []
    advance(0.1)
    first = step.run([obs], mappings).records[0].plan
    assert asked == [[Position(5, 10), Position(5, 11), Position(5, 12)]]
    assert first.unmapped_acked_entries == 1 and first.outcome == "partial"
    again = step.run([obs], mappings).records[0].plan
    assert len(asked) == 1  # nothing is looked up twice
    assert again.unmapped_acked_entries == 1


def test_a_mapping_that_moves_delays_the_lookups_past_it() -> None:
    obs, mappings, target = _world(3)
    asked: list[list[Position]] = []
    step, advance = _step(target, lambda t, p: asked.append(p) or p)
    step.run([obs], mappings)
    advance(MARKER_LOOKUP_SETTLE_S)
    moved = {KEY: TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 11)]))}
    step.run([obs], moved)  # the last mapped entry moved: the wait starts again
    assert asked == []
    advance(MARKER_LOOKUP_SETTLE_S)
    assert step.run([obs], moved).records[0].plan.outcome == "exact"
    assert asked == [[Position(5, 11), Position(5, 12)]]


def test_trailing_markers_are_looked_up_a_few_per_sync_until_all_are_known() -> None:
    n = 2 * MARKER_TAIL_LOOKUPS + 3
    obs, mappings, target = _world(n)
    asked: list[int] = []

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        asked.append(len(positions))
        return positions

    step, advance = _step(target, lookup)
    step.run([obs], mappings)
    advance(MARKER_LOOKUP_SETTLE_S)
    left = [step.run([obs], mappings).records[0].plan.unmapped_acked_entries for _ in range(3)]
    assert asked == [MARKER_TAIL_LOOKUPS, MARKER_TAIL_LOOKUPS, 3]
    assert left == [n - MARKER_TAIL_LOOKUPS, 3, 0]
    assert step.run([obs], mappings).records[0].plan.outcome == "exact"


def test_a_message_past_the_last_mapped_entry_stops_lookups_there_until_the_mapping_moves(
        ) -> None:
    """A lagging mapping leaves thousands of messages past its last mapped entry: one
    lookup that finds a message is all they cost until the mapping moves."""
    obs, mappings, target = _world(40)
    asked: list[list[Position]] = []

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        asked.append(positions)
        return [p for p in positions if p.entry < 12]  # 5:10, 5:11 markers; then messages

    step, advance = _step(target, lookup)
    step.run([obs], mappings)
    advance(MARKER_LOOKUP_SETTLE_S)
    for _ in range(3):
        assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 38
        advance(MARKER_LOOKUP_SETTLE_S)
    assert [len(p) for p in asked] == [MARKER_TAIL_LOOKUPS]
    moved = {KEY: TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10), Segment(5, 12, 7, 10, 5)]))}
    step.run([obs], moved)
    advance(MARKER_LOOKUP_SETTLE_S)
    step.run([obs], moved)
    # 5:17 was looked up with the first eight: the next eight follow it.
    assert asked[1] == [Position(5, 18 + i) for i in range(MARKER_TAIL_LOOKUPS)]


def _gapped(cursors: int, per: int) -> tuple[list[ObservedCursor],
                                             dict[PartitionKey, TopicMapping], CursorState]:
    """``cursors`` partitions, each with 5:0..5:9 mapped, then ``per`` entries acked and
    unmapped before one mapped (and target entries between the two that nothing maps yet)."""
    observed, mappings = [], {}
    for i in range(cursors):
        key = PartitionKey(f"persistent://t/n/t{i:04d}", 0)
        mappings[key] = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10),
                                                    Segment(5, 10 + per, 7, 10 + per, 1)]))
        observed.append(ObservedCursor(key, "sub", CursorState(
            Position(5, 10 + per), RangeSet(), Ledgers.of([(5, 11 + per)])), NOW))
    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 11 + per)]))
    return observed, mappings, target


def test_lookups_are_bounded_per_batch_and_the_cursors_left_out_go_first_next() -> None:
    per = 10
    cursors = MARKER_LOOKUPS_PER_BATCH // per + 3
    observed, mappings, target = _gapped(cursors, per)
    asked: list[str] = []

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        asked.append(topic)
        return positions

    step, _ = _step(target, lookup)
    first = step.run(observed, mappings)
    assert step.lookups.count == MARKER_LOOKUPS_PER_BATCH
    assert len(set(asked)) == MARKER_LOOKUPS_PER_BATCH // per + 1  # the last one in part
    assert sum(r.plan.unmapped_acked_entries for r in first.records) == (
        cursors * per - MARKER_LOOKUPS_PER_BATCH)
    asked.clear()
    second = step.run(observed, mappings)
    # The cursor the budget cut short goes first.
    assert asked[0] == observed[MARKER_LOOKUPS_PER_BATCH // per].key.concrete_topic()
    assert sum(r.plan.unmapped_acked_entries for r in second.records) == 0
    assert [r.key for r in second.records] != sorted(r.key for r in second.records)


def test_lookups_stop_for_the_batch_once_they_took_their_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow source: lookups end for the batch after MARKER_LOOKUP_SECONDS_PER_BATCH, the
    cursors left out go first next batch."""
    monkeypatch.setattr(marker_lookups_module, "MARKER_LOOKUP_SECONDS_PER_BATCH", 0.05)
    observed, mappings = [], {}
    for i in range(5):
        key = PartitionKey(f"persistent://t/n/t{i:04d}", 0)
        mappings[key] = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10),
                                                    Segment(5, 12, 7, 12, 1)]))
        observed.append(ObservedCursor(key, "sub", CursorState(
            Position(5, 12), RangeSet(), Ledgers.of([(5, 13)])), NOW))
    asked: list[str] = []

    def slow(topic: str, positions: list[Position]) -> list[Position]:
        asked.append(topic)
        time.sleep(0.03)
        return positions

    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 13)]))
    step, _ = _step(target, slow)
    step.run(observed, mappings)
    assert len(asked) == 2  # 0.06 s after the second: no more this batch
    asked.clear()
    step.run(observed, mappings)
    assert asked[0] == observed[2].key.concrete_topic()


def test_first_plans_are_bounded_per_batch_and_the_cursors_left_out_come_in_turn() -> None:
    """After a start, at most first_plans_per_batch cursors are planned a first time per
    batch; the cursors planned already go on each batch. A cursor whose target has no
    subscription yet stays unplanned, and it does not hold back the others: each batch's
    first plans start where the last batch's stopped."""
    keys = [PartitionKey(f"persistent://t/n/t{i}", 0) for i in range(5)]
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]))
    source = CursorState(Position(5, 9), RangeSet(), Ledgers.of([(5, 10)]))
    target = CursorState(Position(7, 9), RangeSet(), Ledgers.of([(7, 10)]))
    missing = keys[0].concrete_topic()  # no subscription on the target
    step = SyncStep(StepSettings(dry_run=True, first_plans_per_batch=2), None,
                    lambda t, s: None if t == missing else target)
    observed = [ObservedCursor(k, "sub", source, NOW) for k in keys]
    planned, deferred = [], []
    for _ in range(4):
        result = step.run(observed, dict.fromkeys(keys, mapping))
        planned.append(sorted(int(r.key.topic[-1]) for r in result.records))
        deferred.append(result.deferred)
    assert planned == [[1], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]]
    assert deferred == [3, 2, 0, 0]
    assert all(r.result == "emitted" and r.plan.mark_delete == Position(7, 9)
               for r in result.records)


def test_first_plans_go_first_to_the_cursors_that_moved_since_their_last_state() -> None:
    """After a start the step holds each cursor's newest state from the tables: a cursor
    whose source moved since goes before those that did not, whatever its turn."""
    keys = [PartitionKey(f"persistent://t/n/t{i}", 0) for i in range(5)]
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]))
    before = CursorState(Position(5, 6), RangeSet(), Ledgers.of([(5, 10)]))
    now = CursorState(Position(5, 9), RangeSet(), Ledgers.of([(5, 10)]))
    target = CursorState(Position(7, 6), RangeSet(), Ledgers.of([(7, 10)]))
    step = SyncStep(StepSettings(dry_run=True, first_plans_per_batch=2), None,
                    lambda t, s: target)
    step.previous = {(k, "sub"): ObservedCursor(k, "sub", before, NOW) for k in keys}
    observed = [ObservedCursor(k, "sub", now if i == 3 else before, NOW + timedelta(seconds=1))
                for i, k in enumerate(keys)]
    planned = []
    for _ in range(3):
        result = step.run(observed, dict.fromkeys(keys, mapping))
        planned.append(sorted(int(r.key.topic[-1]) for r in result.records))
    assert planned == [[0, 3], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    moved = next(r for r in result.records if r.key == keys[3])
    assert moved.plan.mark_delete == Position(7, 9) and moved.dry_run


def test_the_target_reads_of_cursors_that_go_idle_together_spread_over_batches() -> None:
    """200 cursors go idle in one batch: their targets are each read again within
    IDLE_TARGET_READ_EVERY batches, a share of them in each batch, not all in one."""
    keys = [PartitionKey(f"persistent://t/n/t{i}", 0) for i in range(200)]
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]))
    source = CursorState(Position(5, 9), RangeSet(), Ledgers.of([(5, 10)]))
    target = CursorState(Position(7, 9), RangeSet(), Ledgers.of([(7, 10)]))
    reads: list[str] = []

    def read(topic: str, sub: str) -> CursorState:
        reads.append(topic)
        return target

    step = SyncStep(StepSettings(dry_run=True), None, read)
    observed = [ObservedCursor(k, "sub", source, NOW) for k in keys]
    per_batch = []
    for _ in range(IDLE_TARGET_READ_EVERY + 1):
        reads.clear()
        step.run(observed, dict.fromkeys(keys, mapping))
        per_batch.append(len(reads))
    assert per_batch[0] == 200
    assert sum(per_batch[1:]) == 200 and max(per_batch[1:]) < 200 / 3


def test_a_failed_lookup_leaves_the_entries_unmapped_and_is_tried_again() -> None:
    obs, mappings, target = _world(2)
    calls = 0

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        nonlocal calls
        calls += 1
        raise AdminError("source admin unreachable")

    step, advance = _step(target, lookup)
    step.run([obs], mappings)
    advance(MARKER_LOOKUP_SETTLE_S)
    assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 2
    assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 2
    assert calls == 2


def test_a_step_that_just_started_trusts_the_age_of_the_mapping_s_newest_row() -> None:
    """An executor's step may be new in every batch, so what it saw says nothing about
    whether the mapping still moves; the table's written_at does."""
    obs, mappings, target = _world(2)
    asked: list[list[Position]] = []
    written = 1_000_000.0
    fresh = {KEY: replace(mappings[KEY], written_at=written)}
    step, _ = _step(target, lambda t, p: asked.append(p) or p)
    step.lookups.wall_clock = lambda: written + MARKER_LOOKUP_SETTLE_S - 0.1
    assert step.run([obs], fresh).records[0].plan.unmapped_acked_entries == 2
    assert asked == []
    step, _ = _step(target, lambda t, p: asked.append(p) or p)
    step.lookups.wall_clock = lambda: written + MARKER_LOOKUP_SETTLE_S
    assert step.run([obs], fresh).records[0].plan.outcome == "exact"
    assert asked == [[Position(5, 10), Position(5, 11)]]


def test_a_mapping_read_from_its_rows_knows_when_its_newest_row_was_written() -> None:
    import pyarrow as pa

    from cursorsync.tables.rows import mapping_rows, topic_mappings

    _, mappings, _ = _world(0)
    older, newer = datetime(2026, 11, 23, 10, tzinfo=UTC), datetime(2026, 11, 23, 11, tzinfo=UTC)
    rows = pa.concat_tables([
        mapping_rows(KEY, mappings[KEY], source_cluster="a", target_cluster="b",
                     written_at=at) for at in (newer, older)])
    assert topic_mappings(rows)[KEY].written_at == newer.timestamp()


def test_a_union_of_mappings_was_written_when_the_newer_was() -> None:
    _, mappings, _ = _world(0)
    m = mappings[KEY]
    assert m.union(m).written_at is None
    assert replace(m, written_at=5.0).union(m).written_at == 5.0
    assert m.union(replace(m, written_at=7.0)).union(replace(m, written_at=6.0)).written_at == 7.0


class _Emitter:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.sent: list[SafePlan] = []

    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None) -> EmitResult:
        if self.error is not None:
            raise self.error
        self.sent.append(safe)
        return EmitResult(safe.plan.to_ack.count_entries(), None, 1)


def test_every_outcome_is_recorded_and_a_plan_not_sent_leaves_the_target_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """emitted, failed, refused, halted: each writes a record, so status never keeps showing
    an older, better state."""
    obs, mappings, target = _world(0)

    def once(step: SyncStep, o: ObservedCursor = obs) -> SyncRecord:
        (record,) = step.run([o], mappings).records
        return record

    ok = _Emitter()
    record = once(SyncStep(StepSettings(), ok, lambda t, s: target))
    assert (record.result, record.outcome, record.acks_sent) == ("emitted", "exact", 10)

    broken = SyncStep(StepSettings(), _Emitter(EmitError("target unreachable")),
                      lambda t, s: target)
    record = once(broken)
    assert (record.result, record.outcome, record.acks_sent) == ("failed", "failed", 0)
    assert record.plan.mark_delete == target.mark_delete and not record.plan.to_ack

    # A plan that acks past what the source acked never passes the guard.
    real = step_module.translate

    def overreaching(*args: object, **kwargs: object) -> AckPlan:
        plan = real(*args, **kwargs)  # type: ignore[arg-type]
        return replace(plan, to_ack=plan.to_ack | RangeSet.of(("7:9", "7:20")))

    monkeypatch.setattr(step_module, "translate", overreaching)
    guarded = _Emitter()
    record = once(SyncStep(StepSettings(), guarded, lambda t, s: target))
    assert (record.result, record.outcome) == ("refused", "refused") and not guarded.sent
    monkeypatch.undo()

    halting = SyncStep(StepSettings(rewind_policy="halt"), ok, lambda t, s: target)
    once(halting)
    back = replace(obs, state=CursorState(Position(5, 3), RangeSet(), obs.state.ledgers))
    record = once(halting, back)
    assert (record.result, record.outcome) == ("halted", "halted")
    assert record.plan.rewound_entries == 6 and not record.plan.to_ack


class _OpeningEmitter(_Emitter):
    """Opens consumers ahead of the acks; records what it was asked, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object]] = []

    def open_consumers(self, cursors: Sequence[tuple[str, str]]) -> None:
        self.calls.append(("open", list(cursors)))

    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None) -> EmitResult:
        self.calls.append(("apply", topic))
        return super().apply(topic, subscription, safe, cumulative=cumulative, ledgers=ledgers)


def test_a_batch_opens_the_consumers_its_plans_are_sent_through_before_sending_any() -> None:
    """Every cursor is planned first; then the consumers of the plans with acks to send
    are opened in one call, and the plans sent. A cursor with nothing to send or halted
    gets no consumer; records come in the batch's order; a dry run opens none."""
    obs, mapping, target = _world(0)
    keys = [PartitionKey(KEY.topic, i) for i in range(4)]
    done = replace(target, mark_delete=Position(7, 9))  # partition 1: nothing to send
    emitter = _OpeningEmitter()
    step = SyncStep(StepSettings(), emitter, lambda t, s: done if t.endswith("-1") else target)
    step.halted_keys = {(keys[2], "sub")}
    observed = [replace(obs, key=k) for k in keys]
    result = step.run(observed, {k: mapping[KEY] for k in keys})
    topics = [k.concrete_topic() for k in keys]
    assert emitter.calls == [("open", [(topics[0], "sub"), (topics[3], "sub")]),
                             ("apply", topics[0]), ("apply", topics[3])]
    assert [(r.key.partition, r.result) for r in result.records] == [
        (0, "emitted"), (1, "emitted"), (2, "halted"), (3, "emitted")]
    assert [r.acks_sent for r in result.records] == [10, 0, 0, 10]

    dry = _OpeningEmitter()
    SyncStep(StepSettings(dry_run=True), dry, lambda t, s: target).run(
        observed, {k: mapping[KEY] for k in keys})
    assert dry.calls == []


def test_an_idle_cursor_reuses_its_plan_until_a_plan_input_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Same source state, same mapping object, same target: the plan is reused untranslated
    and sent again if the target still lacks it (a failed send); any change translates
    again. Records are the same either way."""
    obs, mappings, target = _world(0)
    targets = [target]
    calls = []
    real = step_module.translate

    def counting(*args: object, **kwargs: object) -> AckPlan:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(step_module, "translate", counting)
    sink = _Emitter(EmitError("target unreachable"))
    step = SyncStep(StepSettings(), sink, lambda t, s: targets[-1])
    first = step.run([obs], mappings).records[0]
    sink.error = None
    second = step.run([replace(obs, observed_at=NOW)], mappings).records[0]
    assert len(calls) == 1 and len(sink.sent) == 1  # reused, and sent this time
    assert (first.result, second.result) == ("failed", "emitted")
    assert second.plan.to_ack == RangeSet.of(("7:-1", "7:9"))
    targets.append(CursorState(Position(7, 9), RangeSet(), target.ledgers))
    step.run([obs], mappings)  # the target moved: translated again
    step.run([obs], mappings)  # idle: reused
    assert len(calls) == 2
    step.run([obs], {KEY: mappings[KEY].union(TopicMapping())})  # a new mapping object
    assert len(calls) == 3
    moved = replace(obs, state=CursorState(Position(5, 8), RangeSet(), obs.state.ledgers))
    step.run([moved], {KEY: mappings[KEY]})
    assert len(calls) == 4


def test_an_idle_cursor_records_its_last_plan_without_the_guard_until_something_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle cursor (the plan passed the guard and sent nothing; source, mapping and target
    as they were) records the same plan without translating or guarding again. A halt, a
    source that moves, or a rewind in the last plan takes it off that path."""
    obs, mappings, target = _world(0)
    acked = CursorState(Position(7, 9), RangeSet(), target.ledgers)
    guarded: list[int] = []
    real_guard = step_module.guard

    def counting(*args: object, **kwargs: object) -> SafePlan:
        guarded.append(1)
        return real_guard(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(step_module, "guard", counting)
    step = SyncStep(StepSettings(rewind_policy="report"), _Emitter(), lambda t, s: acked)
    records = [step.run([replace(obs, observed_at=NOW)], mappings).records[0]
               for _ in range(5)]
    assert len(guarded) == 1
    assert {(r.result, r.plan.mark_delete, r.plan.to_ack) for r in records} == {
        ("emitted", Position(7, 9), RangeSet())}
    assert all(r.plan == records[0].plan for r in records)

    step.halted_keys.add((KEY, "sub"))
    (record,) = step.run([obs], mappings).records
    assert record.result == "halted"
    step.halted_keys.clear()

    back = replace(obs, state=CursorState(Position(5, 3), RangeSet(), obs.state.ledgers))
    (record,) = step.run([back], mappings).records
    assert record.plan.rewound_entries == 6  # reported once
    before = len(guarded)
    (record,) = step.run([back], mappings).records
    assert record.plan.rewound_entries == 0 and len(guarded) == before + 1
    (record,) = step.run([back], mappings).records
    assert record.plan.rewound_entries == 0 and len(guarded) == before + 1  # idle again


def test_an_idle_cursor_s_target_is_read_every_tenth_batch() -> None:
    """Once a plan sent nothing and nothing changed on the source side, the target is read
    again only every IDLE_TARGET_READ_EVERY batches; a source that moves is read at once."""
    obs, mappings, target = _world(0)
    reads: list[int] = []
    acked = CursorState(Position(7, 9), RangeSet(), target.ledgers)

    def read(topic: str, sub: str) -> CursorState:
        reads.append(1)
        return acked

    step = SyncStep(StepSettings(), _Emitter(), read)
    read_in: list[int] = []
    for batch in range(31):
        (record,) = step.run([obs], mappings).records
        assert record.result == "emitted" and record.plan.mark_delete == Position(7, 9)
        if len(reads) > len(read_in):
            read_in.append(batch)
    # Read in the first batch, then within IDLE_TARGET_READ_EVERY batches (where, depends
    # on the key), then every IDLE_TARGET_READ_EVERY.
    assert read_in[0] == 0 and 0 < read_in[1] <= IDLE_TARGET_READ_EVERY
    assert read_in[2:] == [read_in[1] + IDLE_TARGET_READ_EVERY * i for i in (1, 2)]
    assert step.kept.target_reads_skipped == 31 - len(reads)
    moved = replace(obs, state=CursorState(Position(5, 8), RangeSet(), obs.state.ledgers))
    step.run([moved], mappings)
    assert len(reads) == 5


def test_a_packed_idle_cursor_sends_again_once_its_target_is_reset() -> None:
    """An idle cursor is kept packed; a target cursor moved back (a reset on the target) is
    seen at the next read of the target, and the plan is made and sent again."""
    obs, mappings, target = _world(0)
    targets = [CursorState(Position(7, 9), RangeSet(), target.ledgers)]
    sink = _Emitter()
    step = SyncStep(StepSettings(), sink, lambda t, s: targets[-1])
    for _ in range(3):
        step.run([obs], mappings)
    assert not sink.sent
    targets.append(target)  # reset to 7:-1
    batches = 0
    while not sink.sent and batches < IDLE_TARGET_READ_EVERY:
        (record,) = step.run([obs], mappings).records
        batches += 1
    assert [p.plan.to_ack for p in sink.sent] == [RangeSet.of(("7:-1", "7:9"))]
    assert record.acks_sent == 10


def test_an_idle_cursor_keeps_its_source_state_without_what_was_derived_from_it() -> None:
    """The sink hands the step the same state object for a row that did not change: the idle
    cursor keeps that object (nothing more to hold) with its derived arrays dropped, and an
    equal state in another object is as unchanged."""
    obs, mappings, target = _world(0)
    acked = CursorState(Position(7, 9), RangeSet(), target.ledgers)
    reads: list[int] = []

    def read(topic: str, sub: str) -> CursorState:
        reads.append(1)
        return acked

    step = SyncStep(StepSettings(), _Emitter(), read)
    step.run([obs], mappings)
    idle = step.kept.idle[KEY, "sub"]
    assert idle.source is obs.state
    assert obs.state._acked is None
    assert obs.state.ledgers is not None and obs.state.ledgers._memo is None
    copy = replace(obs, state=CursorState(obs.state.mark_delete, obs.state.individually_deleted,
                                          Ledgers(obs.state.ledgers.ids.copy(),
                                                  obs.state.ledgers.entries.copy())))
    (record,) = step.run([copy], mappings).records
    assert record.repeated and step.kept.idle[KEY, "sub"] is idle
    moved = replace(obs, state=CursorState(Position(5, 8), RangeSet(), obs.state.ledgers))
    (record,) = step.run([moved], mappings).records
    assert not record.repeated and (KEY, "sub") not in step.kept.idle


def test_a_packed_idle_cursor_whose_source_topic_was_created_again_halts() -> None:
    """The previous observation of a packed cursor is its packed source: entries it showed
    unacked, gone with a source topic deleted and created since, halt the sync."""
    _, mappings, target = _world(0)
    source = CursorState(Position(5, 4), RangeSet(), Ledgers.of([(5, 10)]))
    at_target = CursorState(Position(7, 4), RangeSet(), target.ledgers)
    step = SyncStep(StepSettings(rewind_policy="report"), _Emitter(), lambda t, s: at_target,
                    source_created_at=lambda topic: TopicCreation("2026-11-23T00:00:00Z", (9,)))
    for _ in range(3):
        (record,) = step.run([ObservedCursor(KEY, "sub", source, NOW)], mappings).records
        assert record.result == "emitted" and not record.plan.to_ack
    again = CursorState(Position(9, -1), RangeSet(), Ledgers.of([(9, 0)]))
    (record,) = step.run([ObservedCursor(KEY, "sub", again, NOW)], mappings).records
    assert record.result == "halted" and record.plan.rewound_entries == 5


def test_a_checked_time_counts_for_the_lag_never_as_evidence_of_the_state() -> None:
    """A cursor the source's stats confirm unchanged after its read carries its read time
    and the time of the check: the records' lag counts from the check; a source topic
    created again between the read and the check is judged on the ledgers the read saw
    (its entries shown unacked then were never acked)."""
    _, mappings, target = _world(0)
    source = CursorState(Position(5, 4), RangeSet(), Ledgers.of([(5, 10)]))
    at_target = CursorState(Position(7, 4), RangeSet(), target.ledgers)
    created = TopicCreation("2026-11-23T00:05:00Z", (9,))
    step = SyncStep(StepSettings(rewind_policy="report"), _Emitter(), lambda t, s: at_target,
                    source_created_at=lambda topic: created)
    for minutes in (0, 4, 10):
        checked = NOW + timedelta(minutes=minutes)
        (record,) = step.run([ObservedCursor(KEY, "sub", source, NOW, checked)],
                             mappings).records
        assert record.result == "emitted" and record.source_observed_at == checked
    again = CursorState(Position(9, -1), RangeSet(), Ledgers.of([(9, 0)]))
    read = NOW + timedelta(minutes=11)
    (record,) = step.run([ObservedCursor(KEY, "sub", again, read)], mappings).records
    assert record.result == "halted" and record.plan.rewound_entries == 5
    assert record.source_observed_at == read


def test_a_batch_with_several_observations_of_a_cursor_plans_from_the_newest() -> None:
    """A replayed batch may hold several polls: the newest observation of each cursor is the
    one planned from (the later one in the batch when two were made at once)."""
    obs, mappings, target = _world(0)
    older = replace(obs, state=CursorState(Position(5, 3), RangeSet(), obs.state.ledgers))
    newer = replace(obs, state=CursorState(Position(5, 6), RangeSet(), obs.state.ledgers),
                    observed_at=NOW + timedelta(seconds=1))
    other = replace(obs, subscription="other")
    for batch in ([newer, older, other], [older, other, newer]):
        step = SyncStep(StepSettings(dry_run=True), None, lambda t, s: target)
        records = step.run(batch, mappings).records
        assert [(r.subscription, r.plan.mark_delete) for r in records] == [
            ("other", Position(7, 9)), ("sub", Position(7, 6))]
    assert step.run([], mappings).records == []  # a poll that found nothing
    tie = replace(older, observed_at=newer.observed_at)
    step = SyncStep(StepSettings(dry_run=True), None, lambda t, s: target)
    (record,) = step.run([newer, tie], mappings).records
    assert record.plan.mark_delete == Position(7, 3)


def test_a_batch_reads_its_targets_together_and_an_unreadable_one_skips_only_its_cursor(
        ) -> None:
    """The targets a batch needs go to the batch reader in one call (its requests go out
    together); one the target's admin API cannot answer skips that cursor alone, and an
    idle cursor whose target is not due is not asked about."""
    obs, mapping, fresh = _world(0)
    target = replace(fresh, mark_delete=Position(7, 9))  # nothing to send
    keys = [PartitionKey(KEY.topic, i) for i in range(3)]
    calls: list[list[tuple[str, str]]] = []

    def many(pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Target]:
        calls.append(list(pairs))
        return {p: AdminUnavailableError("broker down") if p[0].endswith("-1") else target
                for p in pairs}

    def one(topic: str, sub: str) -> CursorState:
        raise AssertionError("read one by one")

    step = SyncStep(StepSettings(dry_run=True), None, one, read_targets=many)
    observed = [replace(obs, key=k) for k in keys]
    result = step.run(observed, {k: mapping[KEY] for k in keys})
    assert [len(c) for c in calls] == [3]
    assert result.unavailable == 1
    assert sorted(r.key.partition for r in result.records) == [0, 2]
    # Nothing to send and nothing changed: the next batch asks for the one it missed, and
    # for an idle one only if its first read falls in that batch.
    step.run(observed, {k: mapping[KEY] for k in keys})
    due = {str(k.partition) for k in keys
           if read_offset((k, "sub")) + 1 >= IDLE_TARGET_READ_EVERY}
    assert {p[0][-1] for p in calls[1]} == {"1"} | due


def test_a_gap_judged_across_target_ledgers_stays_judged_once_the_target_deletes_them() -> None:
    """Source 5:0..5:2 -> target 7:0..7:2 and 5:5..5:9 -> 9:0..9:4, the rest of target
    ledger 7 known markers, ledger 8 another topic's: source 5:3 and 5:4 were never
    replicated as data, which the target's ledger list shows only while it holds ledger 7.
    Once the target has deleted it, they are still not counted unmapped, and nobody asks
    the source about them."""
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 3), Segment(5, 5, 9, 0, 5)]),
                           skippable=Runs.of((7, 3, 3)))
    obs = ObservedCursor(KEY, "sub", CursorState(Position(5, 9), RangeSet(),
                                                 Ledgers.of([(5, 10)])), NOW)
    targets = [CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 6), (9, 5)]))]
    asked: list[list[Position]] = []
    step = SyncStep(StepSettings(dry_run=True), None, lambda t, s: targets[-1],
                    lambda t, p: asked.append(p) or [])
    step.lookups.clock = lambda: 1e9  # the mapping long settled: lookups are due
    first = step.run([obs], {KEY: mapping}).records[0].plan
    assert (first.outcome, first.unmapped_acked_entries) == ("exact", 0)
    targets.append(CursorState(Position(9, -1), RangeSet(), Ledgers.of([(9, 5)])))
    later = step.run([obs], {KEY: mapping}).records[0].plan
    assert (later.outcome, later.unmapped_acked_entries) == ("exact", 0)
    assert asked == []
    # Without the first judgement, the deleted ledger leaves them unmapped and looked up.
    fresh = SyncStep(StepSettings(dry_run=True), None, lambda t, s: targets[-1],
                     lambda t, p: asked.append(p) or [])
    fresh.lookups.clock = lambda: 1e9
    assert fresh.run([obs], {KEY: mapping}).records[0].plan.unmapped_acked_entries == 2
    assert asked == [[Position(5, 3), Position(5, 4)]]


def test_a_gap_whose_target_ids_wait_for_their_check_is_judged_then_not_looked_up() -> None:
    """Source 5:0..5:2 -> target 7:0..7:2 and 5:5..5:9 -> 7:6..7:10. While the mapping's
    skipped target ids 7:3..7:5 wait for their check, source 5:3 and 5:4 stay unmapped and
    nobody asks the source about them; once the check claims 7:3..7:5 as markers, the gap
    shows 5:3 and 5:4 were never replicated as data, and still nothing was asked."""
    segments = SegmentSet.of([Segment(5, 0, 7, 0, 3), Segment(5, 5, 7, 6, 5)])
    obs = ObservedCursor(KEY, "sub", CursorState(Position(5, 9), RangeSet(),
                                                 Ledgers.of([(5, 10)])), NOW)
    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 11)]))
    asked: list[list[Position]] = []
    step, advance = _step(target, lambda t, p: asked.append(p) or [])
    advance(1e6)  # the mapping long settled: only the wait holds the lookups back
    step.lookups.mapping_waits([KEY])
    waiting = step.run([obs], {KEY: TopicMapping(segments)}).records[0].plan
    assert (waiting.outcome, waiting.unmapped_acked_entries, asked) == ("partial", 2, [])
    step.lookups.mapping_waits([])
    claimed = TopicMapping(segments, skippable=Runs.of((7, 3, 3)))
    done = step.run([obs], {KEY: claimed}).records[0].plan
    assert (done.outcome, done.unmapped_acked_entries, asked) == ("exact", 0, [])


def test_a_gap_waiting_longer_than_the_wait_cap_is_looked_up() -> None:
    """Skipped target ids that stay waiting do not keep the gap's source entries from
    their lookup for more than MARKER_LOOKUP_WAIT_MAX_S."""
    segments = SegmentSet.of([Segment(5, 0, 7, 0, 3), Segment(5, 5, 7, 6, 5)])
    obs = ObservedCursor(KEY, "sub", CursorState(Position(5, 9), RangeSet(),
                                                 Ledgers.of([(5, 10)])), NOW)
    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 11)]))
    asked: list[list[Position]] = []
    step, advance = _step(target, lambda t, p: asked.append(p) or p)
    advance(1e6)
    step.lookups.mapping_waits([KEY])
    step.run([obs], {KEY: TopicMapping(segments)})
    advance(MARKER_LOOKUP_WAIT_MAX_S - 1)
    step.lookups.mapping_waits([KEY])  # still waiting: since the first time it was seen
    step.run([obs], {KEY: TopicMapping(segments)})
    assert asked == []
    advance(1)
    step.lookups.mapping_waits([KEY])
    plan = step.run([obs], {KEY: TopicMapping(segments)}).records[0].plan
    assert asked == [[Position(5, 3), Position(5, 4)]]
    assert (plan.outcome, plan.unmapped_acked_entries) == ("exact", 0)


def test_background_lookups_keep_the_batch_from_waiting_and_the_next_takes_their_answers(
        ) -> None:
    obs, mappings, target = _world(3)
    asked: list[list[Position]] = []
    gate = threading.Event()

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        assert gate.wait(10)
        asked.append(positions)
        return [p for p in positions if p.entry != 11]

    step, advance = _step(target, lookup, background=True)
    step.run([obs], mappings)
    advance(MARKER_LOOKUP_SETTLE_S)
    # Asked, and the batch goes on without the answer: its lookup is still held back.
    assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 3
    assert not step.lookups.answered(0.1)
    assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 3
    gate.set()
    assert step.lookups.answered(10)
    plan = step.run([obs], mappings).records[0].plan
    assert asked == [[Position(5, 10), Position(5, 11), Position(5, 12)]]  # once
    assert plan.unmapped_acked_entries == 1 and step.lookups.count == 3
    step.run([obs], mappings)
    assert len(asked) == 1 and step.lookups.count == 0
    step.lookups.close()


def test_background_lookups_are_bounded_in_flight_and_the_cursors_left_out_go_first_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(marker_lookups_module, "MARKER_LOOKUP_THREADS", 1)  # calls in order
    per = 10
    cursors = MARKER_LOOKUPS_IN_FLIGHT // per + 3
    observed, mappings, target = _gapped(cursors, per)
    asked: list[str] = []
    gate = threading.Event()

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        asked.append(topic)
        assert gate.wait(10)
        return positions

    step, _ = _step(target, lookup, background=True)
    step.run(observed, mappings)
    step.run(observed, mappings)  # nothing answered: nothing more asked
    gate.set()
    assert step.lookups.answered(10)
    first = sorted(asked)
    assert len(first) == MARKER_LOOKUPS_IN_FLIGHT // per + 1  # the last one in part
    asked.clear()
    taken = step.run(observed, mappings)
    assert sum(r.plan.unmapped_acked_entries for r in taken.records) == (
        cursors * per - MARKER_LOOKUPS_IN_FLIGHT)
    # The first cursor the bound left out (in the batch that found all in flight) goes
    # first, and the rest are asked now.
    assert step.lookups.answered(10)
    assert asked[0] == observed[MARKER_LOOKUPS_IN_FLIGHT // per + 1].key.concrete_topic()
    assert len(asked) == cursors - MARKER_LOOKUPS_IN_FLIGHT // per
    done = step.run(observed, mappings)
    assert sum(r.plan.unmapped_acked_entries for r in done.records) == 0
    step.lookups.close()


def test_a_background_lookup_that_fails_is_asked_again() -> None:
    obs, mappings, target = _world(2)
    calls: list[int] = []

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        calls.append(len(positions))
        if len(calls) == 1:
            raise AdminUnavailableError("the admin API of http://a:8080 did not answer")
        return positions

    step, advance = _step(target, lookup, background=True)
    step.run([obs], mappings)
    advance(MARKER_LOOKUP_SETTLE_S)
    step.run([obs], mappings)
    assert step.lookups.answered(10)
    assert step.run([obs], mappings).records[0].plan.unmapped_acked_entries == 2  # again
    assert step.lookups.answered(10)
    assert step.run([obs], mappings).records[0].plan.outcome == "exact"
    assert calls == [2, 2]
    step.lookups.close()
