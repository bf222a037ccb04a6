"""Delta table layer: schema files, row checks, and one conformance suite over every backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.errors import ConfigError, MappingConflictError
from cursorsync.tables import (
    BACKENDS,
    SCHEMAS_ENV,
    TABLES,
    RowFilter,
    TableSchemaError,
    TableStore,
    load_schema,
    open_store,
    prepare_rows,
    schemas_dir,
    topic_bucket,
)
from cursorsync.tables.delta_rs import DeltaRsStore
from cursorsync.tables.delta_spark import (
    DELTA_JARS_ENV,
    delta_package,
    find_delta_jars,
)
from cursorsync.tables.rows import (
    cursor_state_rows,
    cursor_states,
    mapping_rows,
    sync_progress_rows,
    topic_mappings,
)
from cursorsync.tables.schema import REQUIRED_COLUMNS, TableSchema, topic_buckets
from cursorsync.tables.store import TableWriteError
from cursorsync_devtools.testbed.delta_jars import DELTA_VERSION, ensure_delta_jars
from tests.support.delta_spark import _delta_jars, _spark_session

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


# ----------------------------------------------------------------- row makers


def make_mappings(topics: list[str], *, per_topic: int = 2) -> pa.Table:
    rows = []
    for t in topics:
        for i in range(per_topic):
            rows.append({
                "topic": t, "partition": i % 2 - 1 if i < 2 else i, "source_cluster": "A",
                "target_cluster": "B", "kind": "segment", "source_ledger": 10 + i,
                "source_entry": 0, "target_ledger": 20 + i, "target_entry": 5, "count": 100,
                "evidence": "position-property", "written_at": NOW,
            })
    rows.append({
        "topic": topics[0], "partition": -1, "source_cluster": "A", "target_cluster": "B",
        "kind": "skippable", "source_ledger": None, "source_entry": None,
        "target_ledger": 20, "target_entry": 105, "count": 1, "evidence": None,
        "written_at": NOW,
    })
    return pa.Table.from_pylist(rows)


def make_cursor_states(topic: str, subscriptions: list[str]) -> pa.Table:
    return pa.Table.from_pylist([
        {
            "topic": topic, "partition": 3, "subscription": s, "source_cluster": "A",
            "target_cluster": "B", "mark_delete_ledger": 7, "mark_delete_entry": 4,
            "individually_deleted": "[(7:5..7:6],(7:8..7:9]]",
            "individually_deleted_ranges": [
                {"lo_ledger": 7, "lo_entry": 5, "hi_ledger": 7, "hi_entry": 6},
                {"lo_ledger": 7, "lo_entry": 8, "hi_ledger": 7, "hi_entry": 9},
            ],
            "ledgers": [{"ledger_id": 7, "entries": 50}],
            "observed_at": NOW,
        }
        for s in subscriptions
    ])


def make_progress(topic: str, subscription: str) -> pa.Table:
    return pa.Table.from_pylist([{
        "topic": topic, "partition": -1, "subscription": subscription,
        "source_cluster": "A", "target_cluster": "B",
        "target_mark_delete_ledger": 20, "target_mark_delete_entry": 9,
        "previous_target_mark_delete_ledger": 20, "previous_target_mark_delete_entry": 3,
        "acked_ranges": "[(20:3..20:9]]", "acks_sent": 6, "unmapped_acked_entries": 0,
        "rewound_entries": 0, "partial_batches_unacked": 0, "skippable_acked_entries": 1,
        "outcome": "exact", "dry_run": False, "source_observed_at": NOW,
        "emitted_at": NOW, "lag_ms": 250,
    }])


TOPICS = [f"persistent://t/ns/topic-{i}" for i in range(5)]


# ------------------------------------------------------------------- backends


StoreFactory = Callable[[], TableStore]


@pytest.fixture(params=[pytest.param(b, marks=pytest.mark.spark) if b == "delta-spark" else b
                        for b in BACKENDS])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of fresh store objects on one root: calling it again is a process restart."""
    root = str(tmp_path / "tables")
    if request.param == "delta-spark":
        spark = request.getfixturevalue("delta_spark_session")
        return lambda: open_store("delta-spark", root, spark=spark)
    return lambda: open_store("delta-rs", root)


def _rows_of(store: TableStore, table: str, flt: RowFilter | None = None) -> int:
    return store.read(table, flt).num_rows  # type: ignore[arg-type]


# --------------------------------------------------------------- conformance


def test_ensure_creates_tables_exactly_as_the_schema_files(make_store: StoreFactory) -> None:
    store = make_store()
    for table in TABLES:
        assert not store.exists(table)
    store.ensure_all()
    store.ensure_all()  # second time: a no-op, not an error
    for table in TABLES:
        schema = load_schema(table)
        assert store.exists(table)
        assert schema.differences(store.stored_schema(table)) == []
        assert store.partition_columns(table) == list(schema.partition_by)
        assert store.read(table).schema.equals(schema.arrow(), check_metadata=False)
        assert store.read(table).num_rows == 0


def test_append_then_read_back_with_filters(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.append("mappings", make_mappings(TOPICS), app_id="mapping", batch_id=0)
    assert store.append("cursor_states", make_cursor_states(TOPICS[0], ["s1", "s2"]),
                        app_id="sync", batch_id=0)
    assert store.append("cursor_states", make_cursor_states(TOPICS[1], ["s1"]),
                        app_id="sync", batch_id=1)

    everything = store.read("mappings")
    assert everything.num_rows == 2 * len(TOPICS) + 1
    version = load_schema("mappings").version
    assert everything.column("schema_version").to_pylist() == [version] * everything.num_rows
    assert set(everything.column("batch_id").to_pylist()) == {0}
    buckets = load_schema("mappings").topic_buckets
    for t, b in zip(everything.column("topic").to_pylist(),
                    everything.column("topic_bucket").to_pylist(), strict=True):
        assert b == topic_bucket(t, buckets)

    one = store.read("mappings", RowFilter.of(topic=TOPICS[0]))
    assert set(one.column("topic").to_pylist()) == {TOPICS[0]}
    assert sorted(one.column("kind").to_pylist()) == ["segment", "segment", "skippable"]
    run = next(r for r in one.to_pylist() if r["kind"] == "skippable")
    assert run["source_ledger"] is None and run["evidence"] is None
    assert run["written_at"] == NOW

    two = store.read("mappings", RowFilter.of(topic=TOPICS[1:3], partition=-1))
    assert sorted(two.column("topic").to_pylist()) == TOPICS[1:3]

    s1 = store.read("cursor_states", RowFilter.of(subscription="s1"))
    assert sorted(s1.column("topic").to_pylist()) == sorted(TOPICS[:2])
    row = store.read("cursor_states", RowFilter.of(topic=TOPICS[0], subscription="s2")).to_pylist()
    assert len(row) == 1
    assert row[0]["individually_deleted"] == "[(7:5..7:6],(7:8..7:9]]"
    assert row[0]["individually_deleted_ranges"][1] == {
        "lo_ledger": 7, "lo_entry": 8, "hi_ledger": 7, "hi_entry": 9}
    assert row[0]["ledgers"] == [{"ledger_id": 7, "entries": 50}]
    late = store.read("cursor_states", RowFilter.of(min_batch_id=1))
    assert late.column("topic").to_pylist() == [TOPICS[1]]

    cols = store.read("mappings", RowFilter.of(topic="persistent://t/ns/absent"),
                      columns=["topic", "count"])
    assert cols.num_rows == 0 and cols.column_names == ["topic", "count"]


def test_replaying_a_batch_writes_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    rows = make_mappings(TOPICS[:2])
    assert store.append("mappings", rows, app_id="mapping", batch_id=3) is True
    assert store.append("mappings", rows, app_id="mapping", batch_id=3) is False
    assert store.append("mappings", rows, app_id="mapping", batch_id=2) is False
    assert _rows_of(store, "mappings") == rows.num_rows
    # Another writer, and the same writer's next batch, still append.
    assert store.append("mappings", rows, app_id="other", batch_id=3) is True
    assert store.append("mappings", rows, app_id="mapping", batch_id=4) is True
    assert _rows_of(store, "mappings") == 3 * rows.num_rows
    # The watermark is per table: batch 3 of "mapping" was never written to sync_progress.
    assert store.append("sync_progress", make_progress(TOPICS[0], "s"),
                        app_id="mapping", batch_id=3) is True


def test_last_batch(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.last_batch("sync") is None
    store.append("cursor_states", make_cursor_states(TOPICS[0], ["s"]), app_id="sync", batch_id=5)
    store.append("sync_progress", make_progress(TOPICS[0], "s"), app_id="sync", batch_id=4)
    assert store.last_batch("sync") == 5
    assert store.last_batch("sync", table="sync_progress") == 4
    assert store.last_batch("sync", table="mappings") is None
    assert store.last_batch("someone-else") is None
    # An empty batch still commits, so progress is recorded.
    empty = make_cursor_states(TOPICS[0], ["s"]).slice(0, 0)
    assert store.append("cursor_states", empty, app_id="sync", batch_id=6) is True
    assert store.last_batch("sync", table="cursor_states") == 6
    assert _rows_of(store, "cursor_states") == 1


def test_reopen_after_restart(make_store: StoreFactory) -> None:
    first = make_store()
    rows = make_mappings(TOPICS)
    assert first.append("mappings", rows, app_id="mapping", batch_id=11)
    del first
    second = make_store()  # a new process: nothing carried over but the files
    assert second.last_batch("mapping") == 11
    assert second.append("mappings", rows, app_id="mapping", batch_id=11) is False
    assert _rows_of(second, "mappings") == rows.num_rows
    assert second.append("mappings", rows, app_id="mapping", batch_id=12) is True
    assert _rows_of(second, "mappings", RowFilter.of(topic=TOPICS[2])) == 4


def test_partition_layout_is_buckets_never_topics(make_store: StoreFactory) -> None:
    store = make_store()
    topics = [f"persistent://t/ns/many-{i}" for i in range(300)]
    store.append("mappings", make_mappings(topics, per_topic=1), app_id="m", batch_id=0)
    buckets = load_schema("mappings").topic_buckets
    root = Path(store.uri("mappings"))
    dirs = sorted(p.name for p in root.iterdir() if p.is_dir())
    data_dirs = [d for d in dirs if d != "_delta_log"]
    assert data_dirs, dirs
    assert len(data_dirs) <= buckets
    for d in data_dirs:
        key, _, value = d.partition("=")
        assert key == "topic_bucket" and 0 <= int(value) < buckets, d
    for dirpath, subdirs, _ in os.walk(root):
        if dirpath != str(root) and "_delta_log" not in dirpath:
            assert not [s for s in subdirs if not s.startswith("_")], (dirpath, subdirs)


def test_compact_and_vacuum_keep_the_rows(make_store: StoreFactory) -> None:
    store = make_store()
    for batch in range(4):  # four small files in one bucket
        store.append("sync_progress", make_progress(TOPICS[0], f"s{batch}"),
                     app_id="sync", batch_id=batch)
    before = store.read("sync_progress")
    metrics = store.compact("sync_progress")
    assert metrics
    listed = store.vacuum("sync_progress", 0, dry_run=True, enforce_retention_duration=False)
    assert len(listed) == 4  # the compacted-away small files
    root = Path(store.uri("sync_progress"))
    assert all((root / f).is_file() for f in listed)
    store.vacuum("sync_progress", 0, dry_run=False, enforce_retention_duration=False)
    # Gone from disk. (A later delta-rs dry run still lists them: it reports tombstones
    # without checking the files exist.)
    assert not any((root / f).exists() for f in listed)
    assert len(list(root.glob("topic_bucket=*/*.parquet"))) == 1
    after = store.read("sync_progress")
    assert sorted(after.column("subscription").to_pylist()) == sorted(
        before.column("subscription").to_pylist())
    assert store.last_batch("sync") == 3


def test_expire_deletes_old_rows_but_keeps_each_keys_newest(make_store: StoreFactory) -> None:
    """Retention: rows older than the cutoff go, except the newest row of each key, which
    stays however old it is; rows of other keys and newer rows are untouched."""
    store = make_store()
    day = timedelta(days=1)

    def observed(sub: str, at: datetime, batch: int) -> None:
        row = make_progress(TOPICS[0], sub).to_pylist()[0] | {"emitted_at": at}
        store.append("sync_progress", pa.Table.from_pylist([row]), app_id=f"w-{sub}-{batch}",
                     batch_id=batch)

    for batch in range(4):  # "moving": four rows, the newest recent
        observed("moving", NOW - (3 - batch) * 10 * day, batch)
    for batch in range(3):  # "idle": three old rows, none recent
        observed("idle", NOW - (30 + batch) * day, batch)
    observed("fresh", NOW, 0)
    deleted = store.expire("sync_progress", time_column="emitted_at", before=NOW - 5 * day,
                           key_columns=("source_cluster", "target_cluster", "topic",
                                        "partition", "subscription"))
    rows = store.read("sync_progress").to_pylist()
    left = sorted((r["subscription"], r["emitted_at"]) for r in rows)
    assert deleted == 5
    assert left == [("fresh", NOW), ("idle", NOW - 30 * day), ("moving", NOW)]
    again = store.expire("sync_progress", time_column="emitted_at", before=NOW - 5 * day,
                         key_columns=("subscription",))
    assert again == 0 and store.read("sync_progress").num_rows == 3
    assert store.last_batch("w-moving-3") == 3  # appends stay idempotent after a rewrite


def test_ensure_refuses_a_table_that_differs_from_its_schema_file(
    make_store: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    store.ensure("cursor_states")
    changed = tmp_path / "schemas-v2"
    shutil.copytree(schemas_dir(), changed)
    doc = json.loads((changed / "cursor_states.json").read_text())
    doc["version"] = 2
    doc["fields"].insert(-1, {"name": "broker", "type": "string", "nullable": True, "doc": "x"})
    (changed / "cursor_states.json").write_text(json.dumps(doc))
    monkeypatch.setenv(SCHEMAS_ENV, str(changed))
    with pytest.raises(TableSchemaError, match=r"cursor_states.*version 2.*broker"):
        make_store().ensure("cursor_states")


# ------------------------------------------------------- delta-rs specifics


def test_delta_rs_records_but_does_not_enforce_app_transactions(tmp_path: Path) -> None:
    """Pin the delta-rs behaviour the store works around (see delta_rs.py)."""
    uri = str(tmp_path / "raw")
    data = pa.table({"x": pa.array([1, 2], pa.int64())})

    def write(version: int) -> None:
        write_deltalake(uri, data, mode="append", commit_properties=CommitProperties(
            app_transactions=[Transaction("app", version)]))

    write(5)
    assert DeltaTable(uri).transaction_version("app") == 5
    write(5)  # a replay: accepted, rows duplicated
    write(3)  # an older version: accepted, and the recorded version goes backwards
    dt = DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 6
    assert dt.transaction_version("app") == 3


def _race_on_open(monkeypatch: pytest.MonkeyPatch, a: DeltaRsStore,
                  other_write: Callable[[], bool]) -> list[bool]:
    """Make ``other_write`` commit right after ``a`` opens its snapshot, once; returns the
    list its result lands in."""
    original = a._open
    raced: list[bool] = []

    def open_then_race(table):  # type: ignore[no-untyped-def]
        snapshot = original(table)
        if not raced:
            raced.append(other_write())
        return snapshot

    monkeypatch.setattr(a, "_open", open_then_race)
    return raced


def test_delta_rs_racing_writers_of_one_batch_land_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both see batch 7 unwritten; the loser's commit conflicts and it reports False."""
    root = str(tmp_path / "tables")
    a, b = DeltaRsStore(root), DeltaRsStore(root)
    rows = make_mappings(TOPICS[:1])
    a.append("mappings", rows, app_id="m", batch_id=6)
    raced = _race_on_open(monkeypatch, a,
                          lambda: b.append("mappings", rows, app_id="m", batch_id=7))
    assert a.append("mappings", rows, app_id="m", batch_id=7) is False
    assert raced == [True]
    assert _rows_of(b, "mappings") == 2 * rows.num_rows
    assert b.last_batch("m") == 7


def test_delta_rs_racing_writers_of_different_apps_both_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "tables")
    a, b = DeltaRsStore(root), DeltaRsStore(root)
    rows = make_mappings(TOPICS[:1])
    a.append("mappings", rows, app_id="x", batch_id=0)
    raced = _race_on_open(monkeypatch, a,
                          lambda: b.append("mappings", rows, app_id="y", batch_id=0))
    assert a.append("mappings", rows, app_id="x", batch_id=1) is True
    assert raced == [True]
    assert _rows_of(b, "mappings") == 3 * rows.num_rows


# ---------------------------------------------------- delta-spark specifics


def test_delta_jars_come_from_the_cache_once_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    jars = _delta_jars()
    assert [j.name for j in jars] == [f"delta-spark_4.2_2.13-{DELTA_VERSION}.jar",
                                      f"delta-storage-{DELTA_VERSION}.jar"]

    def no_maven(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"Maven ran although the jars are cached: {args}")

    monkeypatch.setattr("cursorsync_devtools.testbed.distribution.subprocess.run", no_maven)
    assert ensure_delta_jars() == jars
    # What a user does with such a Maven-layout copy: name its directories.
    monkeypatch.setenv(DELTA_JARS_ENV, os.pathsep.join(str(j.parent) for j in jars))
    assert find_delta_jars() == tuple(jars)
    # The jars are the ones the pip package's own helper (delta.pip_utils) would name.
    assert delta_package() == f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"


def test_find_delta_jars_pairs_one_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no Ivy cache
    maven, ivy = tmp_path / "maven", tmp_path / "ivy"
    for d, names in ((maven, ["delta-spark_4.2_2.13-4.4.0.jar",
                              "delta-spark_4.2_2.13-4.4.0-sources.jar",
                              "delta-storage-4.3.0.jar"]),
                     (ivy, ["io.delta_delta-storage-4.4.0.jar"])):
        d.mkdir()
        for n in names:
            (d / n).touch()
    monkeypatch.setenv(DELTA_JARS_ENV, str(maven))
    assert find_delta_jars() == ()  # delta-storage 4.3.0 does not go with delta-spark 4.4.0
    monkeypatch.setenv(DELTA_JARS_ENV, os.pathsep.join([str(maven), str(ivy)]))
    assert find_delta_jars() == (maven / "delta-spark_4.2_2.13-4.4.0.jar",
                                 ivy / "io.delta_delta-storage-4.4.0.jar")


@pytest.mark.spark
def test_delta_spark_skips_a_replayed_txn_version(
    delta_spark_session: object, tmp_path: Path
) -> None:
    """Pin the delta-spark behaviour the store relies on (see delta_spark.py): unlike
    delta-rs, Delta skips a write whose ``txnVersion`` is not above the recorded one, and
    delta-rs reads the version delta-spark recorded."""
    spark = delta_spark_session
    uri = str(tmp_path / "raw")
    df = spark.range(2)  # type: ignore[attr-defined]

    def write(version: int) -> None:
        (df.write.format("delta").mode("append").option("txnAppId", "app")
         .option("txnVersion", str(version)).save(uri))

    write(5)
    write(5)  # a replay: skipped
    write(3)  # an older version: skipped, the recorded version stays
    dt = DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 2
    assert dt.transaction_version("app") == 5
    assert dt.version() == 0  # the skipped writes committed nothing
    write(6)
    dt = DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 4
    assert dt.transaction_version("app") == 6


# ------------------------------------------------------------ schema files


def test_schema_files_are_well_formed() -> None:
    for table in TABLES:
        schema = load_schema(table)
        assert schema.name == table and schema.version >= 1
        names = schema.column_names
        assert set(REQUIRED_COLUMNS) <= set(names)
        assert schema.partition_by == ("topic_bucket",)
        assert 1 <= schema.topic_buckets <= 64
        assert all(f.doc for f in schema.fields), table
        assert schema.arrow().names == names
    ddl = load_schema("cursor_states").spark_ddl()
    assert ("`individually_deleted_ranges` ARRAY<STRUCT<`lo_ledger`: BIGINT, `lo_entry`: BIGINT, "
            "`hi_ledger`: BIGINT, `hi_entry`: BIGINT>> NOT NULL") in ddl
    assert "`observed_at` TIMESTAMP NOT NULL" in ddl
    mapping = load_schema("mappings")
    assert mapping.field("kind").values == ("segment", "skippable", "foreign", "unpaired",
                                             "unreplicated", "anchor", "live")
    assert "COMMENT '\\'segment\\' | " in mapping.spark_ddl()


@pytest.mark.parametrize(("type_text", "message"), [
    ("varchar", "'varchar' is not a valid type. Valid values are: int, long"),
    ("array<long", "not closed"),
    ("struct<a long>", "bad struct field name"),
    ("long>", "trailing"),
])
def test_bad_types_are_named(type_text: str, message: str) -> None:
    doc = json.loads((schemas_dir() / "mappings.json").read_text())
    doc["fields"][-1]["type"] = type_text
    with pytest.raises(TableSchemaError, match=message):
        TableSchema.from_dict(doc)


def test_schema_file_may_not_partition_by_topic() -> None:
    doc = json.loads((schemas_dir() / "mappings.json").read_text())
    doc["partition_by"] = ["topic"]
    with pytest.raises(TableSchemaError, match="directory per topic"):
        TableSchema.from_dict(doc)


def test_schemas_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (schemas_dir() / "mappings.json").is_file()
    monkeypatch.setenv(SCHEMAS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(TableSchemaError, match="CURSORSYNC_SCHEMAS"):
        load_schema("mappings")
    monkeypatch.setenv(SCHEMAS_ENV, str(tmp_path))
    with pytest.raises(TableSchemaError, match=r"mappings\.json not found"):
        load_schema("mappings")
    with pytest.raises(TableSchemaError, match="not a valid table"):
        load_schema("offsets")


def test_topic_bucket_is_stable_crc32() -> None:
    topic = "persistent://t/ns/orders"
    assert topic_bucket(topic, 64) == zlib.crc32(topic.encode()) % 64
    topics = pa.chunked_array([[topic, "b"], ["c", topic]])
    assert topic_buckets(topics, 16).to_pylist() == [
        topic_bucket(t, 16) for t in (topic, "b", "c", topic)]


# --------------------------------------------------------------- row checks


def test_prepare_rows_fills_derived_columns_and_casts() -> None:
    schema = load_schema("sync_progress")
    rows = make_progress(TOPICS[0], "s")
    out = prepare_rows(schema, rows, 9)
    assert out.schema.equals(schema.arrow())
    r = out.to_pylist()[0]
    assert (r["schema_version"], r["batch_id"]) == (1, 9)
    assert r["topic_bucket"] == topic_bucket(TOPICS[0], schema.topic_buckets)
    # Naive timestamps are taken as UTC.
    naive = rows.set_column(rows.schema.get_field_index("emitted_at"), "emitted_at",
                            pa.array([datetime(2026, 1, 2, 3, 4, 5)], pa.timestamp("us")))
    assert prepare_rows(schema, naive, 9).column("emitted_at")[0].as_py() == NOW


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.append_column("extra", pa.array([1])), r"no columns \['extra'\]"),
    (lambda t: t.drop_columns(["outcome"]), "column outcome is required"),
    (lambda t: t.drop_columns(["topic"]), "column topic is required"),
    (lambda t: t.set_column(t.schema.get_field_index("acks_sent"), "acks_sent",
                            pa.array([None], pa.int64())), "acks_sent is not nullable"),
    (lambda t: t.set_column(t.schema.get_field_index("outcome"), "outcome",
                            pa.array(["great"])), "'great' is not a valid outcome"),
    (lambda t: t.append_column("batch_id", pa.array([8])), "batch_id must be the append's"),
    (lambda t: t.append_column("topic_bucket", pa.array([99])), "leave it out"),
    (lambda t: t.set_column(t.schema.get_field_index("lag_ms"), "lag_ms",
                            pa.array(["soon"])), "lag_ms of type string does not convert"),
])
def test_prepare_rows_refuses_bad_rows(
    change: Callable[[pa.Table], pa.Table], message: str
) -> None:
    with pytest.raises(TableSchemaError, match=message):
        prepare_rows(load_schema("sync_progress"), change(make_progress(TOPICS[0], "s")), 9)


def test_append_checks_arguments(tmp_path: Path) -> None:
    store = open_store("delta-rs", str(tmp_path))
    with pytest.raises(ValueError, match="app_id"):
        store.append("mappings", make_mappings(TOPICS[:1]), app_id="", batch_id=0)
    with pytest.raises(ValueError, match="batch_id"):
        store.append("mappings", make_mappings(TOPICS[:1]), app_id="m", batch_id=-1)
    with pytest.raises(TableSchemaError, match="not a valid table"):
        store.read("offsets")  # type: ignore[arg-type]
    assert not store.exists("mappings")  # nothing was created by the refusals


def test_filters_match_names_with_quotes_and_backslashes(make_store: StoreFactory) -> None:
    # Pulsar allows both in subscription names; each engine has its own string escapes.
    store = make_store()
    odd = ["it's", "a\\b", "q\"uote", "plain"]
    assert store.append("cursor_states", make_cursor_states(TOPICS[0], odd),
                        app_id="sync", batch_id=0)
    for name in odd:
        rows = store.read("cursor_states", RowFilter.of(subscription=name))
        assert rows.column("subscription").to_pylist() == [name]
    assert store.read("cursor_states", RowFilter.of(subscription=odd)).num_rows == len(odd)


def test_row_filter_as_datafusion_sql() -> None:
    schema = load_schema("cursor_states")
    sql = RowFilter.of(topic="it's", subscription=["a\\b"], max_batch_id=3).sql(
        schema, dialect="datafusion")
    bucket = topic_bucket("it's", schema.topic_buckets)
    assert sql == (f'"topic_bucket" IN ({bucket}) AND "topic" IN (\'it\'\'s\') AND '
                   '"subscription" IN (\'a\\b\') AND "batch_id" <= 3')


def test_row_filter_as_spark_sql() -> None:
    schema = load_schema("cursor_states")
    sql = RowFilter.of(topic="it's", subscription=["a", "b"], min_batch_id=3).sql(schema)
    bucket = topic_bucket("it's", schema.topic_buckets)
    assert sql == (f"`topic_bucket` IN ({bucket}) AND `topic` IN ('it\\'s') AND "
                   "`subscription` IN ('a', 'b') AND `batch_id` >= 3")
    assert RowFilter().sql(schema) is None
    with pytest.raises(TableSchemaError, match="cannot filter table mappings on subscription"):
        RowFilter.of(subscription="s").arrow_expression(load_schema("mappings"))


def test_open_store_names_its_requirements(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a valid backend\. Valid values are: delta-rs"):
        open_store("iceberg", str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a SparkSession"):
        open_store("delta-spark", str(tmp_path))


_WITHOUT_JARS = """
import json, sys
from pyspark.sql import SparkSession
from cursorsync.tables import open_store
from cursorsync.tables.delta_spark import DELTA_SPARK_CONF, delta_spark_status

builder = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
           .config("spark.driver.host", "127.0.0.1")
           .config("spark.driver.bindAddress", "127.0.0.1"))
for k, v in DELTA_SPARK_CONF.items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
try:
    status = delta_spark_status(spark)
    try:
        spark.range(3).count()
        query = None
    except Exception as e:
        query = str(e)
    try:
        open_store("delta-spark", sys.argv[1], spark=spark)
        refused = None
    except Exception as e:
        refused = f"{type(e).__name__}: {e}"
    print(json.dumps({"available": status.available, "reason": status.reason,
                      "query": query, "refused": refused}))
finally:
    spark.stop()
"""


@pytest.mark.spark
def test_delta_spark_detects_a_session_without_delta_jars(tmp_path: Path) -> None:
    """Delta confs set, classes absent: the store refuses the session, naming the jars.

    A process of its own: the Delta jars the other tests put on a JVM's classpath stay there.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_JARS, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["available"] is False
    assert "io.delta.sql.DeltaSparkSessionExtension does not load" in got["reason"]
    assert got["refused"] is not None
    assert got["refused"].startswith("DeltaSparkUnavailableError: delta-spark backend unavailable")
    assert "Delta jars are not on the Spark" in got["refused"]
    # Why the confs go with the jars only: the missing catalog plugin fails every query.
    assert got["query"] is not None and "spark_catalog" in got["query"], got["query"]


# ----------------------------------------------------------------- rows.py


def test_mapping_rows_round_trip_through_the_store(tmp_path: Path) -> None:
    key = PartitionKey("persistent://t/ns/orders", 2)
    first = TopicMapping(
        SegmentSet.of([Segment(1, 0, 10, 0, 50, "identity"), Segment(2, 0, 10, 51, 10)]),
        skippable=Runs.of((10, 50, 1)), foreign=Runs.of((11, 0, 3)),
        unreplicated=Runs.of((1, 50, 2)),
    )
    later = TopicMapping(SegmentSet.of([Segment(2, 10, 10, 61, 5)]),  # continues segment 2
                         skippable=Runs.of((10, 50, 1)))  # a duplicate run
    store = open_store("delta-rs", str(tmp_path))
    kw = {"source_cluster": "A", "target_cluster": "B", "written_at": NOW}
    rows = mapping_rows(key, first, **kw)
    assert sorted(rows.column("kind").to_pylist()) == [
        "foreign", "segment", "segment", "skippable", "unreplicated"]
    store.append("mappings", rows, app_id="m", batch_id=0)
    store.append("mappings", mapping_rows(key, later, **kw), app_id="m", batch_id=1)
    store.append("mappings", mapping_rows(PartitionKey("other"), later, **kw),
                 app_id="m", batch_id=2)

    got = topic_mappings(store.read("mappings", RowFilter.of(topic=key.topic)))
    assert list(got) == [key]
    m = got[key]
    assert list(m.segments) == [Segment(1, 0, 10, 0, 50, "identity"), Segment(2, 0, 10, 51, 15)]
    assert m.skippable.rows.tolist() == [[10, 50, 1]]
    assert m.foreign.rows.tolist() == [[11, 0, 3]]
    assert m.unreplicated.rows.tolist() == [[1, 50, 2]]
    assert m.lookup(Position(2, 14)) == Position(10, 65)
    assert mapping_rows(key, TopicMapping(), **kw).num_rows == 0


def test_cursor_state_and_sync_progress_rows_round_trip(tmp_path: Path) -> None:
    key = PartitionKey("persistent://t/ns/orders", -1)
    state = CursorState.parse("7:4", "[(7:5..7:6],(7:8..7:9]]", Ledgers.of([(7, 50), (8, 3)]))
    observed = [ObservedCursor(key, "sub", state, NOW),
                ObservedCursor(key, "bare", CursorState.parse("7:9"), NOW)]
    store = open_store("delta-rs", str(tmp_path))
    store.append("cursor_states", cursor_state_rows(observed, source_cluster="A",
                                                    target_cluster="B"),
                 app_id="sync", batch_id=0)
    back = sorted(cursor_states(store.read("cursor_states")), key=lambda o: o.subscription)
    assert [o.subscription for o in back] == ["bare", "sub"]
    assert back[1].state.mark_delete == Position(7, 4)
    assert str(back[1].state.individually_deleted) == "[(7:5..7:6],(7:8..7:9]]"
    assert back[1].state.ledgers is not None
    assert back[1].state.ledgers.ids.tolist() == [7, 8]
    assert back[0].state.ledgers is None and not back[0].state.individually_deleted
    assert back[1].observed_at == NOW

    plan = AckPlan(
        mark_delete=Position(20, 9), individually_deleted=RangeSet.parse("[(20:10..20:12]]"),
        to_ack=RangeSet.parse("[(20:3..20:9],(20:10..20:12]]"),
        previous_mark_delete=Position(20, 3), unmapped_acked_entries=2, rewound_entries=0,
        partial_batches_unacked=1, skippable_acked_entries=1, outcome="partial",
    )
    record = SyncRecord(key, "sub", plan, acks_sent=2, dry_run=False,
                        source_observed_at=NOW, emitted_at=NOW + timedelta(milliseconds=1250))
    rows = sync_progress_rows([record], source_cluster="A", target_cluster="B")
    store.append("sync_progress", rows, app_id="sync", batch_id=0)
    r = store.read("sync_progress", RowFilter.of(topic=key.topic, subscription="sub")).to_pylist()
    assert len(r) == 1
    assert (r[0]["target_mark_delete_ledger"], r[0]["target_mark_delete_entry"]) == (20, 9)
    assert r[0]["acked_ranges"] == "[(20:3..20:9],(20:10..20:12]]"
    assert (r[0]["outcome"], r[0]["lag_ms"], r[0]["batch_id"]) == ("partial", 1250, 0)
    assert (r[0]["unmapped_acked_entries"], r[0]["partial_batches_unacked"]) == (2, 1)


EVIDENCES = ["identity", "position-property", "identity,snapshot"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3),  # partition
                          st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8),
                                             st.integers(1, 5), st.sampled_from(EVIDENCES)),
                                   max_size=3),
                          st.lists(st.tuples(st.sampled_from(
                              ["skippable", "foreign", "unreplicated", "unpaired", "anchor"]),
                              st.integers(0, 2), st.integers(0, 40), st.integers(1, 5)),
                              max_size=4),
                          st.integers(0, 5)),  # seconds after NOW
                min_size=1, max_size=8),
       st.randoms(use_true_random=False))
def test_topic_mappings_is_the_union_of_what_each_batch_wrote(
        batches: list[tuple[int, list[tuple[int, int, int, str]],
                            list[tuple[str, int, int, int]], int]],
        rnd: Any) -> None:
    """Rows of many batches and partitions, in any order, read back as the in-memory union
    of the mappings each batch wrote, per partition."""
    expected: dict[PartitionKey, TopicMapping] = {}
    tables = []
    for partition, segs, others, seconds in batches:
        key = PartitionKey("persistent://t/ns/x" + "ab"[partition % 2], partition)
        # One consistent correspondence (source l:e -> target l+10:e+3), so no two batches
        # disagree.
        runs: dict[str, list[tuple[int, int, int]]] = {}
        anchors = []
        for kind, ledger, entry, count in others:
            if kind == "anchor":
                anchors.append((ledger, entry, ledger + 10, entry + 3))
            else:
                runs.setdefault(kind, []).append((ledger, entry, count))
        # Segments are cells of a grid, 5 entries each, so batches repeat or continue each
        # other's segments (as retried and later batches do) but never cut one differently.
        cells = {(lg, cell): ev for lg, cell, _, ev in segs}
        mapping = TopicMapping(
            SegmentSet.of([Segment(lg, 5 * cell, lg + 10, 5 * cell + 3, 5, ev)
                           for (lg, cell), ev in cells.items()]),
            *(Runs().union(Runs.of(*runs.get(k, []))) for k in
              ("skippable", "foreign", "unreplicated")),
            written_at=(NOW + timedelta(seconds=seconds)).timestamp(),
            unpaired=Runs().union(Runs.of(*runs.get("unpaired", []))),
            anchors=Anchors(np.array(anchors, np.int64).reshape(-1, 4)))
        known = expected.get(key)
        expected[key] = mapping if known is None else known.union(mapping)
        tables.append(mapping_rows(key, mapping, source_cluster="A", target_cluster="B",
                                   written_at=NOW + timedelta(seconds=seconds)))
    rows = pa.concat_tables(tables)
    rows = rows.take(pa.array(rnd.sample(range(rows.num_rows), rows.num_rows), pa.int64()))
    got = topic_mappings(rows)
    shown = {k for k, m in expected.items() if mapping_rows(
        k, m, source_cluster="A", target_cluster="B", written_at=NOW).num_rows}
    assert set(got) == shown
    for key in shown:
        a, b = got[key], expected[key]
        # Compared collapsed: continuations join whichever batch wrote them.
        b_segments = SegmentSet.collapsed(b.segments.rows, b.segments.evidence_codes)
        assert list(a.segments) == list(b_segments)
        assert a.segments.evidence_codes.tolist() == b_segments.evidence_codes.tolist()
        for kind in ("skippable", "foreign", "unreplicated", "unpaired"):
            assert getattr(a, kind) == getattr(b, kind), kind
        assert a.anchors.rows.tolist() == b.anchors.rows.tolist()
        newest = max(NOW.timestamp() + s for p, sg, o, s in batches
                     if PartitionKey("persistent://t/ns/x" + "ab"[p % 2], p) == key
                     and (sg or o))
        assert a.written_at == newest


def test_topic_mappings_refuses_rows_that_disagree() -> None:
    key = PartitionKey("t")
    kw = {"source_cluster": "A", "target_cluster": "B", "written_at": NOW}
    rows = pa.concat_tables([
        mapping_rows(key, TopicMapping(SegmentSet.of([Segment(1, 0, 10, 0, 5)])), **kw),
        mapping_rows(key, TopicMapping(SegmentSet.of([Segment(2, 0, 10, 3, 5)])), **kw),
    ])
    with pytest.raises(MappingConflictError, match="overlap on the target"):
        topic_mappings(rows)


@pytest.mark.spark
def test_spark_ddl_and_arrow_rows_agree_with_the_schema_files() -> None:
    """What the delta-spark backend feeds Spark (DDL, Arrow rows, SQL filters) without Delta."""
    from pyspark.sql import SparkSession

    shared = SparkSession.getActiveSession()  # the delta-spark fixture's, when it runs first
    spark = shared or _spark_session({})
    try:
        for table in TABLES:
            schema = load_schema(table)
            empty = spark.createDataFrame([], schema=schema.spark_ddl())
            assert schema.differences(empty.toArrow().schema) == [], table
        schema = load_schema("cursor_states")
        rows = prepare_rows(schema, make_cursor_states(TOPICS[0], ["a", "b"]), 3)
        df = spark.createDataFrame(rows)
        assert schema.differences(df.toArrow().schema) == []
        picked = df.where(RowFilter.of(topic=TOPICS[0], subscription="b").sql(schema))
        assert picked.toArrow().column("subscription").to_pylist() == ["b"]
    finally:
        if shared is None:
            spark.stop()


def test_a_table_that_cannot_be_written_is_named(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine failing a commit (a full disk here) is one clear error naming the table
    and where it lives."""
    import cursorsync.tables.delta_rs as delta_rs

    store = open_store("delta-rs", str(tmp_path / "tables"))
    store.ensure_all()

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(delta_rs, "write_deltalake", full)
    with pytest.raises(TableWriteError, match=r"cannot write table sync_progress at .*/tables/"
                       r"sync_progress: .*No space left on device"):
        store.append("sync_progress", make_progress(TOPICS[0], "s"), app_id="x", batch_id=0)
