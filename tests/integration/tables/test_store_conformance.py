"""The table stores' conformance suite, run on every backend: delta-rs, and delta-spark in a
local Spark session (its cases carry the spark marker)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from cursorsync.tables import (
    BACKENDS,
    SCHEMAS_ENV,
    TABLES,
    RowFilter,
    TableSchemaError,
    TableStore,
    load_schema,
    open_store,
    schemas_dir,
    topic_bucket,
)
from tests.support.table_rows import (
    NOW,
    TOPICS,
    _rows_of,
    make_cursor_states,
    make_mappings,
    make_progress,
)

# ------------------------------------------------------------------- backends


StoreFactory = Callable[[], TableStore]


@pytest.fixture(params=[pytest.param(b, marks=[pytest.mark.spark,
                                              pytest.mark.shares("delta_spark_session")])
                        if b == "delta-spark" else b for b in BACKENDS])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of fresh store objects on one root: calling it again is a process restart."""
    root = str(tmp_path / "tables")
    if request.param == "delta-spark":
        spark = request.getfixturevalue("delta_spark_session")
        return lambda: open_store("delta-spark", root, spark=spark)
    return lambda: open_store("delta-rs", root)


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
