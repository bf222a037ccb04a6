"""The sync sink's metrics: a batch's rows added up per subscription give what recording
each row on its own gives."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cursorsync.app.metrics import Metrics
from cursorsync.app.queries import sync_sink_settings
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey, SyncRecord
from cursorsync.sync.sink import SyncSink, _Synced
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.tables import open_store
from cursorsync.tables.rows import sync_progress_rows
from tests.support.metrics_text import sample
from tests.support.sink_world import (
    T0,
    RecordingEmitter,
    new_sink,
    polled,
    sink_config,
    store_with_mapping,
)

T = datetime(2026, 11, 26, tzinfo=UTC)
PLAN = AckPlan(Position(7, 9), RangeSet(), RangeSet(), Position(7, 9), 0, 0, 0, 0, "exact")


def _record(key: PartitionKey, sub: str, *, result: str = "emitted", acks: int = 0,
            unmapped: int = 0, rewound: int = 0, lag_s: float = 1.0) -> SyncRecord:
    plan = replace(PLAN, unmapped_acked_entries=unmapped, rewound_entries=rewound)
    return SyncRecord(key, sub, plan, acks, False, T, T + timedelta(seconds=lag_s),
                      result)  # type: ignore[arg-type]


def test_a_batch_is_recorded_per_subscription_as_its_rows_add_up(tmp_path: Path) -> None:
    config = sink_config(tmp_path)
    metrics = Metrics()
    sink = SyncSink(sync_sink_settings(config), open_store("delta-rs", config.tables.path),
                    SyncStep(StepSettings(), None, lambda t, s: None), metrics)
    topic = "persistent://t/n/orders"
    first = [
        _record(PartitionKey(topic, 0), "billing", acks=3, unmapped=4, lag_s=0.5),
        _record(PartitionKey(topic, 1), "billing", acks=2, unmapped=6, lag_s=30.0),
        _record(PartitionKey(topic, 2), "billing", result="refused"),
        _record(PartitionKey(topic, 0), "audit", result="halted", rewound=5),
        _record(PartitionKey(topic, 1), "audit", result="failed"),
    ]
    rows = sync_progress_rows(first, source_cluster="A", target_cluster="B")
    sink._record(_Synced([], rows, 0.01, unavailable=2), 1.5)
    assert sample(metrics, "cursorsync_sync_outcomes_total", subscription="billing",
                  result="emitted") == 2
    assert sample(metrics, "cursorsync_sync_outcomes_total", subscription="billing",
                  result="refused") == 1
    for result in ("halted", "failed"):
        assert sample(metrics, "cursorsync_sync_outcomes_total", subscription="audit",
                      result=result) == 1
    assert sample(metrics, "cursorsync_acks_sent_total", subscription="billing",
                  kind="individual") == 5
    assert sample(metrics, "cursorsync_unmapped_acked_entries", subscription="billing") == 10
    assert sample(metrics, "cursorsync_rewound_entries_total", subscription="audit") == 5
    for stage, count in (("guard", 1), ("emit", 1), ("admin", 2)):
        assert sample(metrics, "cursorsync_errors_total", stage=stage) == count
    # Lags of the plans emitted only; a subscription with none is not marked synced.
    assert sample(metrics, "cursorsync_sync_lag_seconds_count", subscription="billing") == 2
    assert sample(metrics, "cursorsync_sync_lag_seconds_sum", subscription="billing") == 30.5
    assert sample(metrics, "cursorsync_sync_lag_seconds_count", subscription="audit") is None
    assert sample(metrics, "cursorsync_last_successful_sync_timestamp_seconds",
                  subscription="billing") is not None
    assert sample(metrics, "cursorsync_last_successful_sync_timestamp_seconds",
                  subscription="audit") is None
    # The next batch: partition 0 mapped, 1 still waiting; the gauge is the sum per topic.
    second = [_record(PartitionKey(topic, 0), "billing"),
              _record(PartitionKey(topic, 1), "billing", unmapped=7)]
    # Idle cursors whose rows are not written this batch count by their lags alone.
    rows = sync_progress_rows(second, source_cluster="A", target_cluster="B")
    sink._record(_Synced([], rows, None, unchanged_lags={"billing": [0.5, 1.5],
                                                          "audit": [2.0]}), 1.0)
    assert sample(metrics, "cursorsync_unmapped_acked_entries", subscription="billing") == 7
    assert sample(metrics, "cursorsync_sync_outcomes_total", subscription="billing",
                  result="emitted") == 6
    assert sample(metrics, "cursorsync_sync_outcomes_total", subscription="audit",
                  result="emitted") == 1
    assert sample(metrics, "cursorsync_sync_lag_seconds_count", subscription="billing") == 6
    assert sample(metrics, "cursorsync_sync_lag_seconds_sum", subscription="billing") == 34.5
    assert sample(metrics, "cursorsync_last_successful_sync_timestamp_seconds",
                  subscription="audit") is not None


def test_a_dry_run_is_counted_as_dry_run_and_never_as_synced(tmp_path: Path) -> None:
    """A job in dry-run acks nothing: its plans count as dry_run, and neither its rows nor
    its idle cursors observe a sync lag or move the last successful sync, so the stale and
    lag alerts see what is true: nothing was synced."""
    config = sink_config(tmp_path)
    metrics = Metrics()
    sink = SyncSink(sync_sink_settings(config), open_store("delta-rs", config.tables.path),
                    SyncStep(StepSettings(dry_run=True), None, lambda t, s: None), metrics)
    key = PartitionKey("persistent://t/n/orders", 0)
    record = SyncRecord(key, "billing", PLAN, 0, True, T, T + timedelta(seconds=1), "emitted")
    rows = sync_progress_rows([record], source_cluster="A", target_cluster="B")
    sink._record(_Synced([], rows, 0.01, unchanged_lags={"billing": [0.5]}), 1.0)
    assert sample(metrics, "cursorsync_sync_outcomes_total", subscription="billing",
                  result="dry_run") == 2
    assert sample(metrics, "cursorsync_sync_outcomes_total", subscription="billing",
                  result="emitted") is None
    assert sample(metrics, "cursorsync_sync_lag_seconds_count", subscription="billing") is None
    assert sample(metrics, "cursorsync_last_successful_sync_timestamp_seconds",
                  subscription="billing") is None


def test_failover_readiness_follows_each_partitions_last_row(tmp_path: Path) -> None:
    """A subscription is ready for a failover once every partition it has rows for had an
    exact last sync with nothing unmapped; a partition whose rows are not written again
    (unchanged) keeps what its last row said."""
    config = sink_config(tmp_path)
    metrics = Metrics()
    sink = SyncSink(sync_sink_settings(config), open_store("delta-rs", config.tables.path),
                    SyncStep(StepSettings(), None, lambda t, s: None), metrics)
    topic = "persistent://t/n/orders"

    def batch(*records: SyncRecord) -> None:
        rows = sync_progress_rows(list(records), source_cluster="A", target_cluster="B")
        sink._record(_Synced([], rows, None), 1.0)

    def ready(sub: str) -> float | None:
        return sample(metrics, "cursorsync_failover_ready", subscription=sub)

    batch(_record(PartitionKey(topic, 0), "billing"),
          _record(PartitionKey(topic, 1), "billing", unmapped=3),
          _record(PartitionKey(topic, 0), "audit", result="refused"))
    assert (ready("billing"), ready("audit")) == (0, 0)
    batch(_record(PartitionKey(topic, 1), "billing"))  # partition 0 unchanged: still exact
    assert ready("billing") == 1
    batch(_record(PartitionKey(topic, 0), "audit"))
    assert ready("audit") == 1
    batch(_record(PartitionKey(topic, 0), "billing", result="halted"))
    assert ready("billing") == 0


def test_each_batch_observes_its_phases_with_the_steps_parts(tmp_path: Path) -> None:
    """Where a batch's time goes: every phase of the driver path is observed once per batch,
    with the step's parts (target reads, translation, emission) inside the step."""
    config = sink_config(tmp_path)
    store = store_with_mapping(config)
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    metrics = Metrics()
    step = new_sink(config, store, RecordingEmitter(), target, None).step
    sink = SyncSink(sync_sink_settings(config), store, step, metrics)
    sink(polled("5:9", T0), 0)
    sink(polled("5:12", T0 + timedelta(seconds=1)), 1)
    phases = {"halts", "collect", "refresh", "parse", "step", "step:targets",
              "step:translate", "step:emit", "rows", "write", "metrics", "collector"}
    assert set(sink.timings) == phases
    for phase in phases:
        assert sample(metrics, "cursorsync_batch_phase_seconds_count", query="sync",
                      phase=phase) == 2, phase
    parts = sum(sink.timings[p] for p in ("step:targets", "step:translate", "step:emit"))
    assert parts <= sink.timings["step"]
    # And of each phase's seconds, the CPU seconds of the batch's thread: a counter per
    # phase, added up over the batches, no more than the phase's seconds.
    assert set(sink.cpu) == phases
    for phase in phases:
        assert 0 <= sink.cpu[phase] <= sink.timings[phase] + 0.01, phase
        total = sample(metrics, "cursorsync_batch_phase_cpu_seconds_total", query="sync",
                       phase=phase)
        assert total is not None and total >= sink.cpu[phase], phase
    assert sink.cpu["step:translate"] > 0  # both batches planned a moved cursor
