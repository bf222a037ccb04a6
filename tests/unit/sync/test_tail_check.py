"""The sync step with a tail check: the acked source entries past a partition's last mapped
entry are classified by one question to the source's broker, asked on a thread of its own
once the mapping has stopped moving, and answered in a later batch."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.errors import CursorSyncError
from cursorsync.sync.marker_lookups import MARKER_LOOKUP_SETTLE_S, TAIL_CHECK_AFTER_POLL_S
from cursorsync.sync.step import StepSettings, SyncStep
from tests.unit.sync.test_sync import KEY, NOW, _world


class Tail:
    """A source broker's answers, recorded: ``nothing`` past the asked entry is dispatchable,
    or an error."""

    def __init__(self, nothing: bool = True) -> None:
        self.nothing = nothing
        self.error: CursorSyncError | None = None
        self.asked: list[tuple[str, Position]] = []
        self.asked_at: list[float] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, topic: str, after: Position, not_before: float) -> bool:
        time.sleep(max(0.0, not_before - time.monotonic()))  # as the real checks wait
        self.asked.append((topic, after))
        self.asked_at.append(time.time())
        self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return self.nothing


def _step(target: CursorState, tail: Tail, lookups: list[list[Position]]
          ) -> tuple[SyncStep, list[float]]:
    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        lookups.append(positions)
        return positions

    step = SyncStep(StepSettings(dry_run=True), None, lambda t, s: target, lookup,
                    tail_check=tail)
    now = [0.0]
    step.lookups.clock = lambda: now[0]
    return step, now


def _unmapped(step: SyncStep, obs: ObservedCursor, mappings: dict) -> int:
    return int(step.run([obs], mappings).records[0].plan.unmapped_acked_entries)


def test_one_question_classifies_the_whole_tail_and_no_entry_is_looked_up() -> None:
    obs, mappings, target = _world(40)
    tail, lookups = Tail(), []
    step, now = _step(target, tail, lookups)
    assert _unmapped(step, obs, mappings) == 40
    assert tail.asked == []  # the mapping may still be moving
    now[0] += MARKER_LOOKUP_SETTLE_S
    assert _unmapped(step, obs, mappings) == 40  # asked; the answer is the next batch's
    assert step.lookups.answered(10)
    assert tail.asked == [(KEY.concrete_topic(), Position(5, 9))]
    plan = step.run([obs], mappings).records[0].plan
    assert plan.unmapped_acked_entries == 0 and plan.outcome == "exact"
    assert step.lookups.markers(KEY) == RangeSet.of((Position(5, 9), Position(5, 49)))
    assert lookups == [] and len(tail.asked) == 1
    assert (step.lookups.tail_checks, step.lookups.tail_markers) == (1, 40)
    step.lookups.close()


def test_something_dispatchable_past_it_sends_the_tail_to_the_lookups_one_by_one() -> None:
    """A message the mapping has not reached, or a broker that answers its last entry
    whatever it is: the entries are looked up as without the check; a message found stops
    the lookups there until the mapping moves, and then the check is asked again."""
    obs, mappings, target = _world(12)
    tail, lookups = Tail(nothing=False), []
    found = {"markers": False}

    def lookup(topic: str, positions: list[Position]) -> list[Position]:
        lookups.append(positions)
        return positions if found["markers"] else []

    step = SyncStep(StepSettings(dry_run=True), None, lambda t, s: target, lookup,
                    tail_check=tail)
    now = [0.0]
    step.lookups.clock = lambda: now[0]
    step.run([obs], mappings)
    now[0] += MARKER_LOOKUP_SETTLE_S
    step.run([obs], mappings)
    assert step.lookups.answered(10)
    for _ in range(3):
        assert _unmapped(step, obs, mappings) == 12
        now[0] += MARKER_LOOKUP_SETTLE_S
    assert len(tail.asked) == 1
    assert lookups == [[Position(5, 10 + i) for i in range(8)]]  # a message: behind
    moved = {KEY: TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 12)]))}
    step.run([obs], moved)
    now[0] += MARKER_LOOKUP_SETTLE_S
    step.run([obs], moved)
    assert step.lookups.answered(10)
    assert tail.asked[1] == (KEY.concrete_topic(), Position(5, 11))
    found["markers"] = True  # the broker answers its last entry, a marker
    # 5:12..5:17 were found messages; the rest of the tail is looked up now.
    assert _unmapped(step, obs, moved) == 6
    assert lookups[-1] == [Position(5, 18 + i) for i in range(4)]
    step.lookups.close()


def test_a_failed_question_is_asked_again_and_classifies_nothing() -> None:
    obs, mappings, target = _world(5)
    tail, lookups = Tail(), []
    tail.error = CursorSyncError("the brokers of pulsar://a:6650 did not answer")
    step, now = _step(target, tail, lookups)
    step.run([obs], mappings)  # the last mapped entry first seen
    now[0] += MARKER_LOOKUP_SETTLE_S
    step.run([obs], mappings)
    assert step.lookups.answered(10)
    tail.error = None
    assert _unmapped(step, obs, mappings) == 5  # the error taken; asked again
    assert step.lookups.answered(10)
    assert len(tail.asked) == 2
    assert _unmapped(step, obs, mappings) == 0
    assert step.lookups.tail_checks == 1
    step.lookups.close()


def test_only_entries_the_source_listed_before_the_question_are_classified() -> None:
    """Acked past the ledger list the poll read (an entry the list does not show may not
    exist yet when the broker answers): those entries are not taken as markers."""
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]))
    source = CursorState(Position(5, 14), RangeSet(), Ledgers.of([(5, 13)]))
    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 10)]))
    obs = ObservedCursor(KEY, "sub", source, NOW)
    tail, lookups = Tail(), []
    step, now = _step(target, tail, lookups)
    step.run([obs], {KEY: mapping})  # the last mapped entry first seen
    now[0] += MARKER_LOOKUP_SETTLE_S
    step.run([obs], {KEY: mapping})
    assert step.lookups.answered(10)
    step.run([obs], {KEY: mapping})
    assert step.lookups.markers(KEY) == RangeSet.of((Position(5, 9), Position(5, 12)))
    step.lookups.close()


def test_a_question_under_way_is_not_asked_twice_and_markers_written_later_are_asked_for(
        ) -> None:
    obs, mappings, target = _world(4)
    tail, lookups = Tail(), []
    tail.gate.clear()
    step, now = _step(target, tail, lookups)
    step.run([obs], mappings)  # the last mapped entry first seen
    now[0] += MARKER_LOOKUP_SETTLE_S
    for _ in range(3):
        assert _unmapped(step, obs, mappings) == 4
    assert not step.lookups.answered(0.2)
    assert len(tail.asked) == 1
    tail.gate.set()
    assert step.lookups.answered(10)
    assert _unmapped(step, obs, mappings) == 0
    more = ObservedCursor(KEY, "sub", CursorState(Position(5, 15), RangeSet(),
                                                  Ledgers.of([(5, 16)])), NOW)
    assert _unmapped(step, more, mappings) == 2  # two markers written since
    assert step.lookups.answered(10)
    assert len(tail.asked) == 2
    assert _unmapped(step, more, mappings) == 0
    step.lookups.close()


def test_the_question_waits_until_the_poll_that_saw_the_acks_is_a_while_old() -> None:
    """An entry acked before the poll was readable before it; the broker takes it into its
    last dispatchable position just after it becomes readable, so asking a while after the
    poll leaves that step time to be done."""
    obs, mappings, target = _world(3)
    tail, lookups = Tail(), []
    step, now = _step(target, tail, lookups)
    step.run([obs], mappings)
    now[0] += MARKER_LOOKUP_SETTLE_S
    fresh = replace(obs, observed_at=datetime.now(UTC))
    step.run([fresh], mappings)
    assert step.lookups.answered(10)
    assert tail.asked_at[0] >= fresh.observed_at.timestamp() + TAIL_CHECK_AFTER_POLL_S
    assert _unmapped(step, fresh, mappings) == 0
    step.lookups.close()
