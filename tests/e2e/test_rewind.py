"""A source cursor reset backwards on the real test bed: the sync of that subscription
halts, stays halted while the source moves on, and goes on only after `resume`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest

from cursorsync.app.job import start_job
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, load_config, parse_config
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.halts import read_halts, resume
from cursorsync.tables import TableStore, open_store
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import drain
from tests.support.job_on_bed import (
    SUB,
    ack_all,
    consumer_on_a,
    last_data_entry,
    mark_delete,
    running,
    send_and_ack,
    shared_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]



def _latest_outcome(store: TableStore, topic: str) -> str | None:
    rows = [r for r in store.read("sync_progress").to_pylist() if r["topic"] == topic]
    return max(rows, key=lambda r: (r["batch_id"], r["emitted_at"]))["outcome"] if rows else None


def _latest_batch(store: TableStore, topic: str) -> int:
    return max(r["batch_id"] for r in store.read("sync_progress").to_pylist()
               if r["topic"] == topic)


def _md(bed: TestBed, cluster: str, topic: str) -> Position:
    return mark_delete(bed, cluster, topic, SUB)


def _until(what: str, check: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.5)


def test_a_source_reset_backwards_halts_the_sync_until_resumed(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    topic = shared_topic(testbed, topic_name("rewind"))
    consumer = consumer_on_a(testbed, topic)
    send_and_ack(testbed, topic, consumer, 20)
    testbed.wait_replicated([topic])

    data = load_config(EMBEDDED_CONFIG_PATH).model_dump(mode="json", by_alias=True)
    data["emission"]["rewind_policy"] = "halt"
    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB],
                         base=parse_config(data))
    store = open_store("delta-rs", config.tables.path)
    clusters = {"source_cluster": "a", "target_cluster": "b"}
    job = start_job(config)
    try:
        last = last_data_entry(testbed, topic)
        _until("b's cursor follows a's", lambda: _md(testbed, "b", topic) >= last)
        synced = _md(testbed, "b", topic)
        # Back to the 5th message: what the source had acked after it is unacked again.
        acked = _md(testbed, "a", topic)
        fifth = Position(acked.ledger, acked.entry - 15)
        testbed.admin_call("a", "POST", TopicName.parse(topic).admin_path(
            f"subscription/{SUB}/resetcursor"),
            json={"ledgerId": fifth.ledger, "entryId": fifth.entry, "partitionIndex": -1})
        _until("the sync halts", lambda: _latest_outcome(store, topic) == "halted")
        assert len(read_halts(store, **clusters)) == 1
        # The source moves on past where it was; the halt holds, b does not move.
        send_and_ack(testbed, topic, consumer, 5)
        ack_all(consumer)
        testbed.wait_replicated([topic])
        job.wait_batches(3, timeout_s=60)
        assert _latest_outcome(store, topic) == "halted"
        assert _md(testbed, "b", topic) == synced
        # The operator resumes: the sync goes on and b follows a again.
        resume(store, topic=topic, subscription=SUB, **clusters)
        last = last_data_entry(testbed, topic)
        _until("b's cursor follows a's after resume", lambda: _md(testbed, "b", topic) >= last)
        assert _latest_outcome(store, topic) in ("exact", "partial")
    finally:
        job.stop()


def _send_and_ack_every_other(bed: TestBed, topic: str, consumer: pulsar.Consumer,
                              prefix: str, n: int) -> set[str]:
    """``prefix-0`` .. ``prefix-<n-1>`` sent on a; ``consumer`` acks the even ones and keeps
    the odd ones unacked. Returns the unacked ones."""
    producer = bed.client("a").create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(f"{prefix}-{i}".encode())
    producer.close()
    unacked = set()
    for _ in range(n):
        msg = consumer.receive(timeout_millis=10_000)
        text = msg.data().decode()
        if int(text.rsplit("-", 1)[1]) % 2 == 0:
            consumer.acknowledge(msg)
        else:
            unacked.add(text)
    return unacked


def _unacked_on_b(bed: TestBed, topic: str) -> int | None:
    """Entries b's SUB has not acked (None: no such subscription)."""
    with AdminClient(AdminSettings.from_urls(bed.admin_url("b"))) as admin:
        stats = admin.internal_stats(topic)
    cursor = stats.subscriptions.get(SUB)
    if cursor is None:
        return None
    everything = RangeSet.up_to(stats.last_confirmed_entry)
    return (everything - cursor.state.acked()).count_entries(stats.ledgers)


def _caught_up(bed: TestBed, topic: str, unacked: Callable[[], int]) -> Callable[[], bool]:
    """b's SUB exists and has acked at least what a acked (no more than ``unacked()``
    entries left): then what it has left is checked message by message."""
    def check() -> bool:
        left = _unacked_on_b(bed, topic)
        return left is not None and left <= unacked()

    return check


def _left_on_b(bed: TestBed, topic: str) -> set[str]:
    """What a fresh consumer of b's SUB receives: every message b's SUB has not acked."""
    return {m.data().decode() for m in drain(bed, topic, SUB, "Shared")}


def _on_b(bed: TestBed, topic: str) -> set[str]:
    """Every message b's topic holds."""
    reader = bed.client("b").create_reader(topic, pulsar.MessageId.earliest)
    got = set()
    try:
        while reader.has_message_available():
            got.add(reader.read_next(10_000).data().decode())
    finally:
        reader.close()
    return got


def test_a_target_subscription_deleted_under_the_job_comes_back(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """The target subscription is deleted (forced, with the emitter attached) while the job
    runs: the sync starts it again from a fresh target cursor, at Earliest, and b's cursor
    follows a's again. a acks every other message, before and after: b ends with exactly
    the ones a did not ack left to deliver."""
    topic = shared_topic(testbed, topic_name("dropped"))
    consumer = consumer_on_a(testbed, topic)
    unacked = _send_and_ack_every_other(testbed, topic, consumer, "old", 10)
    testbed.wait_replicated([topic])
    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB])
    job = start_job(config)
    try:
        _until("b acks what a acked", _caught_up(testbed, topic, lambda: len(unacked)))
        testbed.admin_call("b", "DELETE", TopicName.parse(topic).admin_path(
            f"subscription/{SUB}?force=true"))
        unacked |= _send_and_ack_every_other(testbed, topic, consumer, "new", 10)
        testbed.wait_replicated([topic])
        _until("the subscription is back and acks what a acked",
               _caught_up(testbed, topic, lambda: len(unacked)))
        job.wait_batches(2, timeout_s=60)
    finally:
        job.stop()
        consumer.close()
    assert len(unacked) == 10
    assert _left_on_b(testbed, topic) == unacked


def test_a_target_topic_deleted_under_the_job_comes_back(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """The target topic is deleted (forced) while the job runs: Pulsar creates it again at
    once (the replicator from a, the job's reader), empty, on new ledgers. The sync starts
    the subscription again on it and b's cursor follows a's over what is replicated from
    then on. a acks every other message: of what b holds, exactly the ones a did not ack
    are left to deliver."""
    topic = shared_topic(testbed, topic_name("deleted-on-b"))
    consumer = consumer_on_a(testbed, topic)
    unacked = _send_and_ack_every_other(testbed, topic, consumer, "old", 10)
    testbed.wait_replicated([topic])
    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB])
    try:
        with running(config):
            _until("b acks what a acked", _caught_up(testbed, topic, lambda: len(unacked)))
            before = [lg["ledgerId"] for lg in testbed.internal_stats("b", topic)["ledgers"]]
            testbed.admin_call("b", "DELETE",
                               TopicName.parse(topic).admin_path() + "?force=true")
            unacked |= _send_and_ack_every_other(testbed, topic, consumer, "new", 10)
            testbed.wait_replicated([topic])
            after = [lg["ledgerId"] for lg in testbed.internal_stats("b", topic)["ledgers"]]
            assert min(after) > max(before), (before, after)
            _until("the subscription is back on the new topic and acks what a acked",
                   _caught_up(testbed, topic, lambda: len(unacked & _on_b(testbed, topic))))
    finally:
        consumer.close()
    held = _on_b(testbed, topic)
    assert {f"new-{i}" for i in range(10)} <= held
    assert len(unacked & held) == 5
    assert _left_on_b(testbed, topic) == unacked & held


def test_more_partitions_under_the_job_are_synced(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """A partitioned topic grows from 2 to 3 partitions while the job runs: the new
    partition's acks wait until the mapping discovers it, then b follows a there too."""
    topic = shared_topic(testbed, topic_name("growing"), partitions=2)
    consumer = consumer_on_a(testbed, topic)
    send_and_ack(testbed, topic, consumer, 10)
    data = load_config(EMBEDDED_CONFIG_PATH).model_dump(mode="json", by_alias=True)
    data["spark"]["topic_discovery_interval_s"] = 2
    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB],
                         base=parse_config(data))
    job = start_job(config)
    try:
        job.wait_batches(2, timeout_s=90)
        for cluster in ("a", "b"):
            testbed.admin_call(cluster, "POST", TopicName.parse(topic).admin_path("partitions"),
                               json=3)
        new = f"{topic}-partition-2"
        testbed.client("b").subscribe(new, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest).close()
        consumer.close()
        consumer = testbed.client("a").subscribe(
            topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest)
        send_and_ack(testbed, topic, consumer, 30)
        testbed.wait_replicated([topic])
        last = last_data_entry(testbed, new)
        assert last.entry >= 0, "the new partition got messages"
        _until("b follows a on the new partition", lambda: _md(testbed, "b", new) >= last)
    finally:
        job.stop()


def test_a_source_topic_deleted_and_created_again_halts_the_sync(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """Six messages are never acked on a; then a's topic is deleted (forced) and created
    again, with the subscription, on new ledgers: the new cursor's markDeletePosition
    covers the old ledgers. Their copies on b stay unacked, and the sync halts."""
    topic = shared_topic(testbed, topic_name("deleted-on-a"))
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
    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB])
    store = open_store("delta-rs", config.tables.path)
    clusters = {"source_cluster": config.source.name, "target_cluster": config.target.name}

    def synced() -> bool:
        rows = [r for r in store.read("sync_progress").to_pylist() if r["topic"] == topic]
        return sum(r["acks_sent"] for r in rows) >= 4 and _latest_outcome(
            store, topic) == "exact"

    with running(config):
        try:
            _until("b's cursor follows a's over the four acked messages", synced)
            consumer.close()
            testbed.admin_call("a", "DELETE",
                               TopicName.parse(topic).admin_path() + "?force=true")
            # The topic and its subscription, created again.
            consumer = consumer_on_a(testbed, topic)
            send_and_ack(testbed, topic, consumer, 3)
            _until("the sync of the subscription halts",
                   lambda: any(k[1] == SUB for k in read_halts(store, **clusters)))
            # A batch records its halts before its sync_progress rows: the halting batch's
            # row, then the next batch's, say halted.
            _until("the halting batch's row", lambda: _latest_outcome(store, topic) == "halted")
            halting = _latest_batch(store, topic)
            _until("a later batch's row", lambda: _latest_batch(store, topic) > halting)
            assert _latest_outcome(store, topic) == "halted"
        finally:
            consumer.close()
    reader = testbed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
    got = set()
    try:
        while True:
            try:
                got.add(reader.receive(timeout_millis=3000).data().decode())
            except pulsar.Timeout:
                break
    finally:
        reader.close()
    assert {f"old-{i}" for i in range(4, 10)} <= got, got
    assert not {f"old-{i}" for i in range(4)} & got, got
