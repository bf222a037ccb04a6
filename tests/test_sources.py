"""The Spark data sources: pulsar-entries against one pulsar-lite broker, pulsar-cursors
against the stub admin server. Also pins the pulsar-lite / pulsar-client behaviour they rely on.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pulsar_lite")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from cursorsync.errors import ConfigError  # noqa: E402
from cursorsync.identity import MessageIdentity, entry_digest, message_digest  # noqa: E402
from cursorsync.positions import Position  # noqa: E402
from cursorsync.pulsar.client import connect  # noqa: E402
from cursorsync.sandbox.brokers import start_broker  # noqa: E402
from cursorsync.sources import register  # noqa: E402
from cursorsync.sources.cursors import (  # noqa: E402
    CursorsOptions,
    PulsarCursorsStreamReader,
    ReplayStateError,
)
from cursorsync.sources.entries import (  # noqa: E402
    BEFORE_ALL,
    EntriesOptions,
    PulsarEntriesStreamReader,
    allocate,
    batch_size_of,
    make_offset,
    parse_offset,
)
from test_admin import BASE, Reply, StubAdmin, stats_doc  # noqa: E402

NS = "persistent://public/default"
REPL = "__MSG_PROP_REPL_SOURCE_POSITION"


# -- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One pulsar-lite broker (the sandbox's: default_partitions = 0, metrics off)."""
    with start_broker("a", tmp_path_factory.mktemp("pulsar-lite")) as b:
        yield b.service_url


@pytest.fixture(scope="module")
def client(broker: str) -> Iterator[Any]:
    c = connect(broker, operation_timeout_seconds=10)
    yield c
    c.close()


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


def entries_reader(broker: str, topics: list[str], **extra: str) -> PulsarEntriesStreamReader:
    opts = {"serviceUrl": broker, "cluster": "a", "topics": ",".join(topics), **extra}
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


COLS = ("cluster", "topic", "partition", "ledger", "entry", "batch_index", "batch_size",
        "producer_name", "publish_time", "event_time", "properties", "partition_key",
        "ordering_key", "source_position", "identity", "entry_identity", "payload_size")


def as_dicts(rows: list[tuple]) -> list[dict[str, Any]]:
    return [dict(zip(COLS, r, strict=True)) for r in rows]


# -- pins: what pulsar-lite and the Python client do -------------------------------------


@pytest.mark.integration
def test_pin_last_message_id_reader_start_and_cumulative_ack(client: Any) -> None:
    topic = f"{NS}/pin-partition-2"
    cons = client.subscribe(topic, "pin", consumer_type=pulsar.ConsumerType.Failover,
                            receiver_queue_size=0,
                            initial_position=pulsar.InitialPosition.Earliest)
    # pulsar-lite: get_last_message_id on an empty topic is an error, not -1:-1.
    with pytest.raises(pulsar.PulsarException):
        cons.get_last_message_id()
    probe = client.create_reader(topic, pulsar.MessageId.earliest)
    with pytest.raises(pulsar.PulsarException):  # so does has_message_available
        probe.has_message_available()
    probe.close()
    produce(client, topic, unbatched=2, batches=[3])
    last = cons.get_last_message_id()
    assert (last.entry_id(), last.batch_index()) == (2, -1)  # the entry; no batch index
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    ids = [reader.read_next(5000).message_id() for _ in range(5)]
    reader.close()
    assert [(m.entry_id(), m.batch_index(), m.partition()) for m in ids] == [
        (0, -1, 2), (1, -1, 2), (2, 0, 2), (2, 1, 2), (2, 2, 2)]
    # No batch-size accessor, but a batched id serialises with MessageIdData.batch_size.
    assert [batch_size_of(m) for m in ids] == [1, 1, 3, 3, 3]
    # pulsar-lite's last message id has no batch index, so has_message_available after the
    # first message of the last (batched) entry may answer False: read() never asks it there.
    ledger = ids[0].ledger_id()
    # A reader started at L:E:-1 EXCLUSIVE re-delivers the batched entry L:E.
    reader = client.create_reader(topic, pulsar.MessageId(2, ledger, 2, -1))
    again = [reader.read_next(5000).message_id() for _ in range(3)]
    reader.close()
    assert [(m.entry_id(), m.batch_index()) for m in again] == [(2, 0), (2, 1), (2, 2)]
    # A cumulative ack of a never-dispatched entry from the zero-queue consumer applies.
    cons.acknowledge_cumulative(pulsar.MessageId(2, ledger, 1, -1))
    cons.close()
    again_cons = client.subscribe(topic, "pin", consumer_type=pulsar.ConsumerType.Failover)
    first = again_cons.receive(5000).message_id()
    again_cons.close()
    assert (first.entry_id(), first.batch_index()) == (2, 0)


# -- pulsar-entries, driver and executor code called directly ------------------------------


@pytest.fixture(scope="module")
def topics(client: Any) -> list[str]:
    names = [f"{NS}/orders-partition-{i}" for i in range(2)]
    produce(client, names[0], unbatched=3, batches=[4, 1], tag="0")
    produce(client, names[1], unbatched=2, batches=[3], tag="1")
    return names


@pytest.mark.integration
def test_entries_rows_batches_and_identity(broker: str, topics: list[str]) -> None:
    r = entries_reader(broker, topics)
    try:
        start = r.initialOffset()
        assert start == make_offset({t: BEFORE_ALL for t in topics})
        end = r.latestOffset(start, ReadAllAvailable())
        assert list(end) == ["version", "positions"] and end["version"] == 1
        assert parse_offset(end)[topics[0]].entry == 4
        rows = as_dicts(read_all(r, start, end))
    finally:
        r.stop()
    p0 = [x for x in rows if x["partition"] == 0]
    p1 = [x for x in rows if x["partition"] == 1]
    assert len(p0) == 3 + 4 + 1 and len(p1) == 2 + 3
    assert {x["topic"] for x in rows} == {f"{NS}/orders"}
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
def test_entries_replay_is_deterministic(broker: str, topics: list[str]) -> None:
    r = entries_reader(broker, topics)
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
        broker: str, topics: list[str]) -> None:
    r = entries_reader(broker, topics, maxRowsPerBatch="3")
    try:
        assert r.getDefaultReadLimit() == ReadMaxRows(3)
        offset = r.initialOffset()
        batches: list[list[dict[str, Any]]] = []
        for _ in range(10):
            nxt = r.latestOffset(offset, r.getDefaultReadLimit())
            if nxt == offset:
                break
            batches.append(as_dicts(read_all(r, offset, nxt)))
            offset = nxt
        everything = as_dicts(read_all(r, r.initialOffset(), offset))
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
        broker: str, client: Any, topics: list[str]) -> None:
    r = entries_reader(broker, [topics[0]], subscription="commit-test")
    try:
        start = r.initialOffset()
        led = parse_offset(r.latestOffset(start, ReadAllAvailable()))[topics[0]].ledger
        mid = make_offset({topics[0]: Position(led, 2)})
        end = r.latestOffset(mid, ReadAllAvailable())
        rows = as_dicts(read_all(r, mid, end))
        assert [x["entry"] for x in rows] == [3, 3, 3, 3, 4]
        mid3 = make_offset({topics[0]: Position(led, 3)})
        assert [x["entry"] for x in as_dicts(read_all(r, mid3, end))] == [4]
        assert r.partitions(end, end) == []
        r.commit(mid)
    finally:
        r.stop()
    cons = client.subscribe(topics[0], "commit-test", consumer_type=pulsar.ConsumerType.Failover)
    first = cons.receive(5000).message_id()
    cons.close()
    assert first.entry_id() == 3


@pytest.mark.integration
def test_topics_discovered_through_admin(broker: str, topics: list[str]) -> None:
    stub = StubAdmin().start()
    try:
        stub.set("/admin/v2/persistent/public/default/orders/partitions",
                 Reply(body={"partitions": 2}))
        r = entries_reader(broker, [f"{NS}/orders"], adminUrl=stub.url)
        assert r.topics() == topics  # a partitioned name expands to its partitions
        r.stop()
        stub.set("/admin/v2/persistent/public/default", Reply(body=[*topics, f"{NS}/other"]))
        stub.set("/admin/v2/persistent/public/default/partitioned", Reply(body=[]))
        r = entries_reader(broker, [], namespace="public/default", topicPattern="ord.*",
                           adminUrl=stub.url)
        try:
            assert r.topics() == topics
            end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
            assert len(read_all(r, r.initialOffset(), end)) == 13
        finally:
            r.stop()
    finally:
        stub.stop()


@pytest.mark.integration
def test_available_now_stops_at_the_target(broker: str, client: Any) -> None:
    topic = f"{NS}/avail-partition-0"
    produce(client, topic, unbatched=2, batches=[])
    r = entries_reader(broker, [topic])
    try:
        r.prepareForTriggerAvailableNow()
        produce(client, topic, unbatched=1, batches=[], tag="late")
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        assert parse_offset(end)[topic].entry == 1  # the late entry 2 is not in this run
        assert r.latestOffset(end, ReadAllAvailable()) == end
    finally:
        r.stop()


@pytest.mark.integration
def test_latest_on_empty_topic_and_starting_latest(broker: str, client: Any) -> None:
    topic = f"{NS}/empty-partition-0"
    r = entries_reader(broker, [topic], startingPosition="latest")
    try:
        assert r.latest_position(topic) == BEFORE_ALL
        start = r.initialOffset()
        assert parse_offset(start) == {topic: BEFORE_ALL}
        produce(client, topic, unbatched=1, batches=[])
        end = r.latestOffset(start, ReadAllAvailable())
        assert len(read_all(r, start, end)) == 1
    finally:
        r.stop()


def test_options_errors_name_the_option() -> None:
    base = {"serviceUrl": "pulsar://127.0.0.1:1", "cluster": "a", "topics": "t"}
    with pytest.raises(ConfigError, match="cluster"):
        EntriesOptions.parse({"serviceUrl": "pulsar://x:1", "topics": "t"})
    with pytest.raises(ConfigError, match="serviceUrl"):
        EntriesOptions.parse({**base, "serviceUrl": "http://x"})
    with pytest.raises(ConfigError, match="maxRowsPerBatch"):
        EntriesOptions.parse({**base, "maxRowsPerBatch": "0"})
    with pytest.raises(ConfigError, match="startingPosition"):
        EntriesOptions.parse({**base, "startingPosition": "middle"})
    with pytest.raises(ConfigError, match="identityFields"):
        EntriesOptions.parse({**base, "identityFields": "payload,colour"})
    with pytest.raises(ConfigError, match="adminUrl"):
        EntriesOptions.parse({**base, "namespace": "public/default"})
    with pytest.raises(ConfigError, match="readerStallMs"):
        EntriesOptions.parse({**base, "readerStallMs": "0"})
    o = EntriesOptions.parse({**base, "MAXROWSPERBATCH": "5", "identityFields": "payload"})
    assert o.max_rows_per_batch == 5 and o.identity_fields == ("payload",)
    assert o.subscription == "cursorsync-mapping" and o.reader_stall_ms == 2000
    # The stall threshold reaches every range's reader.
    r = PulsarEntriesStreamReader(EntriesOptions.parse({**base, "readerStallMs": "500"}))
    lo, hi = {"t": Position(1, 0)}, {"t": Position(1, 9)}
    assert [p.reader_stall_ms for p in r.ranges(lo, hi)] == [500]
    with pytest.raises(ConfigError, match="version"):
        parse_offset({"version": 2, "positions": {}})


def test_allocate_is_fair_and_bounded() -> None:
    assert allocate({"a": 10, "b": 1, "c": None}, 9) == {"a": 4, "b": 1, "c": 4}
    assert allocate({"a": 2, "b": 2}, 100) == {"a": 2, "b": 2}
    assert allocate({"a": 5, "b": 5, "c": 5}, 2) == {"a": 1, "b": 1, "c": 0}
    assert sum(allocate({"a": None, "b": 0}, 7).values()) == 7


# -- pulsar-cursors ---------------------------------------------------------------------


@pytest.fixture
def admin() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


def cursors_reader(admin: StubAdmin, state: Path, **extra: str) -> PulsarCursorsStreamReader:
    opts = {"adminUrl": admin.url, "cluster": "a", "topics": "persistent://acme/orders/events",
            "subscriptions": "svc", "stateDir": str(state), "adminAttempts": "1", **extra}
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
def test_spark_entries_stream(spark: Any, broker: str, topics: list[str],
                              tmp_path: Path) -> None:
    q = (spark.readStream.format("pulsar-entries")
         .option("serviceUrl", broker).option("cluster", "a")
         .option("topics", ",".join(topics)).option("maxRowsPerBatch", "4")
         .option("subscription", "spark-test")
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
        spark: Any, broker: str, topics: list[str], tmp_path: Path) -> None:
    from cursorsync.sources.entries import EVIDENCE_COLUMNS, unpack

    def run(name: str, layout: str) -> pa.Table:
        q = (spark.readStream.format("pulsar-entries")
             .option("serviceUrl", broker).option("cluster", "a")
             .option("topics", ",".join(topics)).option("maxRowsPerBatch", "4")
             .option("subscription", f"spark-{name}").option("rowsPer", "entry")
             .option("columns", "evidence").option("layout", layout)
             .load().writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / name)).start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
        return spark.table(name).toArrow()

    rows = run("evidence_rows", "rows")
    packed = run("evidence_packed", "arrow")
    got = unpack(packed, EVIDENCE_COLUMNS)
    key = [("partition", "ascending"), ("ledger", "ascending"), ("entry", "ascending")]
    assert got.num_rows == rows.num_rows > packed.num_rows
    assert got.sort_by(key).to_pylist() == rows.sort_by(key).to_pylist()


@pytest.mark.spark
def test_spark_cursors_stream(spark: Any, admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    q = (spark.readStream.format("pulsar-cursors")
         .option("adminUrl", admin.url).option("cluster", "a")
         .option("topics", "persistent://acme/orders/events").option("subscriptions", "svc")
         .option("stateDir", str(tmp_path / "polls"))
         .load().writeStream.format("memory").queryName("cursors_out")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(once=True).start())
    q.awaitTermination(120)
    rows = spark.table("cursors_out").orderBy("partition").collect()
    assert [(r.partition, r.subscription, r.mark_delete) for r in rows] == [
        (0, "svc", "1:4"), (1, "svc", "1:4")]
    assert [(x.ledger_id, x.entries) for x in rows[0].ledgers] == [(1, 5), (3, 10)]
    assert rows[0].observed_at is not None and rows[0].messages_consumed_counter == 40
    assert any((tmp_path / "polls").iterdir())


@pytest.mark.integration
def test_entries_without_identity_evidence_spend_no_digest(broker: str, topics: list[str]) -> None:
    r = entries_reader(broker, topics, identity="false")
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
        broker: str, topics: list[str]) -> None:
    """Entries skipped silently would look like marker holes to the builder, and be acked."""
    import dataclasses

    from cursorsync.sources.entries import EntriesReadError, read_entries

    r = entries_reader(broker, topics)
    try:
        start = r.initialOffset()
        parts = r.partitions(start, r.latestOffset(start, ReadAllAvailable()))
    finally:
        r.stop()
    first = parts[0].ranges[0]
    last = Position.parse(first.end)
    beyond = dataclasses.replace(first, end=str(Position(last.ledger, last.entry + 3)),
                                 read_timeout_ms=300)
    with pytest.raises(EntriesReadError, match="partial range"):
        list(read_entries(beyond))


@pytest.mark.integration
def test_entries_one_row_per_entry(broker: str, topics: list[str]) -> None:
    per_message = entries_reader(broker, topics)
    per_entry = entries_reader(broker, topics, rowsPer="entry")
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


# -- read_entries against a scripted reader: re-deliveries, columns ------------------------


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
        return bytes([0x08, self.l, 0x10, self.e, 0x30, self.n])


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
    """connect() -> itself; its reader returns ``script`` then times out."""

    def __init__(self, script: list[_Msg]) -> None:
        self.script = list(script)

    def connect(self) -> _ScriptedClient:
        return self

    def create_reader(self, *_a: Any, **_k: Any) -> _ScriptedClient:
        return self

    def read_next(self, _timeout: int) -> _Msg:
        if not self.script:
            raise pulsar.Timeout()
        return self.script.pop(0)

    def has_message_available(self) -> bool:
        return bool(self.script)

    def close(self) -> None:
        pass


def _scripted(script: list[_Msg], end: str, **kw: Any) -> Any:
    from cursorsync.sources.entries import EntriesPartition

    return EntriesPartition(cluster="a", topic=f"{NS}/t", start="-1:-1", end=end,
                            client=_ScriptedClient(script),  # type: ignore[arg-type]
                            identity_fields=("payload",), identity=True, per_entry=False,
                            source_position_property=REPL, read_timeout_ms=100, **kw)


def test_read_entries_yields_each_entry_once_whatever_the_broker_redelivers() -> None:
    from cursorsync.sources.entries import read_entries

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
    from cursorsync.sources.entries import EntriesReadError, read_entries

    script = [_Msg(_Id(1, 0)), _Msg(_Id(1, 2)), _Msg(_Id(1, 1)), _Msg(_Id(1, 3))]
    with pytest.raises(EntriesReadError, match="entry 1:1 arrived after 1:2, out of order"):
        list(read_entries(_scripted(script, "1:3")))


def test_read_columns_select_the_schema_and_the_arrow_batches() -> None:
    from cursorsync.sources.entries import (
        EVIDENCE_COLUMNS,
        PulsarEntriesDataSource,
        arrow_batches,
        read_entries,
        schema_of,
    )

    script = [_Msg(_Id(1, e), {REPL: f"9:{e}"} if e % 2 else {}) for e in range(5)]
    part = _scripted(script, "1:4", columns=EVIDENCE_COLUMNS)
    batches = list(arrow_batches(read_entries(part), part.columns, size=2))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert batches[0].schema.names == list(EVIDENCE_COLUMNS)
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["source_position"] for r in rows] == [None, "9:1", None, "9:3", None]
    # Stamped entries carry no digest: identity evidence is for the others only.
    assert [r["entry_identity"] is None for r in rows] == [False, True, False, True, False]
    ds = PulsarEntriesDataSource({"columns": "evidence"})
    assert ds.schema() == schema_of(EVIDENCE_COLUMNS)
    assert PulsarEntriesDataSource({}).schema().fieldNames()[-1] == "payload_size"
    with pytest.raises(ConfigError, match="columns: nope is not a column"):
        PulsarEntriesDataSource({"columns": "ledger,nope"}).schema()


def test_layout_arrow_packs_record_batches_into_rows_and_unpacks_to_the_same_rows() -> None:
    from cursorsync.sources.entries import (
        EVIDENCE_COLUMNS,
        PACKED_SCHEMA,
        EntriesReadError,
        PulsarEntriesDataSource,
        arrow_batches,
        packed_batches,
        read_entries,
        unpack,
    )

    script = [_Msg(_Id(1, e), {REPL: f"9:{e}"} if e % 2 else {}) for e in range(5)]
    plain = pa.Table.from_batches(list(arrow_batches(
        read_entries(_scripted(list(script), "1:4", columns=EVIDENCE_COLUMNS)),
        EVIDENCE_COLUMNS, size=2)))
    packed = pa.Table.from_batches(list(packed_batches(arrow_batches(
        read_entries(_scripted(list(script), "1:4", columns=EVIDENCE_COLUMNS)),
        EVIDENCE_COLUMNS, size=2), "a")))
    # One Spark row per record batch: what crosses the JVM is three rows, not five.
    assert packed.num_rows == 3
    assert packed.column("rows").to_pylist() == [2, 2, 1]
    assert set(packed.column("cluster").to_pylist()) == {"a"}
    assert unpack(packed, EVIDENCE_COLUMNS).equals(plain)
    assert unpack(packed.slice(0, 0), EVIDENCE_COLUMNS).num_rows == 0
    assert PulsarEntriesDataSource({"layout": "arrow"}).schema() == PACKED_SCHEMA
    with pytest.raises(ConfigError, match="option layout: 'packed' is not valid"):
        PulsarEntriesDataSource({"layout": "packed"}).schema()
    # A driver expecting other columns (another cursorsync version) says so.
    with pytest.raises(EntriesReadError, match="executors on another cursorsync version"):
        unpack(packed, ("cluster", "ledger"))


def test_identity_scope_batched_digests_batches_only_and_the_source_side_drops_the_rest(
) -> None:
    from cursorsync.sources.entries import read_entries

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
    from cursorsync.sources import entries

    class Settings:
        def __init__(self, n: int) -> None:
            self.n, self.closed = n, False

        def connect(self) -> Settings:
            return self

        def close(self) -> None:
            self.closed = True

    saved = dict(entries._CLIENTS)
    entries._CLIENTS.clear()
    try:
        made = [Settings(i) for i in range(entries.CLIENTS_KEPT + 2)]
        for s in made[:entries.CLIENTS_KEPT]:
            assert entries._client(s) is s  # type: ignore[arg-type]
        entries._client(made[0])  # type: ignore[arg-type] - used again: now the newest
        entries._client(made[-2])  # type: ignore[arg-type]
        entries._client(made[-1])  # type: ignore[arg-type]
        assert [s.closed for s in made[:3]] == [False, True, True]
        assert len(entries._CLIENTS) == entries.CLIENTS_KEPT
    finally:
        entries._CLIENTS.clear()
        entries._CLIENTS.update(saved)


class _StallingClient:
    """Each reader delivers its part of ``parts`` then stalls: it times out for ever while
    saying more is available (pulsar-lite, seen about once in ten reads). Records the start
    id of every reader opened."""

    def __init__(self, parts: list[list[_Msg]]) -> None:
        self.parts = [list(p) for p in parts]
        self.starts: list[tuple[int, int, int, int]] = []

    def connect(self) -> _StallingClient:
        return self

    def create_reader(self, _topic: str, start: Any, **_k: Any) -> _ScriptedClient:
        self.starts.append((start.partition(), start.ledger_id(), start.entry_id(),
                            start.batch_index()))
        reader = _ScriptedClient(self.parts.pop(0))
        reader.has_message_available = lambda: True  # type: ignore[method-assign]
        return reader


def test_read_entries_reopens_a_stalled_reader_past_the_last_entry_delivered() -> None:
    import cursorsync.sources.entries as entries

    b = [_Msg(_Id(1, 2, i, 3)) for i in range(3)]
    client = _StallingClient([
        [_Msg(_Id(1, 0)), _Msg(_Id(1, 1)), b[0]],    # stalls in the middle of batch 1:2
        [b[0], b[1]],                                # from 1:2 again; stalls again
        [b[0], b[1], b[2], _Msg(_Id(1, 3)), _Msg(_Id(1, 4))],
    ])
    part = entries.EntriesPartition(
        cluster="a", topic=f"{NS}/t-partition-3", start="-1:-1", end="1:3",
        client=client,  # type: ignore[arg-type]
        identity_fields=("payload",), identity=True, per_entry=False,
        source_position_property=REPL, read_timeout_ms=2000, reader_stall_ms=50)
    rows = list(entries.read_entries(part))
    assert [(r[4], r[5]) for r in rows] == [(0, -1), (1, -1), (2, 0), (2, 1), (2, 2), (3, -1)]
    # Reopened at the last entry delivered (exclusive, whole entry), on the right partition.
    assert [s[1:] for s in client.starts[1:]] == [(1, 2, -1), (1, 2, -1)]
    assert {s[0] for s in client.starts[1:]} == {3}


def test_a_stalled_reader_is_reopened_only_while_the_broker_has_more() -> None:
    from cursorsync.pulsar.reader import ResumingReader

    client = _StallingClient([[_Msg(_Id(1, 0))]] + [[] for _ in range(50)])
    reader = ResumingReader(client, f"{NS}/t", pulsar.MessageId.earliest, stall_ms=20)
    assert reader.read_next(100).message_id().entry_id() == 0
    reader._reader.has_message_available = lambda: False  # idle, nothing more: no reopen
    with pytest.raises(pulsar.Timeout):
        reader.read_next(60)
    assert reader.reopened == 0 and len(client.starts) == 1
    reader._reader.has_message_available = lambda: True   # more, nothing delivered: reopen
    with pytest.raises(pulsar.Timeout):
        reader.read_next(60)
    assert reader.reopened >= 1 and len(client.starts) == 1 + reader.reopened
    assert {s[1:] for s in client.starts[1:]} == {(1, 0, -1)}  # past the last entry delivered


def test_a_worker_freezes_its_heap_at_its_first_two_tasks_only() -> None:
    """The first task loads modules of its own (pyspark imports pandas while it serializes
    the first batch), so the heap is frozen again at the second; never after, or each
    task's garbage cycles would be kept for ever. In a fresh process: the freeze is global."""
    import subprocess
    import sys

    code = (
        "import gc\n"
        "from cursorsync.sources.entries import _freeze_worker_heap\n"
        "counts, kept = [], []\n"
        "for i in range(4):\n"
        "    kept.append([[j] for j in range(1000)])  # what a task loads and keeps\n"
        "    _freeze_worker_heap()\n"
        "    counts.append(gc.get_freeze_count())\n"
        "print(counts[0] > 0, counts[1] > counts[0] + 900, counts[2] == counts[1] == counts[3])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "True"]


# -- ranges packed into tasks ---------------------------------------------------------


def _range(topic: int, start: str, end: str) -> Any:
    from cursorsync.sources.entries import EntriesPartition

    return EntriesPartition(cluster="a", topic=f"{NS}/t-partition-{topic}", start=start, end=end,
                            client=None,  # type: ignore[arg-type]
                            identity_fields=("payload",), identity=True, per_entry=True,
                            source_position_property=REPL, read_timeout_ms=100)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.one_of(st.none(), st.integers(1, 300)), max_size=40),
       per_task=st.integers(1, 400), ranges_per_task=st.integers(1, 8))
def test_ranges_are_packed_in_order_whole_and_within_the_bounds(
        sizes: list[int | None], per_task: int, ranges_per_task: int) -> None:
    from cursorsync.sources.entries import pack_ranges

    # None: a range that spans ledgers, of unknown size.
    ranges = [_range(i, "1:9", f"1:{9 + n}") if n is not None else _range(i, "1:9", "2:3")
              for i, n in enumerate(sizes)]
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


@pytest.mark.integration
def test_a_task_of_several_ranges_reads_what_a_task_per_range_reads(
        broker: str, topics: list[str]) -> None:
    packed = entries_reader(broker, topics)
    alone = entries_reader(broker, topics, rangesPerTask="1")
    try:
        end = packed.latestOffset(packed.initialOffset(), ReadAllAvailable())
        # From each topic's first entry: ranges in one ledger, of known size (one from
        # before every entry spans ledgers and gets a task of its own).
        start = make_offset({t: Position(p.ledger, 0) for t, p in parse_offset(end).items()})
        assert [len(t.ranges) for t in packed.partitions(start, end)] == [2]
        assert [len(t.ranges) for t in alone.partitions(start, end)] == [1, 1]
        assert read_all(packed, start, end) == read_all(alone, start, end)
    finally:
        packed.stop()
        alone.stop()


def test_a_range_across_ledgers_is_sized_by_the_first_entry_the_driver_found() -> None:
    import dataclasses

    r = _range(0, "-1:-1", "7:99")
    assert r.entry_count() is None  # before every entry: how many is unknown
    assert dataclasses.replace(r, first="7:0").entry_count() == 100
    assert dataclasses.replace(r, start="3:9", first="7:40").entry_count() == 60
    assert dataclasses.replace(r, first="6:0").entry_count() is None  # still two ledgers


@pytest.mark.parametrize(("entries", "configured", "queue"), [
    (12_500, 50_000, 50_000),  # the whole range in the first grant: 4 per entry
    (12_500, 20_000, 20_000),  # no larger than configured
    (100, 50_000, 1_000),  # never below Pulsar's default
    (None, 50_000, 50_000),  # unknown size: as configured
])
def test_a_range_queue_takes_the_range_in_one_grant_within_the_configured_size(
        entries: int | None, configured: int, queue: int) -> None:
    import dataclasses

    end = "2:3" if entries is None else f"1:{9 + entries}"
    r = dataclasses.replace(_range(0, "1:9", end), receiver_queue_size=configured)
    assert r.queue_size() == queue


def test_embedded_config_reads_a_clusters_batch_with_one_reader_per_broker() -> None:
    """pulsar-lite stalls two large-queue readers on one broker (README, Limits), so the
    embedded config packs a cluster's whole batch into one task, and each range of it
    gets its whole read in the first grant, not cut short by the configured queue."""
    import dataclasses

    from cursorsync.config import EMBEDDED_CONFIG_PATH, load_config
    from cursorsync.sources.entries import RANGE_QUEUE_PER_ENTRY, pack_ranges

    config = load_config(EMBEDDED_CONFIG_PATH)
    share = config.spark.max_entries_per_batch // 4  # the bench: four partitions' backlog
    sizes = [share - 1] * 4 + [1, 1]  # and a live topic's two partitions
    for cluster in (config.source, config.target):
        ranges = [dataclasses.replace(_range(i, "1:9", f"1:{9 + n}"),
                                      receiver_queue_size=cluster.receiver_queue_size)
                  for i, n in enumerate(sizes)]
        spark = config.spark
        assert len(pack_ranges(ranges, spark.entries_per_task, spark.ranges_per_task)) == 1
        assert [r.queue_size() for r in ranges[:4]] == [RANGE_QUEUE_PER_ENTRY * (share - 1)] * 4


@pytest.mark.integration
def test_first_ranges_are_sized_by_the_driver_and_share_a_task(
        broker: str, topics: list[str]) -> None:
    r = entries_reader(broker, topics, maxRowsPerBatch="100")
    restarted = entries_reader(broker, topics, maxRowsPerBatch="100")
    try:
        start = r.initialOffset()  # before every entry: each range spans ledgers
        end = r.latestOffset(start, r.getDefaultReadLimit())
        tasks = r.partitions(start, end)
        rows = as_dicts(read_all(r, start, end))
        # A driver that did not look up the first entries (restarted between the two
        # calls) packs the ranges as of unknown size, and reads the same rows.
        assert [len(t.ranges) for t in restarted.partitions(start, end)] == [1, 1]
        assert as_dicts(read_all(restarted, start, end)) == rows
    finally:
        r.stop()
        restarted.stop()
    assert [len(t.ranges) for t in tasks] == [2]
    for part in tasks[0].ranges:
        entries = {(x["ledger"], x["entry"]) for x in rows
                   if x["partition"] == int(part.topic.rsplit("-", 1)[1])}
        assert part.first is not None and part.entry_count() == len(entries) > 0


class _SlowClient:
    """Every reader delivers its first message only ``delay_ms`` after it was opened, as a
    broker reading from tiered storage might: slow, not stuck (more is available)."""

    def __init__(self, delay_ms: int) -> None:
        self.delay_s = delay_ms / 1000
        self.opened = 0

    def create_reader(self, _topic: str, _start: Any, **_k: Any) -> Any:
        self.opened += 1
        client, born = self, time.monotonic()

        class Reader:
            def read_next(self, timeout_ms: int) -> _Msg:
                left = client.delay_s - (time.monotonic() - born)
                if left <= 0:
                    return _Msg(_Id(1, 0))
                time.sleep(min(left, timeout_ms / 1000))
                if time.monotonic() - born < client.delay_s:
                    raise pulsar.Timeout()
                return _Msg(_Id(1, 0))

            def has_message_available(self) -> bool:
                return True

            def close(self) -> None:
                pass

        return Reader()


def test_a_slow_broker_is_given_longer_after_each_reopen_not_reopened_for_ever() -> None:
    from cursorsync.pulsar.reader import ResumingReader

    client = _SlowClient(delay_ms=300)
    reader = ResumingReader(client, f"{NS}/t", pulsar.MessageId.earliest, stall_ms=50)
    t0 = time.monotonic()
    msg = None
    while msg is None and time.monotonic() - t0 < 5:
        with contextlib.suppress(pulsar.Timeout):
            msg = reader.read_next(100)
    # Waits of 50, 100, 200 ms were each too short for a fresh reader; 400 was not. A
    # fixed 50 ms would reopen every 50 ms and never see a message.
    assert msg is not None and reader.reopened == 3 and client.opened == 4
    assert reader._patience == 50  # a message: back to the first wait


def test_first_chunk_is_read_from_a_chunked_message_id_and_only_from_one() -> None:
    from cursorsync.pulsar.msgid import first_chunk_of

    class Serialised:
        def __init__(self, hexed: str) -> None:
            self.data = bytes.fromhex(hexed)

        def serialize(self) -> bytes:
            return self.data

    # What pulsar-lite's chunked message 0:3 (chunks from 0:1) serialises to.
    assert first_chunk_of(Serialised("080010033a0408001001")) == (0, 1)
    # Entry 58 is the byte 0x3a, field 7's key, inside an ordinary id: still none.
    assert first_chunk_of(pulsar.MessageId(0, 5, 58, -1)) is None
    assert first_chunk_of(pulsar.MessageId(-1, 58, 3, -1)) is None


def _chunked(client: Any, broker: str, topic: str, **part: Any) -> tuple[Any, Any, Any]:
    """A small message, then one of 6 MB (over pulsar-lite's 5 MB: sent in chunks), both
    stamped; returns their ids and a partition reading both."""
    from cursorsync.sources.entries import ClientSettings, EntriesPartition

    p = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
    small = p.send(b"small", properties={REPL: "7:1"})
    big = p.send(b"x" * (6 * 1024 * 1024), properties={REPL: "7:2"})
    p.close()
    return small, big, EntriesPartition(
        cluster="a", topic=topic, start="-1:-1", end=f"{big.ledger_id()}:{big.entry_id()}",
        client=ClientSettings(broker), identity_fields=("payload",), identity=True,
        per_entry=True, source_position_property=REPL, read_timeout_ms=10_000, **part)


@pytest.mark.integration
def test_a_chunked_message_fails_the_read_instead_of_its_chunks_passing_for_markers(
        broker: str, client: Any) -> None:
    """Its chunks are entries the reader skips, which the builder takes for markers and the
    sync acks: a failover would then lose the message. Refused, naming the topic."""
    from cursorsync.sources.entries import EntriesReadError, read_entries

    topic = f"{NS}/chunky"
    _, big, part = _chunked(client, broker, topic)
    with pytest.raises(EntriesReadError, match=(
            rf"entry {big.ledger_id()}:{big.entry_id()} is the last chunk of a chunked "
            rf"message that starts at {big.ledger_id()}:1\..*remove {topic}")):
        list(read_entries(part))


@pytest.mark.integration
def test_with_chunked_messages_unmapped_a_chunked_message_is_read_without_evidence(
        broker: str, client: Any) -> None:
    """evidence.holes unacked: the read goes on; the chunked message has no stamp and no
    digest, so the builder never pairs it (never acked on the target)."""
    from cursorsync.sources.entries import arrow_batches, read_entries

    small, big, part = _chunked(client, broker, f"{NS}/chunky-unmapped", chunked_unmapped=True)
    rows = [r for b in arrow_batches(read_entries(part), COLS) for r in b.to_pylist()]
    assert [(r["entry"], r["source_position"]) for r in rows] == [
        (small.entry_id(), "7:1"), (big.entry_id(), None)]
    assert rows[1]["entry_identity"] is None and rows[1]["identity"] is None
