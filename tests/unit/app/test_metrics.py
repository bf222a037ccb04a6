"""Metrics: values reach the exposition text, the HTTP endpoint, and a real Prometheus."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cursorsync.app.metrics import Metrics
from cursorsync.app.settings import MetricsConfig
from cursorsync_devtools.testbed.standalone import free_port
from tests.support.metrics_text import sample

# --------------------------------------------------------------------------- exposition


def test_every_metric_appears_with_its_labels() -> None:
    m = Metrics()
    m.record_entries_ingested("B", 120)
    m.record_entries_ingested("B", 5)
    m.record_segments_written(3, evidence="identity")
    m.record_skipped_ids(claimed=4, unclaimed=2, mapped=3)
    m.observe_sync_lag("billing", 2.5)
    m.record_acks("billing", "individual", 7)
    m.record_acks("billing", "cumulative")
    m.set_unmapped_acked("billing", "persistent://t/ns/a", 4)
    m.record_rewound("billing", 9)
    m.observe_translation(0.003)
    m.observe_batch("sync", 1.2)
    m.observe_batch_phases("mapping", {"read": 0.7, "build": 0.2}, cpu={"build": 0.15})
    m.observe_batch_phases("mapping", {"read": 0.3, "build": 0.4}, cpu={"build": 0.25})
    m.mark_synced("billing", at=1_700_000_000.0)
    m.record_error("emit")
    m.record_error("emit")

    assert sample(m, "cursorsync_mapping_entries_ingested_total", cluster="B") == 125
    assert sample(m, "cursorsync_segments_written_total", evidence="identity") == 3
    assert sample(m, "cursorsync_skipped_target_ids_total", outcome="claimed") == 4
    assert sample(m, "cursorsync_skipped_target_ids_total", outcome="unclaimed") == 2
    assert sample(m, "cursorsync_skipped_target_ids_total", outcome="mapped") == 3
    assert sample(m, "cursorsync_sync_lag_seconds_count", subscription="billing") == 1
    assert sample(m, "cursorsync_sync_lag_seconds_sum", subscription="billing") == 2.5
    assert sample(m, "cursorsync_sync_lag_seconds_bucket", subscription="billing", le="2.0") == 0
    assert sample(m, "cursorsync_sync_lag_seconds_bucket", subscription="billing", le="5.0") == 1
    assert sample(m, "cursorsync_acks_sent_total", subscription="billing", kind="individual") == 7
    assert sample(m, "cursorsync_acks_sent_total", subscription="billing", kind="cumulative") == 1
    assert sample(m, "cursorsync_unmapped_acked_entries", subscription="billing") == 4
    assert sample(m, "cursorsync_rewound_entries_total", subscription="billing") == 9
    assert sample(m, "cursorsync_translation_seconds_count") == 1
    assert sample(m, "cursorsync_batch_duration_seconds_count", query="sync") == 1
    assert sample(m, "cursorsync_batch_phase_seconds_sum", query="mapping", phase="read") == 1.0
    assert sample(m, "cursorsync_batch_phase_seconds_count", query="mapping",
                  phase="build") == 2
    assert sample(m, "cursorsync_batch_phase_cpu_seconds_total", query="mapping",
                  phase="build") == 0.4
    assert sample(m, "cursorsync_batch_phase_cpu_seconds_total", query="mapping",
                  phase="read") is None
    assert sample(m, "cursorsync_last_successful_sync_timestamp_seconds",
                  subscription="billing") == 1_700_000_000.0
    assert sample(m, "cursorsync_errors_total", stage="emit") == 2


def test_no_metric_has_a_topic_label_and_all_are_prefixed() -> None:
    m = Metrics()
    m.set_unmapped_acked("billing", "persistent://t/ns/a", 1)
    m.observe_progress({"name": "q", "numInputRows": 1, "durationMs": {"addBatch": 5}})
    families = list(text_string_to_metric_families(m.exposition()))
    assert len(families) >= 15
    for family in families:
        assert family.name.startswith("cursorsync_")
        for s in family.samples:
            assert "topic" not in s.labels
    assert "persistent://" not in m.exposition()


def test_registries_are_independent() -> None:
    first, second = Metrics(), Metrics()  # would raise "Duplicated timeseries" if global
    first.record_error("admin")
    assert sample(first, "cursorsync_errors_total", stage="admin") == 1
    assert sample(second, "cursorsync_errors_total", stage="admin") is None


def test_unmapped_gauge_sums_topics_of_a_subscription() -> None:
    m = Metrics()
    m.set_unmapped_acked("billing", "persistent://t/ns/a", 4)
    m.set_unmapped_acked("billing", "persistent://t/ns/b", 6)
    m.set_unmapped_acked("audit", "persistent://t/ns/a", 1)
    assert sample(m, "cursorsync_unmapped_acked_entries", subscription="billing") == 10
    m.set_unmapped_acked("billing", "persistent://t/ns/a", 0)
    assert sample(m, "cursorsync_unmapped_acked_entries", subscription="billing") == 6
    assert sample(m, "cursorsync_unmapped_acked_entries", subscription="audit") == 1


def test_skipped_ids_waiting_add_up_per_subscription_and_fall_to_zero() -> None:
    """The mapping's skipped ids waiting for their check, per topic partition, reach each
    subscription synced there; one that has none waiting any more reads 0, not its old
    value."""
    from cursorsync.core.records import PartitionKey
    from cursorsync.pulsar.selection import Selection, TopicRule

    selection = Selection((TopicRule("persistent://t/ns/a", ("billing", "audit")),
                           TopicRule("persistent://t/ns/b", ("billing",))), ())
    m = Metrics(subscriptions_of=selection.subscriptions_of)
    a0, a1 = PartitionKey("persistent://t/ns/a", 0), PartitionKey("persistent://t/ns/a", 1)
    b = PartitionKey("persistent://t/ns/b", -1)
    m.set_skipped_waiting({a0: 3, a1: 4, b: 10})
    assert sample(m, "cursorsync_skipped_target_ids_waiting") == 17
    waiting = "cursorsync_skipped_target_ids_waiting_by_subscription"
    assert sample(m, waiting, subscription="billing") == 17
    assert sample(m, waiting, subscription="audit") == 7
    m.set_skipped_waiting({b: 2})
    assert sample(m, waiting, subscription="billing") == 2
    assert sample(m, waiting, subscription="audit") == 0
    m.set_skipped_waiting({})
    assert sample(m, "cursorsync_skipped_target_ids_waiting") == 0
    assert sample(m, waiting, subscription="billing") == 0


def test_timers_record_even_when_the_block_fails() -> None:
    m = Metrics()
    with m.time_translation():
        pass
    with pytest.raises(RuntimeError), m.time_batch("mapping"):
        raise RuntimeError("batch failed")
    assert sample(m, "cursorsync_translation_seconds_count") == 1
    assert sample(m, "cursorsync_batch_duration_seconds_count", query="mapping") == 1


def test_bad_labels_and_counts_are_refused() -> None:
    m = Metrics()
    with pytest.raises(ValueError, match=r"'batch' is not a valid ack kind\. Valid values are: "
                                         r"cumulative, individual"):
        m.record_acks("billing", "batch", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not a valid stage"):
        m.record_error("Connection refused to 10.0.0.1")
    with pytest.raises(ValueError, match=r"count must be >= 0, got -1"):
        m.record_entries_ingested("A", -1)


def test_observe_progress_records_spark_progress() -> None:
    m = Metrics()
    progress = {
        "id": "8c1f", "name": "cursorsync-sync", "batchId": 12, "numInputRows": 340,
        "inputRowsPerSecond": 110.5, "processedRowsPerSecond": 97.25,
        "durationMs": {"addBatch": 1500, "triggerExecution": 1750, "latestOffset": 3},
        "sources": [],
    }
    m.observe_progress(progress)
    q = {"query": "cursorsync-sync"}
    assert sample(m, "cursorsync_query_input_rows", **q) == 340
    assert sample(m, "cursorsync_query_processed_rows_per_second", **q) == 97.25
    assert sample(m, "cursorsync_query_input_rows_per_second", **q) == 110.5
    assert sample(m, "cursorsync_query_batch_id", **q) == 12
    assert sample(m, "cursorsync_query_duration_seconds", operation="triggerExecution",
                  **q) == 1.75
    # an explicit name wins, the id is the fallback; missing values leave gauges alone
    m.observe_progress({"id": "8c1f", "numInputRows": 1})
    assert sample(m, "cursorsync_query_input_rows", query="8c1f") == 1
    m.observe_progress({"numInputRows": 2, "processedRowsPerSecond": None}, query="cursorsync-sync")
    assert sample(m, "cursorsync_query_input_rows", **q) == 2
    assert sample(m, "cursorsync_query_processed_rows_per_second", **q) == 97.25


# --------------------------------------------------------------------------- HTTP endpoint


def test_http_endpoint_serves_the_registry() -> None:
    m = Metrics()
    m.record_acks("billing", "individual", 3)
    with m.start_http_server(0) as server:
        assert server.host == "127.0.0.1" and server.port > 0
        response = httpx.get(server.url, timeout=5)
        assert response.status_code == 200
        assert 'cursorsync_acks_sent_total{kind="individual",subscription="billing"} 3.0' \
            in response.text
        m.record_acks("billing", "individual", 1)
        assert 'subscription="billing"} 4.0' in httpx.get(server.url, timeout=5).text
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url, timeout=2)


def test_serve_follows_the_config() -> None:
    m = Metrics()
    assert m.serve(MetricsConfig(port=0)) is None
    port = free_port()
    server = m.serve(MetricsConfig(port=port, host="127.0.0.1"))
    assert server is not None
    try:
        assert server.port == port
        assert httpx.get(server.url, timeout=5).status_code == 200
    finally:
        server.stop()


def test_port_in_use_is_named() -> None:
    m = Metrics()
    with m.start_http_server(0) as server, pytest.raises(OSError, match=
                                                         rf"127\.0\.0\.1:{server.port}"):
        m.start_http_server(server.port)


# --------------------------------------------------------------------------- real Prometheus


@pytest.fixture
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("the prometheus binary is not installed (apt-get install -y prometheus)")
    return path


@pytest.fixture
def served_metrics() -> Iterator[tuple[Metrics, int]]:
    m = Metrics()
    server = m.start_http_server(0)
    try:
        yield m, server.port
    finally:
        server.stop()


def test_real_prometheus_scrapes_our_endpoint(
    prometheus_binary: str, served_metrics: tuple[Metrics, int], tmp_path: Path
) -> None:
    metrics, target_port = served_metrics
    metrics.record_acks("billing", "individual", 42)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: cursorsync\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
    )
    web_port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [prometheus_binary, f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{web_port}", "--log.level=warn"],
            stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        api = f"http://127.0.0.1:{web_port}/api/v1/query"
        deadline = time.monotonic() + 25
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = httpx.get(api, params={"query": "cursorsync_acks_sent_total"},
                                 timeout=2).json()
                result = body["data"]["result"]
            except (httpx.TransportError, ValueError, KeyError):
                result = []
            if result:
                break
            time.sleep(0.3)
        assert result, (f"no scrape within 25 s (exit code {proc.poll()}); "
                        f"prometheus log:\n{log.read_text()[-2000:]}")
        (series,) = result
        assert series["metric"] == {
            "__name__": "cursorsync_acks_sent_total", "instance": f"127.0.0.1:{target_port}",
            "job": "cursorsync", "kind": "individual", "subscription": "billing",
        }
        assert float(series["value"][1]) == 42  # type: ignore[index]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_named_subscriptions_start_their_sync_clock_at_the_jobs_start() -> None:
    """A subscription never synced after a start has a last sync (the start), so the stale
    alert fires for it as for one whose syncs stopped; one synced keeps its time, also
    across an in-process restart."""
    m = Metrics()
    m.mark_synced("billing", at=1_700_000_500.0)
    m.start_sync_clocks(["billing", "orders", "*"], at=1_700_000_000.0)
    stamp = "cursorsync_last_successful_sync_timestamp_seconds"
    assert sample(m, stamp, subscription="orders") == 1_700_000_000.0
    assert sample(m, stamp, subscription="billing") == 1_700_000_500.0
    m.start_sync_clocks(["orders"], at=1_700_000_900.0)  # the queries restarted
    assert sample(m, stamp, subscription="orders") == 1_700_000_000.0
    assert 'subscription="*"' not in m.exposition()


def test_halted_partitions_by_cause_fall_to_zero_when_resumed() -> None:
    """The halts as the table holds them each batch: a (subscription, cause) no longer
    halted reads 0, so an alert on it resolves."""
    m = Metrics()
    halted = "cursorsync_halted_partitions"
    m.set_halted({("billing", "source_rewind"): 2, ("billing", "target_reset"): 1})
    assert sample(m, halted, subscription="billing", cause="source_rewind") == 2
    assert sample(m, halted, subscription="billing", cause="target_reset") == 1
    m.set_halted({("billing", "source_rewind"): 1})
    assert sample(m, halted, subscription="billing", cause="source_rewind") == 1
    assert sample(m, halted, subscription="billing", cause="target_reset") == 0
    m.set_halted({})
    assert sample(m, halted, subscription="billing", cause="source_rewind") == 0
    with pytest.raises(ValueError, match="count must be >= 0"):
        m.set_halted({("billing", "unknown"): -1})


def test_redelivery_forecast_sums_partitions_per_subscription_and_cause(
        tmp_path: Path) -> None:
    """The gauge adds up each partition's last figure; the sync sink feeds it the unmapped
    acked entries of its rows (one message each at least), per subscription."""
    from cursorsync.app.queries import sync_sink_settings
    from cursorsync.core.cursor import AckPlan, Outcome
    from cursorsync.core.positions import Position
    from cursorsync.core.ranges import RangeSet
    from cursorsync.core.records import PartitionKey, SyncRecord
    from cursorsync.sync.sink import SyncSink, _Synced
    from cursorsync.sync.step import StepSettings, SyncStep
    from cursorsync.tables import open_store
    from cursorsync.tables.rows import sync_progress_rows
    from tests.support.sink_world import sink_config

    m = Metrics()
    name = "cursorsync_redelivery_forecast_messages"
    m.set_redelivery_forecast("billing", "chunks", {"t#0": 3, "t#1": 4})
    m.set_redelivery_forecast("billing", "chunks", {"t#0": 1})
    assert sample(m, name, subscription="billing", cause="chunks") == 5
    with pytest.raises(ValueError, match="messages must be >= 0"):
        m.set_redelivery_forecast("billing", "chunks", {"t#0": -1})

    config = sink_config(tmp_path)
    sink = SyncSink(sync_sink_settings(config), open_store("delta-rs", config.tables.path),
                    SyncStep(StepSettings(), None, lambda t, s: None), m)
    now = datetime(2026, 11, 26, tzinfo=UTC)

    def rows(unmapped: dict[tuple[str, int], int]) -> Any:
        return sync_progress_rows([SyncRecord(
            PartitionKey("persistent://t/n/orders", p), sub,
            AckPlan(Position(7, 9), RangeSet(), RangeSet(), Position(7, 9), n, 0, 0, 0,
                    Outcome.PARTIAL if n else Outcome.EXACT), 0, False, now, now)
            for (sub, p), n in unmapped.items()], source_cluster="A", target_cluster="B")

    sink._record(_Synced([], rows({("audit", 0): 4, ("audit", 1): 6, ("ledger", 0): 0}), None),
                 0.1)
    assert sample(m, name, subscription="audit", cause="acked_unmapped") == 10
    assert sample(m, name, subscription="ledger", cause="acked_unmapped") == 0
    sink._record(_Synced([], rows({("audit", 1): 0}), None), 0.1)  # partition 0 stays
    assert sample(m, name, subscription="audit", cause="acked_unmapped") == 4
