"""``cursorsync-dev bench replay``: a run's sync batches replayed from its tables, each with
the mappings written by then and the targets the batches before left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.errors import ConfigError
from cursorsync.tables import open_store
from cursorsync.tables.rows import cursor_state_rows, mappings_rows, row_schema
from cursorsync_devtools.bench_replay import bench_replay

T0 = datetime(2026, 12, 1, tzinfo=UTC)
KEYS = [PartitionKey("persistent://t/ns/orders", p) for p in range(3)]
SUB = "billing"


def _progress(batch: int, target_md: int) -> pa.Table:
    """The sync_progress rows of one batch: each target acked up to ``20:target_md``."""
    schema = row_schema("sync_progress")
    n = len(KEYS)
    values = {"topic": [k.topic for k in KEYS], "partition": [k.partition for k in KEYS],
              "subscription": [SUB] * n, "source_cluster": ["a"] * n,
              "target_cluster": ["b"] * n, "target_mark_delete_ledger": [20] * n,
              "target_mark_delete_entry": [target_md] * n,
              "previous_target_mark_delete_ledger": [20] * n,
              "previous_target_mark_delete_entry": [-1] * n, "acked_ranges": ["[]"] * n,
              "outcome": ["exact"] * n, "dry_run": [False] * n,
              "source_observed_at": [T0] * n, "emitted_at": [T0] * n}
    return pa.table({f.name: pa.array(values.get(f.name, [0] * n), f.type) for f in schema},
                    schema=schema)


def _write_run(root: Path) -> str:
    """Three partitions, source ledger 10 copied to target ledger 20: entries 0-49 mapped
    by the first mapping batch, 50-99 by the second; the sync's batch 0 sees the source at
    10:59 before the second, its batch 1 at 10:79 after it."""
    store = open_store("delta-rs", str(root))
    for b, (first, at) in enumerate([(0, T0), (50, T0 + timedelta(seconds=10))]):
        mapping = TopicMapping(SegmentSet.of([Segment(10, first, 20, first, 50)]))
        store.append("mappings", mappings_rows([(k, mapping, None) for k in KEYS],
                                               source_cluster="a", target_cluster="b",
                                               written_at=at),
                     app_id="m", batch_id=b)
    for b, (md, at) in enumerate([(59, T0 + timedelta(seconds=5)),
                                  (79, T0 + timedelta(seconds=15))]):
        obs = [ObservedCursor(k, SUB, CursorState(Position(10, md),
                                                  ledgers=Ledgers.of([(10, 100)])), at)
               for k in KEYS]
        store.append("cursor_states", cursor_state_rows(obs, source_cluster="a",
                                                        target_cluster="b"),
                     app_id="s", batch_id=b)
    # As the job recorded: batch 0 acked the target up to 20:49, all the mapping had then.
    store.append("sync_progress", _progress(0, 49), app_id="s", batch_id=0)
    store.append("sync_progress", _progress(1, 79), app_id="s", batch_id=1)
    return str(root)


def test_each_batch_is_planned_with_the_mappings_and_targets_of_its_time(
        tmp_path: Path) -> None:
    out = bench_replay(_write_run(tmp_path))
    assert (out["batches"], out["cursors_planned"]) == (2, 6)
    first, second = out["per_batch"]
    # Batch 0: the mapping reaches 10:49 though the source is acked to 10:59: 50 entries
    # each. Batch 1: from the target's 20:49 to the source's 10:79, all mapped by then.
    assert first["acks_planned_entries"] == 3 * 50
    assert second["acks_planned_entries"] == 3 * 30
    assert out["step_seconds"] > 0 and out["milliseconds_per_cursor"] > 0
    shares = out["share_of_step_by_part"]
    assert 0 < shares["translate"] <= shares["plan"] <= 1
    assert 0 < shares["guard"] < 1


def test_one_batch_of_the_run(tmp_path: Path) -> None:
    out = bench_replay(_write_run(tmp_path), first=1)
    # Alone, batch 1 plans from scratch: the target is read as never acked.
    assert [b["batch_id"] for b in out["per_batch"]] == [1]
    assert out["per_batch"][0]["acks_planned_entries"] == 3 * 80


def test_not_a_runs_tables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        bench_replay(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no mappings, cursor_states, sync_progress table"):
        bench_replay(str(tmp_path))
    with pytest.raises(ConfigError, match=r"no sync batch in 5\.\.None"):
        bench_replay(_write_run(tmp_path / "run"), first=5)
