"""A source topic deleted and created again, told from trimming by ledger ids, not clocks.

A cluster draws every ledger id from one increasing sequence, and a topic's managed ledger
exists before any of its ledgers, so a ledger of the topic at or above the lowest id it owns
now (data or cursor ledger) is the same topic's (trimmed, so acked); one below it is unknown
(an older topic's, never acked, or trimmed before). Checked for a cursor observed before
(its vanished entries) and for one observed for the first time (the mapped entries its
markDeletePosition covers before the source's ledgers). The real-bed tests
(tests/integration/sync/test_recreation.py) pin what the brokers do and drive the job
through a deletion made before the subscription is synced.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from cursorsync.core.continuity import Uncovered, same_topic, uncovered, unlisted_copies
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import SafePlan
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.errors import AdminUnavailableError, MalformedAdminOutputError
from cursorsync.pulsar.admin import TopicCreation, parse_topic_creation
from cursorsync.pulsar.emitter import EmitResult
from cursorsync.sync.step import StepSettings, SyncStep

KEY = PartitionKey("persistent://t/n/orders", 0)
NOW = datetime(2026, 11, 28, tzinfo=UTC)
#: Source 5:0..5:9 -> target 7:0..7:9, source 9:0..9:4 -> target 7:10..7:14.
MAPPING = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10), Segment(9, 0, 7, 10, 5)]))
FRESH_TARGET = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 20)]))


class _Emitter:
    def __init__(self) -> None:
        self.sent: list[SafePlan] = []

    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None) -> EmitResult:
        self.sent.append(safe)
        return EmitResult(safe.plan.to_ack.count_entries(ledgers), None, 0)


def _first_observation(created: Callable[[str], TopicCreation] | None,
                       source: CursorState | None = None,
                       target: CursorState = FRESH_TARGET) -> tuple[Any, _Emitter]:
    """One batch for a cursor never observed before: the source cursor at 9:4, its topic
    listing ledger 9 only (ledger 5 gone)."""
    state = source or CursorState(Position(9, 4), RangeSet(), Ledgers.of([(9, 5)]))
    emitter = _Emitter()
    step = SyncStep(StepSettings(), emitter, lambda t, s: target, source_created_at=created)
    result = step.run([ObservedCursor(KEY, "sub", state, NOW)], {KEY: MAPPING})
    return result, emitter


# ---------------------------------------------------------------- the rules, pure


def test_a_ledger_list_is_the_same_topics_when_it_reaches_the_lowest_owned_id() -> None:
    listed = Ledgers.of([(5, 10), (7, 3)])
    assert same_topic(listed, 7) and same_topic(listed, 3)
    assert not same_topic(listed, 8)  # every ledger it listed is older than the topic
    assert not same_topic(None, 3) and not same_topic(listed, None)
    assert not same_topic(Ledgers.of([]), 3)


def test_unlisted_copies_are_the_unacked_copies_of_covered_entries_before_a_ledger() -> None:
    source = CursorState(Position(9, 4), RangeSet(), Ledgers.of([(9, 5)]))
    assert unlisted_copies(source, MAPPING.segments, FRESH_TARGET, 9) == RangeSet.of(
        ("7:-1", "7:9"))
    assert not unlisted_copies(source, MAPPING.segments, FRESH_TARGET, 5)
    acked = CursorState(Position(7, 4), RangeSet(), FRESH_TARGET.ledgers)
    assert unlisted_copies(source, MAPPING.segments, acked, 9) == RangeSet.of(("7:4", "7:9"))
    # Entries the cursor does not cover are none of its business.
    holes = CursorState(Position(5, 1), RangeSet.of(("9:-1", "9:4")), Ledgers.of([(9, 5)]))
    assert unlisted_copies(holes, MAPPING.segments, FRESH_TARGET, 9) == RangeSet.of(
        ("7:-1", "7:1"))


def test_what_is_uncovered_is_judged_on_the_observations_then_on_the_source() -> None:
    """Ledger 5 listed before and ledger 9 now, nothing in common: 5:5..5:9 vanished unacked
    and their copies are before any listed ledger. A source owning a ledger at or below 5
    clears both; listed together with 9 before, ledger 5 is the same topic's without
    asking."""
    segments = MAPPING.segments
    before = CursorState(Position(5, 4), RangeSet(), Ledgers.of([(5, 10)]))
    now = CursorState(Position(9, 4), RangeSet(), Ledgers.of([(9, 5)]))
    found = uncovered(before, now, segments, FRESH_TARGET)
    assert found.vanished == 5 and found.copies == RangeSet.of(("7:-1", "7:9"))
    assert not uncovered(before, now, segments, FRESH_TARGET, first_owned=5)
    assert uncovered(before, now, segments, FRESH_TARGET, first_owned=6) == found
    both = CursorState(Position(5, 4), RangeSet(), Ledgers.of([(5, 10), (9, 0)]))
    assert not uncovered(both, now, segments, FRESH_TARGET)
    # Observed for the first time: only the copies speak.
    assert uncovered(None, now, segments, FRESH_TARGET) == Uncovered(0, found.copies)
    assert not uncovered(None, now, segments, FRESH_TARGET, first_owned=3)


def test_internal_info_gives_the_creation_and_every_ledger_the_topic_owns() -> None:
    """The shape Pulsar 4.0.8 answers (see the real-bed test below): data ledgers, and each
    cursor's ledger, -1 while a cursor has none."""
    doc = {"version": 3, "creationDate": "2026-11-28T06:47:40.553Z",
           "modificationDate": "2026-11-28T06:47:43.16Z",
           "ledgers": [{"ledgerId": 7, "entries": 60, "size": 1730, "timestamp": 1,
                        "isOffloaded": False}, {"ledgerId": 11, "timestamp": 2}],
           "cursors": {"pulsar.repl.b": {"creationDate": "2026-11-28T06:47:40.566Z",
                                         "cursorsLedgerId": 12},
                       "s1": {"creationDate": "2026-11-28T06:47:40.57Z",
                              "cursorsLedgerId": -1}}}
    found = parse_topic_creation("persistent://t/n/x", doc)
    assert found == TopicCreation("2026-11-28T06:47:40.553Z", (7, 11, 12))
    assert found.first_ledger == 7
    assert TopicCreation("2026-11-28T06:47:40.553Z", ()).first_ledger is None
    for bad, says in [({"creationDate": "x"}, "creationDate is not an ISO 8601 time"),
                      ({**doc, "ledgers": [{"ledgerId": "7"}]}, r"ledgers\[0\].ledgerId"),
                      ({**doc, "cursors": []}, "field cursors is not a JSON dict"),
                      ({**doc, "cursors": {"s": {"cursorsLedgerId": None}}},
                       "cursors.s.cursorsLedgerId")]:
        with pytest.raises(MalformedAdminOutputError, match=says):
            parse_topic_creation("persistent://t/n/x", bad)


# ------------------------------------------------- a cursor observed for the first time


def test_a_first_observation_over_an_older_topics_ledgers_halts_and_sends_nothing() -> None:
    """Ledger 5 is older than every ledger the topic owns now (9): its entries may be of a
    topic deleted since, never acked, so their copies stay unacked; the subscription
    halts until an operator resumes it."""
    result, emitter = _first_observation(lambda t: TopicCreation("c", (9, 10)))
    (record,) = result.records
    assert record.result == "halted" and record.plan.rewound_entries == 10
    assert emitter.sent == [] and result.halted_count == 1


def test_a_first_observation_over_ledgers_trimmed_from_its_own_topic_syncs() -> None:
    """The topic owns ledger 3 (a cursor's), older than ledger 5: ledger 5 was its own and
    was trimmed, so acked by every cursor."""
    result, emitter = _first_observation(lambda t: TopicCreation("c", (3, 9, 10)))
    (record,) = result.records
    assert record.result == "emitted"
    assert [s.plan.to_ack for s in emitter.sent] == [RangeSet.of(("7:-1", "7:14"))]


def test_a_first_observation_with_nothing_mapped_before_the_sources_ledgers_asks_nothing(
        ) -> None:
    def never(topic: str) -> TopicCreation:
        raise AssertionError("the source is not asked")

    lists_five = CursorState(Position(9, 4), RangeSet(), Ledgers.of([(5, 10), (9, 5)]))
    result, emitter = _first_observation(never, lists_five)
    assert result.records[0].result == "emitted" and len(emitter.sent) == 1
    # Copies the target acked already are not at stake either.
    acked = CursorState(Position(7, 9), RangeSet(), FRESH_TARGET.ledgers)
    result, emitter = _first_observation(never, target=acked)
    assert result.records[0].result == "emitted"
    assert [s.plan.to_ack for s in emitter.sent] == [RangeSet.of(("7:9", "7:14"))]


def test_a_first_observation_the_source_cannot_explain_waits_or_halts() -> None:
    """Internal-info unreadable: nothing is sent, nothing recorded, and the cursor is still
    a first observation next batch. No way to ask at all: unknown is not acked."""
    answers: list[TopicCreation | Exception] = [AdminUnavailableError("internal-info failed")]

    def created(topic: str) -> TopicCreation:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    emitter = _Emitter()
    step = SyncStep(StepSettings(), emitter, lambda t, s: FRESH_TARGET, source_created_at=created)
    state = CursorState(Position(9, 4), RangeSet(), Ledgers.of([(9, 5)]))
    obs = ObservedCursor(KEY, "sub", state, NOW)
    result = step.run([obs], {KEY: MAPPING})
    assert result.records == [] and result.unavailable == 1 and emitter.sent == []
    answers.append(TopicCreation("c", (9,)))
    (record,) = step.run([obs], {KEY: MAPPING}).records
    assert record.result == "halted" and emitter.sent == []
    result, emitter = _first_observation(None)
    assert result.records[0].result == "halted" and emitter.sent == []


def test_a_cursor_observed_before_is_judged_on_its_ledgers_not_on_clocks() -> None:
    """Entries shown unacked in ledger 5, then gone: the same topic when it owns a ledger at
    or below 5 (trimmed), else unknown (halted). The creation date plays no part."""
    before = CursorState(Position(5, 4), RangeSet(), Ledgers.of([(5, 10)]))
    after = CursorState(Position(9, 4), RangeSet(), Ledgers.of([(9, 5)]))
    for owned, outcome in [((4, 9), "emitted"), ((5, 9), "emitted"), ((9,), "halted"),
                           ((6, 9), "halted")]:
        step = SyncStep(StepSettings(rewind_policy="report"), _Emitter(),
                        lambda t, s: FRESH_TARGET,
                        source_created_at=lambda t, o=owned: TopicCreation("c", o))  # type: ignore[misc]
        step.run([ObservedCursor(KEY, "sub", before, NOW)], {KEY: MAPPING})
        (record,) = step.run([ObservedCursor(KEY, "sub", after, NOW)], {KEY: MAPPING}).records
        assert record.result == outcome, owned


@pytest.mark.parametrize(("first_listed", "expected"), [
    ([(5, 10), (9, 0)], "emitted"),  # ledger 5 listed with 9: the same topic, trimmed since
    ([(5, 10)], "halted"),  # ledger 5 only: the topic now owns none that old (deleted since)
])
def test_a_cursor_whose_first_plan_waited_is_judged_on_its_first_observation(
        first_listed: list[tuple[int, int]], expected: str) -> None:
    """Two cursors, one first plan a batch: the second waits while its topic's ledger 5 is
    trimmed. Its first observation, when it listed ledger 5, is the witness at its plan."""
    other = PartitionKey("persistent://t/n/orders", 1)
    emitter = _Emitter()
    step = SyncStep(StepSettings(first_plans_per_batch=1), emitter,
                    lambda t, s: FRESH_TARGET,
                    source_created_at=lambda t: TopicCreation("c", (9, 10)))
    mappings = {KEY: MAPPING, other: MAPPING}
    first = CursorState(Position(5, 4), RangeSet(), Ledgers.of(first_listed))
    now = CursorState(Position(9, 4), RangeSet(), Ledgers.of([(9, 5)]))
    waited = step.run([ObservedCursor(other, "sub", first, NOW),
                       ObservedCursor(KEY, "sub", first, NOW)], mappings)
    assert [r.key for r in waited.records] == [KEY]  # the other one waits
    result = step.run([ObservedCursor(other, "sub", now, NOW)], mappings)
    (record,) = result.records
    assert record.key == other and record.result == expected, record
