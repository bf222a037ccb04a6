"""Table maintenance on its schedule, on a real delta-rs store: the interval runs expiry,
compaction and vacuum; the batch count compacts between runs; a failure never stops the
sync."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cursorsync.app.maintenance import TableMaintenance
from cursorsync.app.metrics import Metrics
from cursorsync.app.settings import TablesConfig
from cursorsync.tables import TableStore, open_store

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOPIC = "persistent://t/ns/orders"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def progress(subscription: str, emitted_at: datetime, partition: int = 0) -> pa.Table:
    return pa.Table.from_pylist([{
        "topic": TOPIC, "partition": partition, "subscription": subscription,
        "source_cluster": "a", "target_cluster": "b",
        "target_mark_delete_ledger": 20, "target_mark_delete_entry": 9,
        "previous_target_mark_delete_ledger": 20, "previous_target_mark_delete_entry": 3,
        "acked_ranges": "[]", "acks_sent": 1, "unmapped_acked_entries": 0,
        "rewound_entries": 0, "partial_batches_unacked": 0, "skippable_acked_entries": 0,
        "outcome": "exact", "dry_run": False, "source_observed_at": emitted_at,
        "emitted_at": emitted_at, "lag_ms": 1,
    }])


def files(store: TableStore, table: str) -> int:
    return len(DeltaTable(store.uri(table)).file_uris())


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def store(tmp_path: Path) -> TableStore:
    return open_store("delta-rs", str(tmp_path / "tables"))


def maintenance(store: TableStore, clock: Clock, metrics: Metrics | None = None,
                **settings: Any) -> TableMaintenance:
    config = TablesConfig(path=store.root, **settings)
    return TableMaintenance(store, ("sync_progress",), config, metrics, clock=clock,
                            now=lambda: NOW)


def test_the_interval_expires_old_rows_but_each_keys_newest_then_compacts(
        store: TableStore) -> None:
    clock, metrics = Clock(), Metrics()
    m = maintenance(store, clock, metrics, maintenance_interval_s=60,
                    sync_progress_retention_s=86400, compact_every_batches=0)
    old, recent = NOW - timedelta(days=3), NOW - timedelta(hours=1)
    for batch, (sub, at) in enumerate([("s1", old), ("s1", old), ("s1", recent),
                                       ("s2", old)]):
        store.append("sync_progress", progress(sub, at), app_id="sync", batch_id=batch)
    assert files(store, "sync_progress") == 4

    assert not m.run_if_due()  # the first run comes one interval after start
    clock.t += 61
    assert m.run_if_due()

    rows = store.read("sync_progress").to_pylist()
    # s1's two old rows go; s2's only row is old but its newest, so it stays.
    assert sorted((r["subscription"], r["emitted_at"]) for r in rows) == [
        ("s1", recent), ("s2", old)]
    assert files(store, "sync_progress") == 1
    assert sample(metrics, "cursorsync_table_rows_expired_total", table="sync_progress") == 2
    assert sample(metrics, "cursorsync_table_maintenance_timestamp_seconds",
                  table="sync_progress")
    assert not m.run_if_due()  # the next one is an interval away again


def test_every_n_batches_compacts_between_intervals_and_keeps_every_row(
        store: TableStore) -> None:
    clock = Clock()
    m = maintenance(store, clock, maintenance_interval_s=3600, compact_every_batches=5)
    ran = []
    for batch in range(12):
        store.append("sync_progress", progress("s1", NOW, partition=batch), app_id="sync",
                     batch_id=batch)
        ran.append(m.run_if_due())
    assert ran == [False] * 4 + [True] + [False] * 4 + [True] + [False] * 2
    assert files(store, "sync_progress") == 3  # one after the 10th batch, two appended since
    assert sorted(store.read("sync_progress").column("partition").to_pylist()) == list(
        range(12))


def test_a_failing_maintenance_is_counted_and_tried_again(
        store: TableStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    clock, metrics = Clock(), Metrics()
    m = maintenance(store, clock, metrics, maintenance_interval_s=60, compact_every_batches=2)
    store.append("sync_progress", progress("s1", NOW), app_id="sync", batch_id=0)

    def broken(table: str) -> dict[str, Any]:
        raise OSError(f"disk full under {table}")

    monkeypatch.setattr(store, "compact", broken)
    assert not m.run_if_due()
    assert m.run_if_due()  # the compaction fails: logged, counted, the sync goes on
    clock.t += 61
    assert m.run_if_due()  # so does the interval's run
    assert sample(metrics, "cursorsync_errors_total", stage="tables") == 2
    assert "compaction of table sync_progress failed" in caplog.text
    assert "maintenance of table sync_progress failed" in caplog.text
    assert "disk full under sync_progress" in caplog.text


def test_merging_mappings_rows_keeps_every_reader_s_union_in_fewer_rows(tmp_path: Path) -> None:
    """Five batches continue one run (five rows); merged, it is one row with the newest
    written_at and the highest batch id. Every mapping loads the same before and after,
    for a full load and for an incremental reader that had read part of it; rows written
    after the cut and other cluster pairs' rows stay apart."""
    from cursorsync.core.anchors import Anchors
    from cursorsync.core.positions import Position
    from cursorsync.core.records import PartitionKey
    from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
    from cursorsync.tables.mappings_table import MappingStore, load_mappings, merge_rows
    from cursorsync.tables.rows import mapping_rows

    store = open_store("delta-rs", str(tmp_path / "t"))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    key, other = PartitionKey("persistent://t/n/a", 0), PartitionKey("persistent://t/n/a", 1)

    def write(batch: int, k: PartitionKey, m: TopicMapping, pair: tuple[str, str] = ("A", "B"),
              at: datetime | None = None) -> None:
        store.append("mappings", mapping_rows(
            k, m, source_cluster=pair[0], target_cluster=pair[1],
            written_at=at or t0 + timedelta(seconds=batch)), app_id="mapping", batch_id=batch)

    for i in range(5):
        write(i, key, TopicMapping(SegmentSet.of([Segment(3, 10 * i, 7, 10 * i, 10)]),
                                   skippable=Runs.of((7, 50 + i, 1)) if i == 4 else Runs(),
                                   anchors=Anchors.of((Position(3, 10 * i), Position(7, 9)))))
    write(5, other, TopicMapping(SegmentSet.of([Segment(4, 0, 8, 0, 5, "identity")])))
    write(6, key, TopicMapping(SegmentSet.of([Segment(3, 0, 9, 0, 10)])), pair=("A", "C"))
    incremental = MappingStore(store, "A", "B")
    incremental.refresh()
    before_all, _ = load_mappings(store, source_cluster="A", target_cluster="B")
    cut = t0 + timedelta(seconds=6.5)
    write(7, key, TopicMapping(SegmentSet.of([Segment(3, 50, 7, 50, 10)])), at=cut)
    rows_before = store.read("mappings").num_rows

    assert merge_rows(store, before=cut) == 4  # five segment rows are one; anchors differ
    after = store.read("mappings")
    assert after.num_rows == rows_before - 4
    mine = [r for r in after.to_pylist() if r["source_cluster"] == "A"
            and r["target_cluster"] == "B" and r["partition"] == 0 and r["kind"] == "segment"]
    assert sorted((r["source_entry"], r["count"], r["batch_id"]) for r in mine) == [
        (0, 50, 4), (50, 10, 7)]
    full, _ = load_mappings(store, source_cluster="A", target_cluster="B")
    assert full[key].segments == SegmentSet.of([Segment(3, 0, 7, 0, 60)])
    assert full[key].anchors == before_all[key].anchors and len(full[key].anchors) == 5
    assert full[other] == before_all[other]
    assert load_mappings(store, source_cluster="A", target_cluster="C")[0][key].segments == \
        SegmentSet.of([Segment(3, 0, 9, 0, 10)])
    assert incremental.refresh()[key].segments == full[key].segments
    assert merge_rows(store, before=cut) == 0  # nothing left to merge


def test_live_rows_drop_rows_about_deleted_ledgers_for_readers_and_the_merge(
        tmp_path: Path) -> None:
    """A partition's mapping names ledgers 1 (source) and 10 (target), since deleted, and 2
    and 11. Once a live row says the first live ledgers are 2 and 11, every reader loads
    only what names them, and the merge keeps only those rows, with one live row holding
    the highest first ledger of each side (a later row that knows less changes nothing)."""
    from cursorsync.core.anchors import Anchors
    from cursorsync.core.positions import Position
    from cursorsync.core.records import PartitionKey
    from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
    from cursorsync.tables.mappings_table import load_mappings, merge_rows
    from cursorsync.tables.rows import mapping_rows

    store = open_store("delta-rs", str(tmp_path / "t"))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    key = PartitionKey("persistent://t/n/a", 0)

    def write(batch: int, m: TopicMapping, live: tuple[int | None, int | None] | None = None,
              ) -> None:
        store.append("mappings", mapping_rows(
            key, m, source_cluster="A", target_cluster="B", live=live,
            written_at=t0 + timedelta(seconds=batch)), app_id="mapping", batch_id=batch)

    whole = TopicMapping(
        SegmentSet.of([Segment(1, 0, 10, 0, 5), Segment(2, 0, 11, 0, 5)]),
        skippable=Runs.of((10, 5, 1), (11, 5, 1)), unreplicated=Runs.of((1, 7, 1), (2, 7, 1)),
        anchors=Anchors.of((Position(1, 4), Position(10, 4)), (Position(2, 4), Position(11, 4))))
    write(0, whole)
    first = load_mappings(store, source_cluster="A", target_cluster="B")[0][key]
    assert first == replace(whole, written_at=first.written_at)
    write(1, TopicMapping(), live=(2, 11))
    write(2, TopicMapping(SegmentSet.of([Segment(2, 5, 11, 6, 3)])), live=(1, None))
    live = TopicMapping(
        SegmentSet.of([Segment(2, 0, 11, 0, 5), Segment(2, 5, 11, 6, 3)]),
        skippable=Runs.of((11, 5, 1)), unreplicated=Runs.of((2, 7, 1)),
        anchors=Anchors.of((Position(2, 4), Position(11, 4))))
    loaded = load_mappings(store, source_cluster="A", target_cluster="B")[0][key]
    assert loaded == replace(live, written_at=loaded.written_at)

    assert merge_rows(store, before=t0 + timedelta(seconds=10)) == 11 - 6
    rows = store.read("mappings").to_pylist()
    assert sorted((r["kind"], r["source_ledger"], r["target_ledger"]) for r in rows) == [
        ("anchor", 2, 11), ("live", 2, 11), ("segment", 2, 11), ("segment", 2, 11),
        ("skippable", None, 11), ("unreplicated", 2, None)]
    merged = load_mappings(store, source_cluster="A", target_cluster="B")[0][key]
    assert merged == loaded
