"""A cursor that does not change writes its ``cursor_states`` and ``sync_progress`` rows
every ``tables.unchanged_rows_every_batches`` batches, not every batch; the metrics count it
every batch; a retried batch and a restart write every cursor's rows."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import pytest

from cursorsync.app.metrics import Metrics
from cursorsync.app.settings.runtime import TablesConfig
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.sync.observed import RECENT_BATCHES
from cursorsync.sync.sink import history_due
from cursorsync.tables import TableStore
from tests.support.sink_world import (
    KEY,
    T0,
    RecordingEmitter,
    new_sink,
    polled,
    sink_config,
    store_with_mapping,
)

EVERY = 5


def _batches(store: TableStore, table: str) -> list[int]:
    return sorted(r["batch_id"] for r in store.read(table, columns=["batch_id"]).to_pylist())


def _target(md: int) -> list[CursorState]:
    return [CursorState(Position(7, md), ledgers=Ledgers.of([(7, 20)]))]


def test_an_unchanged_cursor_writes_its_rows_every_nth_batch(tmp_path: Path) -> None:
    config = sink_config(tmp_path, unchanged_rows_every_batches=EVERY)
    store = store_with_mapping(config)
    target = _target(-1)
    emitter = RecordingEmitter()
    sink = new_sink(config, store, emitter, target)
    sink.metrics = Metrics()
    sink(polled("5:9", T0), 0)
    target[:] = _target(9)  # the acks arrived
    for b in range(1, 21):
        sink(polled("5:9", T0 + timedelta(seconds=b)), b)
    progress = _batches(store, "sync_progress")
    # Batch 0 sent the acks; batch 1 read the target again and found nothing to send; from
    # batch 2 on the cursor is idle, and its rows come once every EVERY batches.
    assert progress[:2] == [0, 1] and len(emitter.sent) == 1
    later = progress[2:]
    assert later == [b for b in range(2, 21) if history_due(KEY, "billing", b, EVERY)]
    assert len(later) == 4 and {b - a for a, b in itertools.pairwise(later)} == {EVERY}
    assert _batches(store, "cursor_states") == progress
    outcomes = sink.metrics.registry.get_sample_value(
        "cursorsync_sync_outcomes_total", {"subscription": "billing", "result": "emitted"})
    assert outcomes == 21  # every batch, written or not
    lags = sink.metrics.registry.get_sample_value(
        "cursorsync_sync_lag_seconds_count", {"subscription": "billing"})
    assert lags == 21
    # Idle since batch 2, kept in columns: most batches repeated it in bulk.
    assert sink.metrics.registry.get_sample_value("cursorsync_sync_idle_cursors") == 1
    assert len(sink.idle) == 1

    # The source moves: its rows are written at once.
    sink(polled("5:12", T0 + timedelta(seconds=30)), 21)
    assert _batches(store, "sync_progress")[-1] == 21
    assert _batches(store, "cursor_states")[-1] == 21


def test_a_retried_batch_and_a_restart_write_every_cursor_s_rows(tmp_path: Path) -> None:
    config = sink_config(tmp_path, unchanged_rows_every_batches=EVERY)
    store = store_with_mapping(config)
    target = _target(9)
    sink = new_sink(config, store, RecordingEmitter(), target)
    for b in range(3):
        sink(polled("5:9", T0 + timedelta(seconds=b)), b)
    quiet = next(b for b in range(3, 3 + EVERY) if not history_due(KEY, "billing", b, EVERY))

    def fail(batch_id: int) -> None:
        raise RuntimeError("the batch fails after its acks, before its rows")

    for b in range(3, quiet):
        sink(polled("5:9", T0 + timedelta(seconds=b)), b)
    sink.crash_after_emit = fail
    with pytest.raises(RuntimeError):
        sink(polled("5:9", T0 + timedelta(seconds=quiet)), quiet)
    sink.crash_after_emit = None
    sink(polled("5:9", T0 + timedelta(seconds=quiet)), quiet)  # Spark runs it again
    assert _batches(store, "sync_progress")[-1] == quiet
    restarted = new_sink(config, store, RecordingEmitter(), target)
    nxt = next(b for b in range(quiet + 1, quiet + 1 + EVERY)
               if not history_due(KEY, "billing", b, EVERY))
    restarted(polled("5:9", T0 + timedelta(seconds=nxt)), nxt)
    assert _batches(store, "sync_progress")[-1] == nxt


def test_a_restart_finds_every_cursor_s_newest_row() -> None:
    """The newest row of an unchanged cursor is among the batches a restart reads."""
    top = TablesConfig.model_fields["unchanged_rows_every_batches"].metadata
    assert any(getattr(m, "le", RECENT_BATCHES) < RECENT_BATCHES for m in top)
