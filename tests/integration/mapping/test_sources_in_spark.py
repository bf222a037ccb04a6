"""Both sources in Spark: pulsar-entries on the real test bed, in both layouts, and
pulsar-cursors (against the admin stub and on the bed), its poll kept across batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pyarrow as pa
import pytest

from cursorsync.app.sources import register
from cursorsync.mapping.entries_options import EVIDENCE_COLUMNS
from cursorsync.mapping.entries_rows import unpack_batches
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.admin_proxy import AdminProxy, Fault
from tests.support.admin_stub import StubAdmin
from tests.support.entries import REPL, serve_partitioned
from tests.support.waiting import wait_for

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
