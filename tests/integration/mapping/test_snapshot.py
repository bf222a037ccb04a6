"""Snapshot-marker evidence on the real test bed: the brokers' own replicated-subscription
snapshots, read from a's topic through the admin API, move b's cursor on their own, and
catch a mapping that contradicts them.

Pulsar writes snapshots into a topic while it has a replicated subscription and new
traffic, once a second. Each test keeps one (``rs``, acked as it goes) beside the
subscription cursorsync syncs (``sync-shared``, not replicated, so the built-in never moves
it on b)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.app.job import start_job
from cursorsync.app.settings import Config
from cursorsync.app.settings.sync import MAPPING_SUBSCRIPTION_PREFIX
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.mapping.sink import MappingSink
from cursorsync.pulsar.topics import TopicName
from cursorsync.tables import open_store
from cursorsync.tables.mappings_table import load_mappings
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from tests.support.replicated import source_positions_on_b

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SUB = "sync-shared"
#: Messages produced, one every GAP_S, and the one the consumer on a never acks.
COUNT, GAP_S, HOLE = 70, 0.1, 55


def _cursor(bed: TestBed, cluster: str, topic: str) -> tuple[Position, RangeSet]:
    c = bed.internal_stats(cluster, topic)["cursors"][SUB]
    return (Position.parse(c["markDeletePosition"]),
            RangeSet.parse(c.get("individuallyDeletedMessages") or "[]"))


def _acked(md: Position, ranges: RangeSet, p: Position) -> bool:
    return p <= md or ranges.contains(p)


def _until(what: str, check: Callable[[], bool], timeout_s: float = 120.0,
           detail: Callable[[], object] = lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what} {detail()}")
        time.sleep(0.5)


def _workload(bed: TestBed, topic: str) -> list[tuple[Position, float]]:
    """COUNT messages on a, GAP_S apart; ``rs`` acks all, SUB all but HOLE. Returns each
    message's position on a and publish time."""
    a = bed.client("a")
    bed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest).close()
    # The job's source-side mapping subscription, as a job running before the traffic has
    # it: without it a may trim ledgers every subscription has consumed before the job
    # starts, and b's copies of their messages can never be told from foreign ones.
    a.subscribe(topic, f"{MAPPING_SUBSCRIPTION_PREFIX}-source",
                consumer_type=pulsar.ConsumerType.Failover,
                initial_position=pulsar.InitialPosition.Earliest).close()
    rs = a.subscribe(topic, "rs", consumer_type=pulsar.ConsumerType.Shared,
                     replicate_subscription_state_enabled=True,
                     initial_position=pulsar.InitialPosition.Earliest)
    sync = a.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                       initial_position=pulsar.InitialPosition.Earliest)
    producer = a.create_producer(topic, batching_enabled=False)
    sent = []
    for i in range(COUNT):
        mid = producer.send(f"m{i}".encode())
        sent.append((Position(mid.ledger_id(), mid.entry_id()), time.time()))
        rs.acknowledge(rs.receive(10_000))
        time.sleep(GAP_S)
    producer.close()
    for _ in range(COUNT):
        msg = sync.receive(10_000)
        if msg.data() != f"m{HOLE}".encode():
            sync.acknowledge(msg)
    time.sleep(3)  # the snapshot after the last message
    rs.close()
    sync.close()
    return sent


def _config(bed: TestBed, tmp_path: Path, topics: list[str]) -> Config:
    return demo_config(bed, tmp_path, topics=topics, subscriptions=[SUB],
                       strategies=["snapshot"])


@contextmanager
def _job(config: Config) -> Iterator[Any]:
    job = start_job(config)
    try:
        yield job
    finally:
        job.stop()


def test_snapshot_evidence_alone_follows_a_to_its_newest_anchor_and_loses_nothing(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """b's cursor follows a's markDeletePosition to the newest anchor at or before it, never past:
    every b entry acked has its a entry acked, the unacked message is still delivered on b
    after failover, and b lags a by no more than about one snapshot interval of traffic."""
    topic = testbed.topic(topic_name("snap"))
    testbed.create_topic(topic)
    sent = _workload(testbed, topic)
    testbed.wait_replicated([topic])
    copies = source_positions_on_b(testbed, topic)
    assert len(copies) == COUNT
    a_md, a_ranges = _cursor(testbed, "a", topic)
    assert a_md < sent[HOLE][0] and _acked(a_md, a_ranges, sent[HOLE + 1][0])

    with _job(_config(testbed, tmp_path, [topic])) as job:
        # Everything published a snapshot interval and some before the hole: b must get there.
        due = [t for t, s in copies.items()
               if sent[HOLE][1] - 2.5 > next(p for q, p in sent if q == s)]
        # Acked on b, by its markDeletePosition or individually: markers at the end of a
        # ledger, after its last message, are never claimed skippable (a reader cannot see
        # them), so the markDeletePosition may stop there while later entries are acked.
        _until("b acks everything up to within a snapshot interval of a's markDeletePosition",
               lambda: all(_acked(*_cursor(testbed, "b", topic), t) for t in due),
               timeout_s=150,
               detail=lambda: (_cursor(testbed, "b", topic), max(due), a_md, job.mapping_sink
                               .builder.known.get(PartitionKey(topic, -1))))
        time.sleep(8)  # a few more batches: nothing may go past the anchor
        anchors = job.mapping_sink.builder.known[
            PartitionKey(topic, -1)].anchors
    b_md, b_ranges = _cursor(testbed, "b", topic)
    assert len(anchors) >= 3, anchors
    for t, s in copies.items():
        if _acked(b_md, b_ranges, t):
            assert _acked(a_md, a_ranges, s), f"b acked {t}, but its source {s} is not acked on a"
    hole_copy = next(t for t, s in copies.items() if s == sent[HOLE][0])
    assert not _acked(b_md, b_ranges, hole_copy)
    # Never past the newest anchor at or before a's markDeletePosition: no message after
    # it is acked (the markers right after it are, which lets the markDeletePosition on).
    top = anchors.licensed(a_md)
    assert top is not None and top < hole_copy
    assert all(t <= top for t in copies if _acked(b_md, b_ranges, t)), (b_md, b_ranges, top)

    # Failover: the unacked message is delivered on b; the redelivered acked ones are few.
    consumer = testbed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
    got = []
    try:
        while True:
            got.append(consumer.receive(3000).data())
    except pulsar.Timeout:
        pass
    finally:
        consumer.close()
    assert f"m{HOLE}".encode() in got
    duplicates = len(got) - 1
    # About one snapshot interval (1 s) of traffic before the hole, and what follows it.
    assert duplicates <= (COUNT - HOLE - 1) + 2.5 / GAP_S, (duplicates, b_md, top)


def test_a_mapping_that_contradicts_the_anchors_is_refused_and_nothing_is_sent(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A corrupted segment (the mapping sink's test hook adds it to the first batch's rows,
    as faulty evidence would) says a's last messages are b's first entries. The anchors say
    b's first entries came from before them: the topic's plans are refused, counted and
    recorded, and nothing is sent for it; another topic of the same job goes on. Segments
    count only as far as an anchor has checked them, so no plan acts on the corruption
    before the anchors that contradict it are read."""
    bad, good = (testbed.topic(topic_name(n)) for n in ("corrupt", "fine"))
    for t in (bad, good):
        testbed.create_topic(t)
    sent = {t: _workload(testbed, t) for t in (bad, good)}
    testbed.wait_replicated([bad, good])
    copies = source_positions_on_b(testbed, bad)
    first_b = min(copies)
    late_a = sent[bad][-5][0]
    key = PartitionKey(str(TopicName.parse(bad).base), -1)
    corrupt = TopicMapping(SegmentSet.of([Segment(late_a.ledger, late_a.entry, first_b.ledger,
                                                  first_b.entry, 5, "identity")]))

    def tamper(batch_id: int, mappings: dict[PartitionKey, TopicMapping]
               ) -> dict[PartitionKey, TopicMapping]:
        if batch_id == 0:
            mappings[key] = mappings.get(key, TopicMapping()).union(corrupt)
        return mappings

    monkeypatch.setattr(MappingSink, "tamper", staticmethod(tamper))
    config = _config(testbed, tmp_path, [bad, good])
    store = open_store("delta-rs", config.tables.path)
    job = start_job(config)
    try:
        good_first = min(source_positions_on_b(testbed, good))
        _until("the good topic's b cursor moves",
               lambda: _cursor(testbed, "b", good)[0] >= good_first, timeout_s=150)
        _until("the corrupted topic's plans are refused", lambda: any(
            r["topic"] == key.topic and r["outcome"] == "refused"
            for r in store.read("sync_progress").to_pylist()), timeout_s=60)
        conflicts = job.sync_sink.metrics.registry.get_sample_value(
            "cursorsync_errors_total", {"stage": "anchor_conflict"})
    finally:
        job.stop()
    assert conflicts and conflicts >= 1
    rows = [r for r in store.read("sync_progress").to_pylist() if r["topic"] == key.topic]
    assert rows and all(r["acks_sent"] == 0 for r in rows), rows
    b_md, b_ranges = _cursor(testbed, "b", bad)
    assert b_md < first_b and not b_ranges, (b_md, b_ranges)
    known, _ = load_mappings(store, source_cluster="a", target_cluster="b")
    assert len(known[key].anchors) >= 1 and known[key].segments == corrupt.segments
