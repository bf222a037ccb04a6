"""The target subscription reset, or deleted and created again, between the target read and
the emit: a cumulative ack covers only what the source vouches for, never what only the
old subscription had acked. Run on the real test bed, with the sync step and the real
emitter; the reset lands exactly between the two by a target reader that makes it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pulsar
import pytest

from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import check_safe, guard
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import translate
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.emitter import PulsarEmitter
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.sync.target_reads import AdminTargets, Target, fresh_target
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import drain

SUB = "sync-failover"
STAMP = "__MSG_PROP_REPL_SOURCE_POSITION"


class _Consumer:
    def __init__(self) -> None:
        self.acks: list[tuple[str, int, int]] = []

    def acknowledge(self, mid: Any) -> None:
        self.acks.append(("id", mid.ledger_id(), mid.entry_id()))

    def acknowledge_cumulative(self, mid: Any) -> None:
        self.acks.append(("cumulative", mid.ledger_id(), mid.entry_id()))

    def is_connected(self) -> bool:
        return True

    def close(self) -> None:
        pass


class _Client:
    def __init__(self) -> None:
        self.consumer = _Consumer()

    def get_topic_partitions(self, topic: str) -> list[str]:
        return [topic]

    def subscribe(self, *args: Any, **kwargs: Any) -> _Consumer:
        return self.consumer


def _emitted(source_acked: RangeSet, target_md: Position) -> list[tuple[str, int, int]]:
    """Source 5:0..5:19 -> target 7:0..7:19; the target read shows up to ``target_md``
    acked; what the emitter sends, cumulative, with what the read alone vouches for as
    the step names it."""
    mapping = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 20)]))
    source = CursorState(Position(5, -1), source_acked, Ledgers.of([(5, 20)]))
    target = CursorState(target_md, RangeSet(), Ledgers.of([(7, 20)]))
    plan = translate(source, mapping, target)
    client = _Client()
    emitter = PulsarEmitter("pulsar://unused:6650", subscription_type="Failover",
                            client=client)  # type: ignore[arg-type]
    unproven = check_safe(plan, source, mapping, fresh_target(target.ledgers))
    emitter.apply("persistent://t/n/x", SUB, guard(plan, source, mapping, target),
                  cumulative=True, ledgers=target.ledgers, unproven=unproven)
    return client.consumer.acks


def test_the_cumulative_ack_stops_where_only_the_targets_read_vouches() -> None:
    # a acked 5:10..5:19, b's read shows 7:0..7:9 acked: nothing cumulative, ten by id.
    sent = _emitted(RangeSet.of(("5:9", "5:19")), Position(7, 9))
    assert sent == [("id", 7, e) for e in range(10, 20)]
    # a acked 5:0..5:4 and 5:10..5:19, b's read shows 7:0..7:9: cumulative to 7:4 only.
    sent = _emitted(RangeSet.of(("5:-1", "5:4"), ("5:9", "5:19")), Position(7, 9))
    assert sent == [("id", 7, e) for e in range(10, 20)]
    sent = _emitted(RangeSet.of(("5:-1", "5:4"), ("5:9", "5:19")), Position(7, 2))
    assert sent == [*[("id", 7, e) for e in range(10, 20)], ("cumulative", 7, 4)]
    # a vouches for everything: one cumulative ack.
    assert _emitted(RangeSet.of(("5:-1", "5:19")), Position(7, 9)) == [("cumulative", 7, 19)]


def _topic_acked_in_halves(bed: TestBed, name: str, *, a_acks_all: bool = False) -> str:
    """m0..m19 sent on a and replicated. On a, SUB acks m10..m19 (all of them with
    ``a_acks_all``); on b, SUB's consumers acked m0..m9 themselves (the old subscription's
    acks, which a does not vouch for), and are gone."""
    topic = bed.topic(name)
    bed.create_topic(topic)
    on_b = bed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Failover,
                                     initial_position=pulsar.InitialPosition.Earliest)
    on_a = bed.client("a").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Failover,
                                     initial_position=pulsar.InitialPosition.Earliest)
    producer = bed.client("a").create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"m{i}".encode())
    producer.close()
    for _ in range(20):
        msg = on_a.receive(10_000)
        if a_acks_all or int(msg.data().decode()[1:]) >= 10:
            on_a.acknowledge(msg)
    on_a.close()
    bed.wait_replicated([topic])
    for _ in range(10):
        msg = on_b.receive(10_000)
        assert int(msg.data().decode()[1:]) < 10
        on_b.acknowledge(msg)
    on_b.close()
    return topic


def _mapping(bed: TestBed, topic: str) -> TopicMapping:
    """b's entries paired with the source positions the replicator stamped on them."""
    reader = bed.client("b").create_reader(topic, pulsar.MessageId.earliest)
    pairs: list[tuple[int, int, int, int]] = []
    try:
        while reader.has_message_available():
            msg = reader.read_next(10_000)
            ledger, entry = (int(x) for x in msg.properties()[STAMP].split(":"))
            mid = msg.message_id()
            pairs.append((ledger, entry, mid.ledger_id(), mid.entry_id()))
    finally:
        reader.close()
    assert len(pairs) == 20
    cols = list(zip(*pairs, strict=True))
    return TopicMapping(SegmentSet.from_pairs(*cols))  # type: ignore[arg-type]


def _source(admin: AdminClient, topic: str) -> ObservedCursor:
    stats = admin.internal_stats(topic)
    cur = stats.subscriptions[SUB].state
    state = CursorState(cur.mark_delete, cur.individually_deleted, stats.ledgers)
    return ObservedCursor(PartitionKey(topic), SUB, state, datetime.now(UTC))


def _sync_once(bed: TestBed, topic: str, between: Callable[[], None]) -> int:
    """One sync step, cumulative, with ``between`` run right after the target read; the
    acks the step sent."""
    source = AdminClient(AdminSettings.from_urls(bed.admin_url("a")))
    targets = AdminTargets(AdminClient(AdminSettings.from_urls(bed.admin_url("b"))))

    def read_then_race(pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Target]:
        read = targets.many(pairs)
        between()
        return read

    emitter = PulsarEmitter(bed.service_url("b"), subscription_type="Failover")
    try:
        step = SyncStep(StepSettings(cumulative=True), emitter, targets, None, source.creation,
                        read_targets=read_then_race)
        result = step.run([_source(source, topic)], {PartitionKey(topic): _mapping(bed, topic)})
        (record,) = result.records
        assert record.result == "emitted", record
        return result.acks_sent
    finally:
        emitter.close()  # flushes the acks
        source.close()
        targets.admin.close()


def _on_b(bed: TestBed, topic: str) -> set[str]:
    return {m.data().decode() for m in drain(bed, topic, SUB, "Failover")}


def _reset_to_start(bed: TestBed, topic: str) -> Callable[[], None]:
    first = bed.internal_stats("b", topic)["ledgers"][0]["ledgerId"]

    def reset() -> None:
        bed.admin_call("b", "POST", TopicName.parse(topic).admin_path(
            f"subscription/{SUB}/resetcursor"),
            json={"ledgerId": first, "entryId": -1, "partitionIndex": -1})
        md = bed.internal_stats("b", topic)["cursors"][SUB]["markDeletePosition"]
        assert Position.parse(md) < Position(first, 0), md

    return reset


def _delete(bed: TestBed, topic: str) -> Callable[[], None]:
    def delete() -> None:
        bed.admin_call("b", "DELETE", TopicName.parse(topic).admin_path(
            f"subscription/{SUB}?force=true"))
        assert SUB not in bed.internal_stats("b", topic)["cursors"]

    return delete


@pytest.mark.integration
@pytest.mark.parametrize("race", ["deleted", "reset"])
def test_a_target_subscription_changed_after_the_read_gets_no_ack_a_does_not_vouch_for(
        testbed: TestBed, topic_name: Callable[[str], str], race: str) -> None:
    """b's read shows m0..m9 acked (by the old subscription), a vouches for m10..m19: the
    plan's markDeletePosition is m19. The subscription is then deleted (the emitter
    creates it again, at Earliest) or reset to its start: a cumulative ack to m19 would
    ack m0..m9 on it, which a never acked. The emitter acks m10..m19 one by one; m0..m9
    stay for b's consumers."""
    topic = _topic_acked_in_halves(testbed, topic_name(race))
    between = _delete(testbed, topic) if race == "deleted" else _reset_to_start(testbed, topic)
    sent = _sync_once(testbed, topic, between)
    assert _on_b(testbed, topic) == {f"m{i}" for i in range(10)}
    assert sent == 10  # no cumulative ack: ten by id


@pytest.mark.integration
def test_what_a_vouches_for_is_still_acked_cumulatively(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """a acks m0..m19: nothing in the cumulative span rests on b's read, so one cumulative
    ack goes, and a reset after the read loses nothing either."""
    topic = _topic_acked_in_halves(testbed, topic_name("vouched"), a_acks_all=True)
    assert _sync_once(testbed, topic, _reset_to_start(testbed, topic)) == 1
    assert _on_b(testbed, topic) == set()
