"""Table maintenance on its schedule, on a real delta-rs store: the interval runs expiry,
compaction and vacuum; the batch count compacts between runs; a failure never stops the
sync."""

from __future__ import annotations

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
