"""A source topic deleted and created again, told from trimming by ledger ids, not clocks.

A cluster draws every ledger id from one increasing sequence, and a topic's managed ledger
exists before any of its ledgers, so a ledger of the topic at or above the lowest id it owns
now (data or cursor ledger) is the same topic's (trimmed, so acked); one below it is unknown
(an older topic's, never acked, or trimmed before). Checked for a cursor observed before
(its vanished entries) and for one observed for the first time (the mapped entries its
markDeletePosition covers before the source's ledgers). The real-bed tests pin what the
brokers do and drive the job through a deletion made before the subscription is synced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.app.job import start_job
from cursorsync.core.continuity import Uncovered, same_topic, uncovered, unlisted_copies
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import SafePlan
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.errors import AdminUnavailableError, MalformedAdminOutputError
from cursorsync.pulsar.admin import AdminClient, AdminSettings, TopicCreation, parse_topic_creation
from cursorsync.pulsar.emitter import EmitResult
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.halts import read_halts
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.tables import open_store
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import drain
from tests.support.job_on_bed import SUB, consumer_on_a, send_and_ack, shared_topic

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


# ------------------------------------------------------------------ on the real brokers


def _info(bed: TestBed, topic: str) -> dict[str, Any]:
    found: dict[str, Any] = bed.admin_call("a", "GET", TopicName.parse(topic).admin_path(
        "internal-info"))
    return found


@pytest.mark.integration
def test_the_brokers_keep_a_topics_creation_across_an_unload_and_draw_ids_upwards(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """What the rule stands on, on Pulsar 4.0.8: one ledger-id sequence for data and cursor
    ledgers; an unload keeps creationDate and the ledgers the cursors still need; deleted
    and created again, the topic has another creationDate and only ledgers above every
    old one."""
    topic = testbed.topic(topic_name("ids"))
    testbed.create_topic(topic)
    consumer = testbed.client("a").subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                             initial_position=pulsar.InitialPosition.Earliest)
    producer = testbed.client("a").create_producer(topic, batching_enabled=False)
    for i in range(70):  # a rolls its ledgers every 60 entries
        producer.send(f"m{i}".encode())
    for i in range(70):
        msg = consumer.receive(10_000)
        if i % 2:
            consumer.acknowledge(msg)
    admin = AdminClient(AdminSettings.from_urls(testbed.admin_url("a")))
    try:
        first = _until_cursor_ledger(admin, topic)
        ids = _ids(_info(testbed, topic))
        assert len(ids["data"]) >= 2 and ids["cursors"], ids
        testbed.admin_call("a", "PUT", TopicName.parse(topic).admin_path("unload"))
        producer.send(b"after the unload")
        msg = consumer.receive(10_000)
        consumer.acknowledge(msg)
        reloaded = _until_cursor_ledger(admin, topic)
        assert reloaded.created == first.created
        # The unacked entries keep the old ledgers; a new one and new cursor ledgers come.
        assert set(ids["data"]) <= set(reloaded.ledgers)
        assert max(reloaded.ledgers) > max(first.ledgers)
        consumer.close()
        producer.close()
        testbed.admin_call("a", "DELETE", TopicName.parse(topic).admin_path() + "?force=true")
        testbed.client("a").subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest).close()
        again = admin.creation(topic)
        assert again.created != first.created
        assert again.first_ledger is not None and again.first_ledger > max(reloaded.ledgers)
        stats = testbed.internal_stats("a", topic)
        assert Position.parse(stats["cursors"]["s"]["markDeletePosition"]).ledger == min(
            lg["ledgerId"] for lg in stats["ledgers"])
    finally:
        admin.close()


def _ids(info: dict[str, Any]) -> dict[str, list[int]]:
    return {"data": [lg["ledgerId"] for lg in info["ledgers"]],
            "cursors": [c["cursorsLedgerId"] for c in info["cursors"].values()
                        if c["cursorsLedgerId"] >= 0]}


def _until_cursor_ledger(admin: AdminClient, topic: str) -> TopicCreation:
    """The topic's creation once a cursor has persisted into a ledger (after its first
    acks; a cursor creates its ledger when it first persists)."""
    deadline = time.monotonic() + 30
    while True:
        found = admin.creation(topic)
        info = admin.get_json(TopicName.parse(topic).admin_path("internal-info"), "info")
        if any(c["cursorsLedgerId"] >= 0 for n, c in info["cursors"].items() if n == "s"):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no cursor ledger for s on {topic}: {info}")
        time.sleep(0.5)


@pytest.mark.integration
@pytest.mark.spark
def test_a_subscription_first_synced_after_its_source_topic_was_created_again_halts(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """a's topic holds ten messages, four acked; it is deleted and created again (with the
    subscription, three new messages acked) before the job ever synced the subscription.
    The job's first observation covers the old ledgers: their copies on b stay unacked and
    the subscription halts, with no observation before to compare with."""
    topic = shared_topic(testbed, topic_name("first-seen"))
    consumer = consumer_on_a(testbed, topic)
    producer = testbed.client("a").create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"old-{i}".encode())
    producer.close()
    for _ in range(10):
        msg = consumer.receive(timeout_millis=10_000)
        if int(msg.data().decode().split("-")[1]) < 4:
            consumer.acknowledge(msg)
    testbed.wait_replicated([topic])
    consumer.close()
    old = [lg["ledgerId"] for lg in testbed.internal_stats("a", topic)["ledgers"]]
    testbed.admin_call("a", "DELETE", TopicName.parse(topic).admin_path() + "?force=true")
    consumer = consumer_on_a(testbed, topic)
    send_and_ack(testbed, topic, consumer, 3)
    consumer.close()
    testbed.wait_replicated([topic])
    new = [lg["ledgerId"] for lg in testbed.internal_stats("a", topic)["ledgers"]]
    assert min(new) > max(old), (old, new)

    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB])
    store = open_store("delta-rs", config.tables.path)
    clusters = {"source_cluster": config.source.name, "target_cluster": config.target.name}
    job = start_job(config)
    try:
        deadline = time.monotonic() + 120
        while not any(k[1] == SUB for k in read_halts(store, **clusters)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        job.wait_batches(2, timeout_s=60)
    finally:
        job.stop()
    got = sorted(m.data().decode() for m in drain(testbed, topic, SUB, "Shared"))
    # The six never acked on a are there, none lost (and, a defect rather than a loss, the
    # four acked before the deletion and the three after: the halt sent nothing).
    assert {f"old-{i}" for i in range(4, 10)} <= set(got), got
    assert any(k[1] == SUB for k in read_halts(store, **clusters)), "the subscription did not halt"
    cursor = testbed.internal_stats("b", topic)["cursors"][SUB]
    assert cursor["individuallyDeletedMessages"] == "[]", cursor
