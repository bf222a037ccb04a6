"""The pulsar-entries source on the real test bed, its driver and executor code called
directly: rows, batches and identity, replays, admission control, offsets and commits."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import cursorsync.mapping.entries_read as entries_read
from cursorsync.core.identity import MessageIdentity, entry_digest, message_digest
from cursorsync.core.positions import Position
from cursorsync.mapping.entries import PulsarEntriesStreamReader
from cursorsync.mapping.entries_options import EntriesReadError
from cursorsync.mapping.entries_read import read_entries
from cursorsync.mapping.entries_tasks import (
    BEFORE_ALL,
    entries_offset,
    entries_positions,
)
from cursorsync.pulsar.msgid import batch_size_of
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.entries import (
    REPL,
    as_dicts,
    client_of,
    entries_reader,
    local_topic,
    produce,
    read_all,
    read_range_by_range,
)
from tests.support.waiting import wait_for

# -- pins: what the brokers and the Python client do --------------------------------------


@pytest.mark.integration
def test_pin_last_message_id_reader_start_and_cumulative_ack(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """latest_position, read_entries' start and batch sizes, and commit() rest on these."""
    topic = local_topic(testbed, "a", topic_name("pin"), partitions=3)[2]
    client = client_of(testbed, "a")
    cons = client.subscribe(topic, "pin", consumer_type=pulsar.ConsumerType.Failover,
                            receiver_queue_size=0,
                            initial_position=pulsar.InitialPosition.Earliest)
    # An empty topic: -1:-1, whatever ledger it has open; a reader says nothing is there.
    last = cons.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (-1, -1)
    assert Position.parse(testbed.internal_stats("a", topic)["lastConfirmedEntry"]).entry == -1
    probe = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not probe.has_message_available()
    probe.close()
    produce(client, topic, unbatched=2, batches=[3])
    last = cons.get_last_message_id()
    assert (last.entry_id(), last.batch_index()) == (2, 2)  # the last message of the batch
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    ids = [reader.read_next(5000).message_id() for _ in range(5)]
    reader.close()
    assert [(m.entry_id(), m.batch_index(), m.partition()) for m in ids] == [
        (0, -1, 2), (1, -1, 2), (2, 0, 2), (2, 1, 2), (2, 2, 2)]
    # No batch-size accessor, but a batched id serialises with MessageIdData.batch_size.
    assert [batch_size_of(m) for m in ids] == [1, 1, 3, 3, 3]
    ledger = ids[0].ledger_id()
    # A reader started at L:E:-1 EXCLUSIVE re-delivers the batched entry L:E.
    reader = client.create_reader(topic, pulsar.MessageId(2, ledger, 2, -1))
    again = [reader.read_next(5000).message_id() for _ in range(3)]
    reader.close()
    assert [(m.entry_id(), m.batch_index()) for m in again] == [(2, 0), (2, 1), (2, 2)]
    # A cumulative ack of a never-dispatched entry from the zero-queue consumer applies.
    cons.acknowledge_cumulative(pulsar.MessageId(2, ledger, 1, -1))
    cons.close()
    wait_for("the cumulative ack", lambda: testbed.internal_stats("a", topic)["cursors"][
        "pin"]["markDeletePosition"] == f"{ledger}:1")
    again_cons = client.subscribe(topic, "pin", consumer_type=pulsar.ConsumerType.Failover)
    first = again_cons.receive(5000).message_id()
    again_cons.close()
    assert (first.entry_id(), first.batch_index()) == (2, 0)


@pytest.mark.integration
def test_pin_the_native_reader_under_pulsar_reader(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """read_entries reads on ``pulsar.Reader._reader`` (no Python wrapper per message): it
    is there, its messages answer every accessor the rows use as the wrapper's do, and a
    poll with nothing left raises pulsar.Timeout. Without it the read falls back to the
    wrapper: slower, the same rows."""
    topic = local_topic(testbed, "a", topic_name("native"), partitions=1)[0]
    client = client_of(testbed, "a")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"payload", properties={"key": "k"}, partition_key="pk", event_timestamp=7)
    producer.close()
    wrapped = client.create_reader(topic, pulsar.MessageId.earliest)
    second = client.create_reader(topic, pulsar.MessageId.earliest)
    native = second._reader
    a, b = wrapped.read_next(5000), native.read_next(5000)
    for accessor in ("data", "properties", "producer_name", "publish_timestamp",
                     "event_timestamp", "partition_key", "ordering_key"):
        assert getattr(a, accessor)() == getattr(b, accessor)(), accessor
    ids = [m.message_id() for m in (a, b)]
    assert len({(i.ledger_id(), i.entry_id(), i.batch_index(), i.partition()) for i in ids}) == 1
    assert [batch_size_of(i) for i in ids] == [1, 1]
    with pytest.raises(pulsar.Timeout):
        native.read_next(200)
    wrapped.close()
    second.close()


@pytest.mark.integration
def test_entries_rows_batches_and_identity(testbed: TestBed, topics: list[str]) -> None:
    r = entries_reader(testbed, topics)
    try:
        start = r.initialOffset()
        assert start == entries_offset({t: BEFORE_ALL for t in topics})
        end = r.latestOffset(start, ReadAllAvailable())
        assert list(end) == ["version", "positions"] and end["version"] == 1
        assert entries_positions(end)[topics[0]].entry == 4
        rows = as_dicts(read_all(r, start, end))
    finally:
        r.stop()
    p0 = [x for x in rows if x["partition"] == 0]
    p1 = [x for x in rows if x["partition"] == 1]
    assert len(p0) == 3 + 4 + 1 and len(p1) == 2 + 3
    assert {x["topic"] for x in rows} == {str(TopicName.parse(topics[0]).base)}
    assert [(x["entry"], x["batch_index"], x["batch_size"]) for x in p0] == [
        (0, -1, 1), (1, -1, 1), (2, -1, 1), (3, 0, 4), (3, 1, 4), (3, 2, 4), (3, 3, 4),
        (4, 0, 1)]
    first = p0[0]
    assert first["source_position"] == "77:5" and p0[1]["source_position"] is None
    assert first["properties"] == {"i": "0", REPL: "77:5"}
    assert first["partition_key"] == "k0" and p0[3]["partition_key"] is None
    assert first["event_time"] == 1000 and p0[3]["event_time"] is None
    assert first["payload_size"] == 2 and first["producer_name"] == "single0"
    # An entry carrying the source-position property is mapped by it: no digest is spent.
    assert first["identity"] is None and first["entry_identity"] is None
    second = p0[1]
    expect = message_digest(MessageIdentity(
        producer_name=second["producer_name"], publish_time=second["publish_time"],
        event_time=second["event_time"], partition_key=second["partition_key"],
        properties=second["properties"], payload=b"u1"))
    assert second["identity"] == expect
    batch = p0[3:7]
    assert {x["entry_identity"] for x in batch} == {entry_digest([x["identity"] for x in batch])}
    digested = [x["identity"] for x in rows if x["source_position"] is None]
    assert None not in digested and len(set(digested)) == len(digested)


@pytest.mark.integration
def test_entries_replay_is_deterministic(testbed: TestBed, topics: list[str]) -> None:
    r = entries_reader(testbed, topics)
    try:
        start = {"version": 1, "positions": {topics[0]: "-1:-1", topics[1]: "-1:-1"}}
        end = r.latestOffset(start, ReadAllAvailable())
        first = read_all(r, start, end)
        again = [read_all(r, start, end) for _ in range(5)]
    finally:
        r.stop()
    # Both partitions end with a batched entry: every read must finish it.
    assert len(first) == 13
    assert all(rows == first for rows in again)


@pytest.mark.integration
def test_admission_control_splits_on_entries_never_inside_a_batch(
        testbed: TestBed, topics: list[str]) -> None:
    r = entries_reader(testbed, topics, maxRowsPerBatch="3")
    try:
        assert r.getDefaultReadLimit() == ReadMaxRows(3)
        batches = read_range_by_range(r)
        offset = r.initialOffset()
        everything = as_dicts(read_all(r, offset, r.latestOffset(offset, ReadAllAvailable())))
    finally:
        r.stop()
    assert len(batches) >= 3
    for b in batches:
        assert len({(x["partition"], x["entry"]) for x in b}) <= 3  # entries per batch
        for x in b:  # every batch holds whole entries
            assert sum(1 for y in b if (y["partition"], y["entry"]) ==
                       (x["partition"], x["entry"])) == x["batch_size"]

    def key(x: dict[str, Any]) -> tuple[int, int, int]:
        return (x["partition"], x["entry"], x["batch_index"])

    # Together the batches are exactly one read of the whole range: nothing lost or repeated.
    assert sorted((x for b in batches for x in b), key=key) == sorted(everything, key=key)
    assert len(everything) == 13


@pytest.mark.integration
def test_start_inside_topic_and_commit_acks_subscription(
        testbed: TestBed, topics: list[str]) -> None:
    """commit(end) acks end cumulatively on the mapping subscription, so retention keeps
    only what is not mapped yet."""
    r = entries_reader(testbed, [topics[0]], subscription="commit-test")
    try:
        start = r.initialOffset()
        led = entries_positions(r.latestOffset(start, ReadAllAvailable()))[topics[0]].ledger
        mid = entries_offset({topics[0]: Position(led, 2)})
        end = r.latestOffset(mid, ReadAllAvailable())
        rows = as_dicts(read_all(r, mid, end))
        assert [x["entry"] for x in rows] == [3, 3, 3, 3, 4]
        mid3 = entries_offset({topics[0]: Position(led, 3)})
        assert [x["entry"] for x in as_dicts(read_all(r, mid3, end))] == [4]
        assert r.partitions(end, end) == []
        r.commit(mid)
    finally:
        r.stop()
    wait_for("the cumulative ack", lambda: testbed.internal_stats("a", topics[0])["cursors"][
        "commit-test"]["markDeletePosition"] == f"{led}:2")


@pytest.mark.integration
def test_topics_discovered_through_admin(testbed: TestBed, topics: list[str]) -> None:
    base = TopicName.parse(topics[0]).base
    r = entries_reader(testbed, [str(base)])
    try:
        assert r.topics() == topics  # a partitioned name expands to its partitions
    finally:
        r.stop()
    r = entries_reader(testbed, [], namespace="public/default",
                       topicPattern=re.escape(base.local))
    try:
        assert r.topics() == topics
        end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        assert len(read_all(r, r.initialOffset(), end)) == 13
    finally:
        r.stop()


@pytest.mark.integration
def test_available_now_stops_at_the_target(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    (topic,) = local_topic(testbed, "a", topic_name("avail"))
    client = client_of(testbed, "a")
    produce(client, topic, unbatched=2, batches=[])
    r = entries_reader(testbed, [topic])
    try:
        r.prepareForTriggerAvailableNow()
        produce(client, topic, unbatched=1, batches=[], tag="late")
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        assert entries_positions(end)[topic].entry == 1  # the late entry 2 is not in this run
        assert r.latestOffset(end, ReadAllAvailable()) == end
    finally:
        r.stop()


@pytest.mark.integration
def test_latest_asked_right_after_an_unload_waits_for_the_consumer_to_reconnect(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """An unloaded topic (the brokers' load balancing moves bundles all the time) answers
    its reconnecting consumer's last-message-id request with an error for a moment: the
    reader asks again rather than failing the mapping query's batch."""
    (topic,) = local_topic(testbed, "a", topic_name("unloaded"))
    produce(client_of(testbed, "a"), topic, unbatched=3, batches=[])
    r = entries_reader(testbed, [topic])
    try:
        last = r.latest_position(topic)
        assert last.entry == 2
        for _ in range(5):
            testbed.admin_call("a", "PUT", TopicName.parse(topic).admin_path("unload"))
            assert r.latest_position(topic) == last
    finally:
        r.stop()


@pytest.mark.integration
def test_latest_of_an_empty_topic_is_before_all_and_starting_latest(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """A real broker answers -1:-1 for a topic with no entry (its open ledger has none)."""
    (topic,) = local_topic(testbed, "a", topic_name("empty"))
    r = entries_reader(testbed, [topic], startingPosition="latest")
    try:
        assert r.latest_position(topic) == BEFORE_ALL
        start = r.initialOffset()
        assert entries_positions(start) == {topic: BEFORE_ALL}
        assert r.latestOffset(start, ReadAllAvailable()) == start
        produce(client_of(testbed, "a"), topic, unbatched=1, batches=[])
        end = r.latestOffset(start, ReadAllAvailable())
        assert len(read_all(r, start, end)) == 1
    finally:
        r.stop()
    (later,) = local_topic(testbed, "a", topic_name("later"))
    produce(client_of(testbed, "a"), later, unbatched=2, batches=[])
    r = entries_reader(testbed, [later], startingPosition="latest")
    try:
        start = r.initialOffset()  # what is there already is not read
        assert entries_positions(start)[later].entry == 1
        assert r.latestOffset(start, ReadAllAvailable()) == start
    finally:
        r.stop()


@pytest.mark.integration
def test_a_requested_batch_moves_the_offset_s_tick_and_reads_nothing(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """The mapping sink's request (skipped ids waiting for their check) gives one batch with
    no new entries: the offset's tick moves once, and its ranges are empty."""
    from cursorsync import wake

    (topic,) = local_topic(testbed, "a", topic_name("wake"))
    produce(client_of(testbed, "a"), topic, unbatched=2, batches=[])
    path = tmp_path / "mapping-wake"
    r = entries_reader(testbed, [topic], wakeFile=str(path))
    try:
        start = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        assert r.latestOffset(start, ReadAllAvailable()) == start  # nothing new, no request
        wake.request(path, 7)
        woken = r.latestOffset(start, ReadAllAvailable())
        assert woken == {**start, "tick": 7}
        assert entries_positions(woken) == entries_positions(start)
        assert list(r.partitions(start, woken)) == []
        # The same request again moves nothing; a later one does.
        assert r.latestOffset(woken, ReadAllAvailable()) == woken
        wake.request(path, 9)
        assert r.latestOffset(woken, ReadAllAvailable())["tick"] == 9
        path.write_text("not a number")  # unreadable: no request, the tick stays
        assert r.latestOffset(woken, ReadAllAvailable()) == woken
    finally:
        r.stop()


@pytest.mark.integration
def test_entries_without_identity_evidence_spend_no_digest(
        testbed: TestBed, topics: list[str]) -> None:
    r = entries_reader(testbed, topics, identity="false")
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        rows = as_dicts(read_all(r, start, end))
    finally:
        r.stop()
    assert rows
    assert all(x["identity"] is None and x["entry_identity"] is None for x in rows)


@pytest.mark.integration
def test_a_range_the_broker_cannot_complete_fails_instead_of_returning_part(
        testbed: TestBed, topics: list[str]) -> None:
    """Entries skipped silently would look like marker holes to the builder, and be acked.
    Ids not written yet are not "nothing to deliver": the tail check waits for them."""
    r = entries_reader(testbed, topics)
    try:
        start = r.initialOffset()
        parts = r.partitions(start, r.latestOffset(start, ReadAllAvailable()))
    finally:
        r.stop()
    first = parts[0].ranges[0]
    last = Position.parse(first.end)
    beyond = dataclasses.replace(first, end=str(Position(last.ledger, last.entry + 3)),
                                 read_timeout_ms=1500, tail_check_ms=200)
    with pytest.raises(EntriesReadError, match="partial range"):
        list(read_entries(beyond))


@pytest.mark.integration
def test_entries_one_row_per_entry(testbed: TestBed, topics: list[str]) -> None:
    per_message = entries_reader(testbed, topics)
    per_entry = entries_reader(testbed, topics, rowsPer="entry")
    try:
        start = per_message.initialOffset()
        end = per_message.latestOffset(start, ReadAllAvailable())
        msgs = as_dicts(read_all(per_message, start, end))
        ents = as_dicts(read_all(per_entry, start, end))
    finally:
        per_message.stop()
        per_entry.stop()
    firsts = {(x["partition"], x["ledger"], x["entry"]): x for x in reversed(msgs)}
    assert len(ents) == len(firsts) < len(msgs)
    for x in ents:
        assert x == firsts[(x["partition"], x["ledger"], x["entry"])]


@pytest.mark.integration
def test_a_task_of_several_ranges_reads_what_a_task_per_range_reads(
        testbed: TestBed, topics: list[str]) -> None:
    packed = entries_reader(testbed, topics)
    alone = entries_reader(testbed, topics, rangesPerTask="1")
    try:
        end = packed.latestOffset(packed.initialOffset(), ReadAllAvailable())
        # From each topic's first entry: ranges in one ledger, of known size (one from
        # before every entry without admission control has no size and a task of its own).
        start = entries_offset({t: Position(p.ledger, 0)
                                for t, p in entries_positions(end).items()})
        assert [len(t.ranges) for t in packed.partitions(start, end)] == [2]
        assert [len(t.ranges) for t in alone.partitions(start, end)] == [1, 1]
        assert read_all(packed, start, end) == read_all(alone, start, end)
    finally:
        packed.stop()
        alone.stop()


@pytest.mark.integration
def test_ranges_read_on_kept_readers_give_the_rows_of_a_reader_per_range(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Real Pulsar 4.0: a topic of single messages, batches and chunked messages, read
    range after range on readers kept from one range to the next (the default), gives
    the rows of a reader opened at each range's start. Ranges end inside batches' runs
    and between a chunked message's chunks: the kept reader delivers such a message in
    the next range, whose start reader never does; it is dropped there."""
    [t] = local_topic(testbed, "a", topic_name("kept"))
    client = client_of(testbed, "a")
    produce(client, t, unbatched=3, batches=[3, 2], tag="0")
    chunky = client.create_producer(t, batching_enabled=False, chunking_enabled=True)
    chunky.send(b"c" * (600 * 1024))  # 256 KB messages on a: three chunks
    produce(client, t, unbatched=1, batches=[4], tag="1")
    chunky.send(b"d" * (300 * 1024))
    chunky.close()
    produce(client, t, unbatched=2, batches=[2], tag="2")
    kept = entries_reader(testbed, [t], tailCheckMs="200")
    alone = entries_reader(testbed, [t], tailCheckMs="200", keptReaders="0")
    try:
        last = entries_positions(kept.latestOffset(kept.initialOffset(), ReadAllAvailable()))[t]
        assert last.entry == 14  # 5 + 3 chunks + 2 + 2 chunks + 3
        for step in (1, 2, 3):
            bounds = [Position(last.ledger, e) for e in range(0, last.entry, step)] + [last]
            before = entries_read.KEPT.taken

            def rows(r: PulsarEntriesStreamReader, bounds: list[Position] = bounds
                     ) -> list[list[tuple]]:
                return [list(read_entries(r.ranges({t: lo}, {t: hi})[0]))
                        for lo, hi in itertools.pairwise(bounds)]

            on_kept = rows(kept)
            assert entries_read.KEPT.taken - before == len(bounds) - 2, step
            assert on_kept == rows(alone), step
            read = [r for x in on_kept for r in x]
            # every message but the chunked ones split by a range's end, in order
            assert [(r[4], r[5]) for r in read] == sorted((r[4], r[5]) for r in read)
            chunked = {r[4]: r[17] for r in read if r[17] is not None}
            assert chunked == {e: f for e, f in {7: f"{last.ledger}:5",
                                                 11: f"{last.ledger}:10"}.items()
                               if not any(int(f.split(":")[1]) <= b.entry < e
                                          for b in bounds)}, step
    finally:
        kept.stop()
        alone.stop()
