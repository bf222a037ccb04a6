"""The Spark data sources: pulsar-entries on the real test bed (two Apache Pulsar clusters),
pulsar-cursors against the stub admin server. Also pins what the entries source relies on
in Pulsar's brokers and Python client.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import cursorsync.mapping.entries_read as entries_read
import cursorsync.mapping.entries_tasks as entries_tasks
from cursorsync.app.sources import register
from cursorsync.core.identity import MessageIdentity, entry_digest, message_digest
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.errors import ConfigError
from cursorsync.mapping.entries import PulsarEntriesDataSource, PulsarEntriesStreamReader
from cursorsync.mapping.entries_options import (
    EVIDENCE_COLUMNS,
    PACKED_SCHEMA,
    EntriesOptions,
    EntriesReadError,
    schema_of,
)
from cursorsync.mapping.entries_read import read_entries
from cursorsync.mapping.entries_rows import arrow_batches, pack_batches, unpack_batches
from cursorsync.mapping.entries_tasks import (
    BEFORE_ALL,
    EntriesPartition,
    allocate,
    entries_offset,
    entries_positions,
    pack_ranges,
)
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.msgid import batch_size_of, first_chunk_of
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.cursors import (
    CursorsOptions,
    PulsarCursorsStreamReader,
    ReplayStateError,
)
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.admin_proxy import AdminProxy, Fault
from tests.support.admin_stub import BASE, Reply, StubAdmin, stats_doc
from tests.support.replicated import send_with_snapshots
from tests.support.waiting import wait_for

#: Each cluster's own namespace: a topic there is not replicated.
LOCAL_NS = "persistent://public/default"
REPL = "__MSG_PROP_REPL_SOURCE_POSITION"


# -- helpers ---------------------------------------------------------------------------

_clients: dict[str, Any] = {}


def client_of(bed: TestBed, cluster: str) -> Any:
    """One pulsar client per cluster for this module's producers and probes."""
    url = bed.service_url(cluster)
    if url not in _clients:
        _clients[url] = bed.client(cluster)  # closed by the test bed
    return _clients[url]


def local_topic(bed: TestBed, cluster: str, name: str, partitions: int = 0) -> list[str]:
    """A topic on ``cluster`` only (its public/default namespace); its partitions, or itself.

    It has a subscription from its start: a broker deletes the rolled ledgers of a topic
    nobody subscribes to, as the mapping subscription keeps them in production.
    """
    t = TopicName.parse(f"{LOCAL_NS}/{name}")
    if partitions:
        bed.admin_call(cluster, "PUT", t.admin_path("partitions"), json=partitions)
    else:
        bed.admin_call(cluster, "PUT", t.admin_path())
    client_of(bed, cluster).subscribe(
        str(t), "keep", initial_position=pulsar.InitialPosition.Earliest).close()
    return [str(t.with_partition(i)) for i in range(partitions)] if partitions else [str(t)]


def produce(client: Any, topic: str, *, unbatched: int, batches: list[int],
            tag: str = "") -> None:
    """``unbatched`` single-message entries, then one batched entry per size in ``batches``."""
    p = client.create_producer(topic, batching_enabled=False, producer_name=f"single{tag}")
    for i in range(unbatched):
        props = {"i": str(i)}
        if i == 0:
            props[REPL] = "77:5"
        p.send(f"u{i}".encode(), properties=props, partition_key=f"k{i}",
               event_timestamp=1000 + i)
    p.close()
    pb = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                batching_max_publish_delay_ms=60_000, producer_name=f"batch{tag}")
    for size in batches:
        for j in range(size):
            pb.send_async(f"b{size}-{j}".encode(), None, properties={"j": str(j)})
        pb.flush()
    pb.close()


def produce_many(client: Any, topic: str, n: int) -> None:
    """``n`` single-message entries, sent asynchronously."""
    p = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    for i in range(n):
        p.send_async(b"m%d" % i, None)
    p.flush()
    p.close()


def send_chunked(bed: TestBed, cluster: str, topic: str, size: int,
                 properties: dict[str, str]) -> Position:
    """One chunked message of ``size`` bytes; the position of its first chunk.

    Sent from a process of its own (cursorsync_devtools.testbed._chunked): the C++ client keeps
    one max message size per process, set by the last broker it connected to, and this
    process also talks to b, whose limit is larger than a's.
    """
    done = subprocess.run(
        [sys.executable, "-m", "cursorsync_devtools.testbed._chunked", bed.service_url(cluster),
         topic, str(size), "7"],
        input=json.dumps([{"key": "big", "properties": properties, "partition_key": "pk"}]),
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    return Position.parse(json.loads(done.stdout.splitlines()[0])["first_chunk"])


def entries_reader(bed: TestBed, topics: list[str], cluster: str = "a",
                   **extra: str) -> PulsarEntriesStreamReader:
    opts = {"serviceUrl": bed.service_url(cluster), "adminUrl": bed.admin_url(cluster),
            "cluster": cluster, "topics": ",".join(topics), **extra}
    return PulsarEntriesStreamReader(EntriesOptions.parse(opts))


def read_all(r: PulsarEntriesStreamReader, start: dict, end: dict) -> list[tuple]:
    """Rows as tuples in column order, from the Arrow record batches read() hands Spark."""
    rows: list[tuple] = []
    for p in r.partitions(start, end):
        for batch in r.read(p):
            assert isinstance(batch, pa.RecordBatch)
            for row in batch.to_pylist():
                if row.get("properties") is not None:
                    row["properties"] = dict(row["properties"])
                rows.append(tuple(row.values()))
    return rows


def read_range_by_range(r: PulsarEntriesStreamReader) -> list[list[dict[str, Any]]]:
    """The rows of each batch the reader's admission control makes, from the start on."""
    offset = r.initialOffset()
    batches = []
    while (nxt := r.latestOffset(offset, r.getDefaultReadLimit())) != offset:
        batches.append(as_dicts(read_all(r, offset, nxt)))
        offset = nxt
    return batches


COLS = ("cluster", "topic", "partition", "ledger", "entry", "batch_index", "batch_size",
        "producer_name", "publish_time", "event_time", "properties", "partition_key",
        "ordering_key", "source_position", "identity", "entry_identity", "payload_size")


def as_dicts(rows: list[tuple]) -> list[dict[str, Any]]:
    return [dict(zip(COLS, r, strict=True)) for r in rows]


def positions_read(client: Any, topic: str) -> list[Position]:
    """The entries a plain reader delivers, in order (each entry once)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out: list[Position] = []
    try:
        while reader.has_message_available():
            mid = reader.read_next(10_000).message_id()
            pos = Position(mid.ledger_id(), mid.entry_id())
            if not out or out[-1] != pos:
                out.append(pos)
    finally:
        reader.close()
    return out


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


# -- pulsar-entries, driver and executor code called directly ------------------------------


@pytest.fixture(scope="module")
def topics(testbed: TestBed) -> list[str]:
    """Two partitions on a: 3 unbatched entries and batches of 4 and 1; 2 and a batch of 3."""
    names = local_topic(testbed, "a", f"orders-{uuid.uuid4().hex[:8]}", partitions=2)
    client = client_of(testbed, "a")
    produce(client, names[0], unbatched=3, batches=[4, 1], tag="0")
    produce(client, names[1], unbatched=2, batches=[3], tag="1")
    return names


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
    from cursorsync.mapping import wake

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


def test_options_errors_name_the_option() -> None:
    base = {"serviceUrl": "pulsar://127.0.0.1:1", "adminUrl": "http://127.0.0.1:1",
            "cluster": "a", "topics": "t"}
    with pytest.raises(ConfigError, match="cluster"):
        EntriesOptions.parse({k: v for k, v in base.items() if k != "cluster"})
    with pytest.raises(ConfigError, match="serviceUrl"):
        EntriesOptions.parse({**base, "serviceUrl": "http://x"})
    # The admin API sizes ranges across ledgers and answers the tail check: required.
    with pytest.raises(ConfigError, match="adminUrl"):
        EntriesOptions.parse({k: v for k, v in base.items() if k != "adminUrl"})
    with pytest.raises(ConfigError, match="adminUrl"):
        EntriesOptions.parse({**base, "adminUrl": "pulsar://x:1"})
    with pytest.raises(ConfigError, match="maxRowsPerBatch"):
        EntriesOptions.parse({**base, "maxRowsPerBatch": "0"})
    with pytest.raises(ConfigError, match="startingPosition"):
        EntriesOptions.parse({**base, "startingPosition": "middle"})
    with pytest.raises(ConfigError, match="identityFields"):
        EntriesOptions.parse({**base, "identityFields": "payload,colour"})
    with pytest.raises(ConfigError, match="tailCheckMs"):
        EntriesOptions.parse({**base, "tailCheckMs": "0"})
    o = EntriesOptions.parse({**base, "MAXROWSPERBATCH": "5", "identityFields": "payload"})
    assert o.max_rows_per_batch == 5 and o.identity_fields == ("payload",)
    assert o.subscription == "cursorsync-mapping" and o.tail_check_ms == 1000
    assert o.admin is not None and o.admin.urls == ("http://127.0.0.1:1",)
    # The tail check's settings reach every range's reader.
    r = PulsarEntriesStreamReader(EntriesOptions.parse({**base, "tailCheckMs": "500"}))
    lo, hi = {"t": Position(1, 0)}, {"t": Position(1, 9)}
    assert [(p.tail_check_ms, p.admin) for p in r.ranges(lo, hi)] == [(500, o.admin)]
    with pytest.raises(ConfigError, match="version"):
        entries_positions({"version": 2, "positions": {}})


def test_allocate_is_fair_and_bounded() -> None:
    assert allocate({"a": 10, "b": 1, "c": None}, 9) == {"a": 4, "b": 1, "c": 4}
    assert allocate({"a": 2, "b": 2}, 100) == {"a": 2, "b": 2}
    assert allocate({"a": 5, "b": 5, "c": 5}, 2) == {"a": 1, "b": 1, "c": 0}
    assert sum(allocate({"a": None, "b": 0}, 7).values()) == 7


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


# -- ranges across ledgers, markers and chunks on the real brokers ------------------------


@pytest.mark.integration
def test_ranges_across_ledgers_are_sized_from_the_ledger_list(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """a rolls its ledgers every 60 entries. Admission control counts a batch's entries
    across ledgers from the admin ledger list, so its ranges start in an earlier ledger
    than they end; the driver sizes them from that list: the size is what a reader finds
    there, and such a range shares a task like any small one. A driver without the list
    (restarted) gives each a task of its own and reads the same."""
    (big,) = local_topic(testbed, "a", topic_name("big"))
    (small,) = local_topic(testbed, "a", topic_name("small"))
    client = client_of(testbed, "a")
    produce_many(client, big, 130)
    produce(client, small, unbatched=3, batches=[])
    ledgers = testbed.internal_stats("a", big)["ledgers"]
    assert [lg["entries"] for lg in ledgers[:-1]] == [60, 60]  # and the open one, with 10
    r = entries_reader(testbed, [big, small], maxRowsPerBatch="100")
    restarted = entries_reader(testbed, [big, small], maxRowsPerBatch="100")
    try:
        offset = r.initialOffset()
        batches = []
        while (nxt := r.latestOffset(offset, r.getDefaultReadLimit())) != offset:
            tasks = r.partitions(offset, nxt)
            batches.append([[(Position.parse(x.start).ledger != Position.parse(x.end).ledger,
                              x.entry_count(), len({(e[3], e[4]) for e in read_entries(x)}))
                             for x in t.ranges] for t in tasks])
            if len(batches) == 1:
                first = (offset, nxt, read_all(r, offset, nxt))
            offset = nxt
        start, end, rows = first
        assert [len(t.ranges) for t in restarted.partitions(start, end)] == [1, 1]
        assert read_all(restarted, start, end) == rows and len(rows) == 100
    finally:
        r.stop()
        restarted.stop()
    assert batches == [[[(True, 97, 97), (True, 3, 3)]], [[(True, 33, 33)]]]


def test_a_range_across_ledgers_has_the_size_the_driver_counted() -> None:
    r = _range(0, "-1:-1", "7:99")
    assert r.entry_count() is None  # a restarted driver: how many is unknown
    assert dataclasses.replace(r, entries=100).entry_count() == 100
    assert _range(0, "7:9", "7:19").entry_count() == 10  # one ledger: ids are dense
    ledgers = Ledgers.of([(3, 10), (5, 0), (7, 60)])
    first_after = entries_tasks.first_entry_after
    assert first_after(ledgers, BEFORE_ALL) == Position(3, 0)
    assert first_after(ledgers, Position(3, 4)) == Position(3, 5)
    assert first_after(ledgers, Position(3, 9)) == Position(7, 0)  # past an empty ledger
    assert first_after(ledgers, Position(3, 99)) == Position(7, 0)  # past a closed ledger's end
    assert first_after(ledgers, Position(7, 59)) is None
    nth = entries_tasks.nth_entry_after
    assert nth(ledgers, BEFORE_ALL, 1) == Position(3, 0)
    assert nth(ledgers, Position(3, 4), 5) == Position(3, 9)
    assert nth(ledgers, Position(3, 4), 6) == Position(7, 0)  # across an empty ledger
    assert nth(ledgers, Position(3, 4), 65) == Position(7, 59)
    assert nth(ledgers, Position(3, 4), 66) is None


@pytest.mark.integration
def test_markers_on_b_leave_every_range_complete(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """With a replicated subscription on a, snapshot markers are written into b's topic
    between and after the replicated messages; readers never receive them, and b's last
    message id is its last message, not a marker. Read one entry id a batch, every range
    completes (markers only, too) and together they hold every message once; a range of the
    markers after the last message completes by the tail check instead of timing out."""
    (t,) = testbed.create_topic(topic_name())
    sub = send_with_snapshots(client_of(testbed, "a"), t, 4)
    for _ in range(4):
        sub.acknowledge(sub.receive(10_000))
    sub.close()
    testbed.wait_replicated([t])
    messages = positions_read(client_of(testbed, "b"), t)
    assert len(messages) == 4
    r = entries_reader(testbed, [t], cluster="b", maxRowsPerBatch="1", tailCheckMs="200",
                       readTimeoutMs="20000")
    try:
        assert r.latest_position(t) == messages[-1]
        lce = wait_for("markers after the last message on b", lambda: (
            e := testbed.last_entry("b", t)) > messages[-1] and e)
        batches = read_range_by_range(r)
        # The markers after the last message, as a range: nothing to deliver.
        (tail,) = r.ranges({t: messages[-1]}, {t: lce})
        assert list(read_entries(tail)) == []  # a timeout would fail the read
    finally:
        r.stop()
    assert [Position(x["ledger"], x["entry"]) for b in batches for x in b] == messages
    assert sum(1 for b in batches if not b) >= 2  # ranges of markers only
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("b"))) as admin:
        kinds = [admin.raw_entry(t, lce.ledger, e) for e in range(messages[-1].entry + 1,
                                                                   lce.entry + 1)]
    assert kinds and all(k is not None and k.is_marker for k in kinds)


@pytest.fixture(scope="module")
def chunked(testbed: TestBed) -> tuple[str, Position, Position, Position]:
    """A topic on a: a small stamped message, then a chunked one of three chunks (a's
    limit is 256 KiB), the last message of the topic: (topic, small, first and last chunk)."""
    (topic,) = local_topic(testbed, "a", f"chunky-{uuid.uuid4().hex[:8]}")
    p = client_of(testbed, "a").create_producer(topic, batching_enabled=False)
    mid = p.send(b"small", properties={REPL: "7:1"})
    p.close()
    first = send_chunked(testbed, "a", topic, 600_000, {REPL: "7:2"})
    last = testbed.last_entry("a", topic)
    assert last == Position(first.ledger, first.entry + 2)
    return topic, Position(mid.ledger_id(), mid.entry_id()), first, last


@pytest.mark.integration
def test_pin_a_reader_started_after_a_chunked_messages_first_chunk_never_delivers_it(
        testbed: TestBed, chunked: tuple[str, Position, Position, Position]) -> None:
    """Why read_entries has a tail check: the client drops chunks whose first chunk it did
    not receive, so a range that starts inside a chunked message and ends at its last chunk
    hears nothing, while the broker says more is available. From the first chunk itself
    (exclusive) the message still comes: the broker sends the start entry again."""
    topic, _, first, last = chunked
    client = client_of(testbed, "a")
    reader = client.create_reader(topic, pulsar.MessageId(-1, first.ledger, first.entry, -1))
    mid = reader.read_next(10_000).message_id()
    reader.close()
    assert (mid.ledger_id(), mid.entry_id()) == (last.ledger, last.entry)
    assert first_chunk_of(mid) == (first.ledger, first.entry)
    reader = client.create_reader(topic,
                                  pulsar.MessageId(-1, first.ledger, first.entry + 1, -1))
    try:
        with pytest.raises(pulsar.Timeout):
            reader.read_next(2000)
        assert reader.has_message_available()
    finally:
        reader.close()


@pytest.mark.integration
def test_a_chunked_message_is_read_without_evidence(
        testbed: TestBed, chunked: tuple[str, Position, Position, Position]) -> None:
    """The read goes on; the chunked message has no stamp and no digest, so the builder
    never pairs it (never acked on the target)."""
    topic, small, _, last = chunked
    r = entries_reader(testbed, [topic])
    try:
        (part,) = r.ranges({}, {topic: last})
    finally:
        r.stop()
    rows = [r for b in arrow_batches(read_entries(part), COLS) for r in b.to_pylist()]
    assert [(r["entry"], r["source_position"]) for r in rows] == [
        (small.entry, "7:1"), (last.entry, None)]
    assert rows[1]["entry_identity"] is None and rows[1]["identity"] is None
    assert rows[1]["payload_size"] == 600_000


@pytest.mark.integration
def test_ranges_ending_inside_or_after_a_chunked_message_complete_one_id_at_a_time(
        testbed: TestBed, chunked: tuple[str, Position, Position, Position]) -> None:
    """One entry id a batch: the ranges that end at the first and middle chunks end when the
    message arrives past them; the one from the middle chunk to the last hears nothing (its
    first chunks lie before the start) and completes by the tail check, not a timeout."""
    topic, small, _, _ = chunked
    r = entries_reader(testbed, [topic], maxRowsPerBatch="1", tailCheckMs="200",
                       readTimeoutMs="20000")
    try:
        batches = read_range_by_range(r)  # a range that timed out would fail the read
    finally:
        r.stop()
    assert [[(x["entry"], x["source_position"]) for x in b] for b in batches] == [
        [(small.entry, "7:1")], [], [], []]


@pytest.mark.integration
def test_the_tail_check_reads_no_id_past_a_closed_ledgers_end(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """A batch's end may lie past a closed ledger's end (it bounds the same entries). When
    the reader is slow to deliver the next ledger's first entry, the tail check must not
    ask for ids the ledger never had (the broker answers those with a 500): nothing there
    is for a reader to deliver, so the range is complete."""
    (topic,) = local_topic(testbed, "a", topic_name())
    produce_many(client_of(testbed, "a"), topic, 65)
    (first, n), (second, _) = [(lg["ledgerId"], lg["entries"])
                               for lg in testbed.internal_stats("a", topic)["ledgers"]]
    assert n == 60
    delivered = [_Msg(_Id(first, e)) for e in range(60)]  # then silent, as if slow
    part = EntriesPartition(
        cluster="a", topic=topic, start="-1:-1", end=f"{first}:99",
        client=_ScriptedClient(delivered),  # type: ignore[arg-type]
        identity_fields=("payload",), identity=True, per_entry=True,
        source_position_property=REPL, read_timeout_ms=20_000, tail_check_ms=200,
        admin=AdminSettings.from_urls(testbed.admin_url("a"), attempts=1))
    assert [(r[3], r[4]) for r in read_entries(part)] == [(first, e) for e in range(60)]
    # A range whose undelivered ids hold a message is not complete, however long it waits.
    waiting = dataclasses.replace(part, end=f"{second}:0", read_timeout_ms=800,
                                  client=_ScriptedClient(list(delivered)))
    with pytest.raises(EntriesReadError, match="partial range"):
        list(read_entries(waiting))


# -- read_entries against a scripted reader: re-deliveries, columns, the tail check ------


class _Id:
    """A received message id; a batched one serialises with its batch size (field 6)."""

    def __init__(self, ledger: int, entry: int, index: int = -1, size: int = 0) -> None:
        self.l, self.e, self.i, self.n = ledger, entry, index, size

    def ledger_id(self) -> int:
        return self.l

    def entry_id(self) -> int:
        return self.e

    def batch_index(self) -> int:
        return self.i

    def serialize(self) -> bytes:
        return bytes([0x08, *_varint(self.l), 0x10, *_varint(self.e), 0x30, *_varint(self.n)])


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class _Msg:
    def __init__(self, mid: _Id, props: dict[str, str] | None = None) -> None:
        self.mid, self.props = mid, props or {}

    def message_id(self) -> _Id:
        return self.mid

    def properties(self) -> dict[str, str]:
        return self.props

    def partition_key(self) -> str:
        return ""

    def ordering_key(self) -> str:
        return ""

    def data(self) -> bytes:
        return f"{self.mid.e}/{self.mid.i}".encode()

    def event_timestamp(self) -> int:
        return 0

    def producer_name(self) -> str:
        return "p"

    def publish_timestamp(self) -> int:
        return 1


class _ScriptedClient:
    """connect() -> itself; its reader returns ``script`` (None: a poll that times out)
    then times out; ``timeouts`` counts the polls that timed out."""

    def __init__(self, script: list[_Msg | None]) -> None:
        self.script = list(script)
        self.timeouts = 0

    def connect(self) -> _ScriptedClient:
        return self

    def create_reader(self, *_a: Any, **_k: Any) -> _ScriptedClient:
        return self

    def read_next(self, _timeout: int) -> _Msg:
        msg = self.script.pop(0) if self.script else None
        if msg is None:
            self.timeouts += 1
            raise pulsar.Timeout()
        return msg

    def has_message_available(self) -> bool:
        return any(self.script)

    def close(self) -> None:
        pass


def _scripted(script: list[_Msg | None], end: str, **kw: Any) -> Any:
    kw.setdefault("read_timeout_ms", 100)
    return EntriesPartition(cluster="a", topic=f"{LOCAL_NS}/t", start="-1:-1", end=end,
                            client=_ScriptedClient(script),  # type: ignore[arg-type]
                            identity_fields=("payload",), identity=True, per_entry=False,
                            source_position_property=REPL, **kw)


def test_read_entries_yields_each_entry_once_whatever_the_broker_redelivers() -> None:
    b = [_Msg(_Id(1, 2, i, 3)) for i in range(3)]
    script = [
        _Msg(_Id(1, 0)), _Msg(_Id(1, 0)),            # an unbatched entry twice in a row
        _Msg(_Id(1, 1)),
        _Msg(_Id(1, 0)),                             # an earlier entry again, later
        b[0], b[1], b[0], b[2],                      # a batch index again inside its entry
        b[0], b[1], b[2],                            # the whole batch again
        _Msg(_Id(1, 3)), _Msg(_Id(1, 4)),            # past the end: not read
    ]
    rows = list(read_entries(_scripted(script, "1:3")))
    assert [(r[3], r[4], r[5], r[6]) for r in rows] == [
        (1, 0, -1, 1), (1, 1, -1, 1), (1, 2, 0, 3), (1, 2, 1, 3), (1, 2, 2, 3), (1, 3, -1, 1)]
    digests = [message_digest(MessageIdentity(producer_name="p", publish_time=1,
                                              payload=f"2/{i}".encode()), ("payload",))
               for i in range(3)]
    assert {r[15] for r in rows if r[4] == 2} == {entry_digest(digests)}


def test_read_entries_fails_on_an_entry_first_seen_out_of_order() -> None:
    """Dropping it like a re-delivery would leave a hole, which the builder acks as a marker."""
    script = [_Msg(_Id(1, 0)), _Msg(_Id(1, 2)), _Msg(_Id(1, 1)), _Msg(_Id(1, 3))]
    with pytest.raises(EntriesReadError, match="entry 1:1 arrived after 1:2, out of order"):
        list(read_entries(_scripted(script, "1:3")))


def test_read_columns_select_the_schema_and_the_arrow_batches() -> None:
    script = [_Msg(_Id(1, e), {REPL: f"9:{e}"} if e % 2 else {}) for e in range(5)]
    part = _scripted(script, "1:4", columns=EVIDENCE_COLUMNS)
    batches = list(arrow_batches(read_entries(part), part.columns, size=2))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert batches[0].schema.names == list(EVIDENCE_COLUMNS)
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["source_position"] for r in rows] == [None, "9:1", None, "9:3", None]
    # Stamped entries carry no digest: identity evidence is for the others only.
    assert [r["entry_identity"] is None for r in rows] == [False, True, False, True, False]
    # Producer and publish time come with the digest (identity alignment orders by them).
    assert [r["producer_name"] is None for r in rows] == [False, True, False, True, False]
    assert [r["publish_time"] is None for r in rows] == [False, True, False, True, False]
    ds = PulsarEntriesDataSource({"columns": "evidence"})
    assert ds.schema() == schema_of(EVIDENCE_COLUMNS)
    assert PulsarEntriesDataSource({}).schema().fieldNames()[-1] == "payload_size"
    with pytest.raises(ConfigError, match="columns: nope is not a column"):
        PulsarEntriesDataSource({"columns": "ledger,nope"}).schema()


def test_layout_arrow_packs_record_batches_into_rows_and_unpacks_to_the_same_rows() -> None:
    script = [_Msg(_Id(1, e), {REPL: f"9:{e}"} if e % 2 else {}) for e in range(5)]
    plain = pa.Table.from_batches(list(arrow_batches(
        read_entries(_scripted(list(script), "1:4", columns=EVIDENCE_COLUMNS)),
        EVIDENCE_COLUMNS, size=2)))
    packed = pa.Table.from_batches(list(pack_batches(arrow_batches(
        read_entries(_scripted(list(script), "1:4", columns=EVIDENCE_COLUMNS)),
        EVIDENCE_COLUMNS, size=2), "a")))
    # One Spark row per record batch: what crosses the JVM is three rows, not five.
    assert packed.num_rows == 3
    assert packed.column("rows").to_pylist() == [2, 2, 1]
    assert set(packed.column("cluster").to_pylist()) == {"a"}
    assert unpack_batches(packed, EVIDENCE_COLUMNS).equals(plain)
    assert unpack_batches(packed.slice(0, 0), EVIDENCE_COLUMNS).num_rows == 0
    assert PulsarEntriesDataSource({"layout": "arrow"}).schema() == PACKED_SCHEMA
    with pytest.raises(ConfigError, match="option layout: 'packed' is not valid"):
        PulsarEntriesDataSource({"layout": "packed"}).schema()
    # A driver expecting other columns (another cursorsync version) says so.
    with pytest.raises(EntriesReadError, match="executors on another cursorsync version"):
        unpack_batches(packed, ("cluster", "ledger"))


def test_identity_scope_batched_digests_batches_only_and_the_source_side_drops_the_rest(
) -> None:
    def script() -> list[_Msg]:
        return [_Msg(_Id(1, 0), {REPL: "9:0"}), _Msg(_Id(1, 1)),
                _Msg(_Id(1, 2, 0, 2)), _Msg(_Id(1, 2, 1, 2)), _Msg(_Id(1, 3), {REPL: "9:3"})]

    target = list(read_entries(_scripted(script(), "1:3", identity_batched_only=True)))
    # Target side: every entry has a row (holes and foreign runs need them all); only the
    # batch has a digest, and the unstamped unbatched 1:1 none (it is foreign then).
    assert [(r[4], r[15] is not None) for r in target] == [
        (0, False), (1, False), (2, True), (2, True), (3, False)]
    source = list(read_entries(_scripted(script(), "1:3", identity_batched_only=True,
                                         identity_rows_only=True)))
    # Source side: rows only where identity evidence can use them, stamped or not.
    assert [(r[4], r[5]) for r in source] == [(2, 0), (2, 1)]
    assert {r[15] for r in source} == {target[2][15]}
    every = list(read_entries(_scripted(script(), "1:3", identity_rows_only=True)))
    assert [r[4] for r in every] == [0, 1, 2, 2, 3] and all(r[15] for r in every)


def test_worker_keeps_a_bounded_number_of_clients_least_recently_used_out() -> None:
    class Settings:
        def __init__(self, n: int) -> None:
            self.n, self.closed = n, False

        def connect(self) -> Settings:
            return self

        def close(self) -> None:
            self.closed = True

    saved = dict(entries_read._CLIENTS)
    entries_read._CLIENTS.clear()
    try:
        made = [Settings(i) for i in range(entries_read.CLIENTS_KEPT + 2)]
        for s in made[:entries_read.CLIENTS_KEPT]:
            assert entries_read._client(s) is s  # type: ignore[arg-type]
        entries_read._client(made[0])  # type: ignore[arg-type] - used again: now the newest
        entries_read._client(made[-2])  # type: ignore[arg-type]
        entries_read._client(made[-1])  # type: ignore[arg-type]
        assert [s.closed for s in made[:3]] == [False, True, True]
        assert len(entries_read._CLIENTS) == entries_read.CLIENTS_KEPT
    finally:
        entries_read._CLIENTS.clear()
        entries_read._CLIENTS.update(saved)


def test_the_tail_check_comes_after_each_silence_of_tail_check_ms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader silent short of its end asks the admin API what is left, tailCheckMs into
    each silence: a slow start, with checks of its own, does not delay the check at the
    end. Polls are counted, not timed: a scripted poll that times out returns at once."""
    checks: list[tuple[int, int]] = []

    def nothing_to_deliver(_part: Any, after: tuple[int, int], _end: Any) -> bool:
        checks.append(after)
        return after == (1, 1)  # what is left after 1:1 is markers only

    monkeypatch.setattr(entries_read, "_nothing_to_deliver", nothing_to_deliver)
    part = _scripted([None] * 5 + [_Msg(_Id(1, 0)), _Msg(_Id(1, 1))], "1:3",
                     read_timeout_ms=10_000, tail_check_ms=200)
    client = part.client
    assert [(r[3], r[4]) for r in read_entries(part)] == [(1, 0), (1, 1)]
    assert checks == [(-1, -1), (-1, -1), (1, 1)]
    assert client.timeouts == 5 + 2  # the last check two polls (200 ms) after 1:1


def test_the_tail_check_waits_while_a_batch_is_incomplete(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a batch of known size the rest of it is due: no lookup, the read times out."""
    monkeypatch.setattr(entries_read, "_nothing_to_deliver", lambda *_: pytest.fail("looked up"))
    part = _scripted([_Msg(_Id(1, 0, 0, 3)), _Msg(_Id(1, 0, 1, 3))], "1:1",
                     read_timeout_ms=500, tail_check_ms=100)
    with pytest.raises(EntriesReadError, match="partial range"):
        list(read_entries(part))


def test_a_worker_freezes_its_heap_at_its_first_two_tasks_only() -> None:
    """The first task loads modules of its own (pyspark imports pandas while it serializes
    the first batch), so the heap is frozen again at the second; never after, or each
    task's garbage cycles would be kept for ever. In a fresh process: the freeze is global."""
    code = (
        "import gc\n"
        "from cursorsync.mapping.entries_read import freeze_worker_heap\n"
        "counts, kept = [], []\n"
        "for i in range(4):\n"
        "    kept.append([[j] for j in range(1000)])  # what a task loads and keeps\n"
        "    freeze_worker_heap()\n"
        "    counts.append(gc.get_freeze_count())\n"
        "print(counts[0] > 0, counts[1] > counts[0] + 900, counts[2] == counts[1] == counts[3])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "True"]


# -- ranges packed into tasks ---------------------------------------------------------


def _range(topic: int, start: str, end: str) -> Any:
    return EntriesPartition(cluster="a", topic=f"{LOCAL_NS}/t-partition-{topic}", start=start,
                            end=end, client=None,  # type: ignore[arg-type]
                            identity_fields=("payload",), identity=True, per_entry=True,
                            source_position_property=REPL, read_timeout_ms=100)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.one_of(st.none(), st.integers(1, 300)), max_size=40),
       per_task=st.integers(1, 400), ranges_per_task=st.integers(1, 8))
def test_ranges_are_packed_in_order_whole_and_within_the_bounds(
        sizes: list[int | None], per_task: int, ranges_per_task: int) -> None:
    # None: a range across ledgers the driver has no count for (restarted); odd ones span
    # ledgers with the driver's count.
    ranges = [_range(i, "1:9", "2:3") if n is None
              else dataclasses.replace(_range(i, "1:9", "2:3"), entries=n) if i % 2
              else _range(i, "1:9", f"1:{9 + n}") for i, n in enumerate(sizes)]
    tasks = pack_ranges(ranges, per_task, ranges_per_task)
    assert [r for t in tasks for r in t.ranges] == ranges  # every range once, in order
    for t in tasks:
        assert t.ranges
        if len(t.ranges) > 1:
            counts = [r.entry_count() for r in t.ranges]
            assert None not in counts and len(counts) <= ranges_per_task
            assert sum(counts) <= per_task  # type: ignore[arg-type]
    # Greedy: two neighbouring tasks could not have been one.
    for a, b in itertools.pairwise(tasks):
        counts = [r.entry_count() for r in a.ranges + b.ranges]
        assert (None in counts or sum(counts) > per_task  # type: ignore[arg-type]
                or len(counts) > ranges_per_task
                or any(c >= per_task for c in counts))  # type: ignore[operator]


# -- pulsar-cursors ---------------------------------------------------------------------


@pytest.fixture
def admin() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


def cursors_reader(admin: StubAdmin, state: Path, **extra: str) -> PulsarCursorsStreamReader:
    opts = {"adminUrl": admin.url, "cluster": "a", "topics": "persistent://acme/orders/events",
            "subscriptions": "svc", "stateDir": str(state), "adminAttempts": "1",
            # The stub serves internalStats only; the topic stats pre-check is tested on
            # the real test bed (test_cursor_polls).
            "internalStatsMaxAgeMs": "0", **extra}
    return PulsarCursorsStreamReader(CursorsOptions.parse(opts))


def serve_partitioned(admin: StubAdmin, md: str) -> None:
    admin.set(BASE + "/partitions", Reply(body={"partitions": 2}))
    admin.set(BASE + "/partitioned-internalStats", Reply(body={
        "metadata": {"partitions": 2},
        "partitions": {f"persistent://acme/orders/events-partition-{i}": stats_doc(
            "3:9", [(1, 5), (3, 0)], {"svc": (md, "[(3:2..3:5], (3:6..3:7]]"),
                                      "other": ("1:0", "[]"),
                                      "pulsar.repl.b": ("3:9", "[]")}, counter=40 + i)
            for i in range(2)}}))


def test_cursors_poll_store_and_replay(admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path)
    start = r.initialOffset()
    assert start == {"version": 1, "seq": 0}
    it, end = r.read(start)
    rows = list(it)
    assert end == {"version": 1, "seq": 1}
    events = "persistent://acme/orders/events"
    assert [(x[1], x[2], x[3]) for x in rows] == [(events, 0, "svc"), (events, 1, "svc")]
    row = rows[0]
    assert row[4] == "1:4" and row[5] == "[(3:2..3:5],(3:6..3:7]]"
    assert row[6] == [(1, 5), (3, 10)]  # the open ledger's count from lastConfirmedEntry
    assert row[8] == 40 and row[7].tzinfo is not None
    assert row[9] == row[7]  # read in this poll: checked when read
    # The cluster moves on; a replay of (0, 1] still returns what was polled then.
    serve_partitioned(admin, "3:9")
    assert list(r.readBetweenOffsets(start, end)) == rows
    fresh = cursors_reader(admin, tmp_path)  # a restarted driver
    assert list(fresh.readBetweenOffsets(start, end)) == rows
    it2, end2 = fresh.read(end)
    assert [x[4] for x in it2] == ["3:9", "3:9"] and end2["seq"] == 2
    assert len(list(fresh.readBetweenOffsets(start, end2))) == 4
    fresh.commit(end2)  # retention 100 keeps both
    assert len(list(fresh.readBetweenOffsets(start, end2))) == 4
    # A poll stored before rows had a checked_at replays as checked when read.
    stored = json.loads(fresh.store.path(1).read_text())
    for r in stored["rows"]:
        del r["checked_at_us"]
    fresh.store.path(1).write_text(json.dumps(stored))
    assert list(fresh.readBetweenOffsets(start, end)) == rows


def test_cursors_missing_state_and_pruning(admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path, stateRetention="1", subscriptions="*")
    off = r.initialOffset()
    for _ in range(3):
        it, off = r.read(off)
        assert {x[3] for x in it} == {"svc", "other"}  # never the replicator cursor
    r.commit(off)
    with pytest.raises(ReplayStateError, match="poll-0000"):
        list(r.readBetweenOffsets({"version": 1, "seq": 0}, off))
    assert len(list(r.readBetweenOffsets({"version": 1, "seq": 2}, off))) == 4


def test_cursors_poll_interval_and_options(admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path, pollIntervalMs="60000")
    _, off = r.read(r.initialOffset())
    it, same = r.read(off)
    assert same == off and list(it) == []
    with pytest.raises(ConfigError, match="stateDir"):
        CursorsOptions.parse({"adminUrl": admin.url, "cluster": "a", "topics": "x",
                              "subscriptions": "s"})
    with pytest.raises(ConfigError, match="subscriptions"):
        CursorsOptions.parse({"adminUrl": admin.url, "cluster": "a", "topics": "x",
                              "stateDir": str(tmp_path)})


# -- in Spark ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[1]").appName("cursorsync-test-sources")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.host", "127.0.0.1")
         .getOrCreate())
    register(s)
    yield s
    s.stop()


@pytest.mark.spark
@pytest.mark.integration
def test_in_spark_the_poll_keeps_what_it_read_across_batches(
        spark: Any, testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """The stream's reader lives across micro-batches: with nothing changing, every batch
    asks the topic stats and only the first reads internalStats."""
    topic = testbed.topic(topic_name("spark-polled"))
    testbed.create_topic(topic, partitions=3)
    testbed.client("a").subscribe(topic, "polled", consumer_type=pulsar.ConsumerType.Shared).close()
    paths: list[str] = []

    def record(n: int, path: str) -> Fault:
        paths.append(path)
        return "pass"

    with AdminProxy(testbed.admin_url("a"), record) as proxy:
        q = (spark.readStream.format("pulsar-cursors")
             .option("adminUrl", proxy.url).option("cluster", "a").option("topics", topic)
             .option("subscriptions", "polled").option("stateDir", str(tmp_path / "polls"))
             .option("internalStatsMaxAgeMs", "600000")
             .load().writeStream.format("memory").queryName("polled")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="500 milliseconds").start())
        try:
            wait_for("four polls", lambda: sum(
                1 for p in q.recentProgress if p["numInputRows"]) >= 4, 120)
        finally:
            q.stop()
    polls = sum(1 for p in paths if "/partitioned-stats" in p)
    reads = [p for p in paths if "internalStats" in p]
    assert polls >= 4
    assert len(reads) == 1 and "/partitioned-internalStats" in reads[0], reads
    assert spark.table("polled").count() >= 4 * 3


def entries_stream(spark: Any, bed: TestBed, topics: list[str], subscription: str) -> Any:
    return (spark.readStream.format("pulsar-entries")
            .option("serviceUrl", bed.service_url("a")).option("adminUrl", bed.admin_url("a"))
            .option("cluster", "a").option("topics", ",".join(topics))
            .option("maxRowsPerBatch", "4").option("subscription", subscription))


@pytest.mark.spark
@pytest.mark.integration
def test_spark_entries_stream(spark: Any, testbed: TestBed, topics: list[str],
                              tmp_path: Path) -> None:
    q = (entries_stream(spark, testbed, topics, "spark-test")
         .load().writeStream.format("memory").queryName("entries_out")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.processAllAvailable()
        batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    df = spark.table("entries_out")
    assert df.count() == 13
    assert len(batches) >= 2  # admission control split the backlog
    row = df.where("partition = 0 and entry = 3 and batch_index = 2").collect()[0]
    assert row.batch_size == 4 and len(row.identity) == 16
    assert dict(df.where("source_position is not null").select("properties").first()[0])[
        REPL] == "77:5"


@pytest.mark.spark
@pytest.mark.integration
def test_spark_entries_stream_in_arrow_layout_holds_the_same_rows(
        spark: Any, testbed: TestBed, topics: list[str], tmp_path: Path) -> None:
    def run(name: str, layout: str) -> pa.Table:
        q = (entries_stream(spark, testbed, topics, f"spark-{name}")
             .option("rowsPer", "entry").option("columns", "evidence").option("layout", layout)
             .load().writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / name)).start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
        return spark.table(name).toArrow()

    rows = run("evidence_rows", "rows")
    packed = run("evidence_packed", "arrow")
    got = unpack_batches(packed, EVIDENCE_COLUMNS)
    key = [("partition", "ascending"), ("ledger", "ascending"), ("entry", "ascending")]
    assert got.num_rows == rows.num_rows > packed.num_rows
    assert got.sort_by(key).to_pylist() == rows.sort_by(key).to_pylist()


@pytest.mark.spark
def test_spark_cursors_stream(spark: Any, admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    q = (spark.readStream.format("pulsar-cursors")
         .option("adminUrl", admin.url).option("cluster", "a")
         .option("topics", "persistent://acme/orders/events").option("subscriptions", "svc")
         .option("stateDir", str(tmp_path / "polls")).option("internalStatsMaxAgeMs", "0")
         .load().writeStream.format("memory").queryName("cursors_out")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(once=True).start())
    q.awaitTermination(120)
    rows = spark.table("cursors_out").orderBy("partition").collect()
    assert [(r.partition, r.subscription, r.mark_delete) for r in rows] == [
        (0, "svc", "1:4"), (1, "svc", "1:4")]
    assert [(x.ledger_id, x.entries) for x in rows[0].ledgers] == [(1, 5), (3, 10)]
    assert rows[0].observed_at is not None and rows[0].messages_consumed_counter == 40
    assert any((tmp_path / "polls").iterdir())
