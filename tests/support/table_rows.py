"""Rows for the table tests: mappings, cursor states and progress rows, made by hand."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from cursorsync.tables import (
    RowFilter,
    TableStore,
)

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


def _rows_of(store: TableStore, table: str, flt: RowFilter | None = None) -> int:
    return store.read(table, flt).num_rows  # type: ignore[arg-type]
