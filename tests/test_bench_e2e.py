"""The end-to-end benchmark, tiny: the real job between two pulsar-lite brokers (~30 s)."""

from __future__ import annotations

import json

import pytest

from cursorsync.bench_e2e import E2ESpec, run_e2e

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TOP_KEYS = {"benchmark", "spec", "machine", "backlog", "mapping", "steady", "lag", "losses",
            "spark_startup_s", "total_s"}
MAPPING_KEYS = {"entries", "rows_total", "wall_s", "entries_per_s", "rows_per_s", "per_batch",
                "pairs_checked", "pairs_wrong", "pairs_unmapped", "cpu_seconds",
                "duplicate_rows_read", "reader_alone", "warm_entries_per_s",
                "entries_per_cursorsync_cpu_s", "broker_cpu_share"}
LAG_KEYS = {"count", "p50_s", "p99_s", "max_s", "unsynced", "losses", "acks_emitted",
            "acks_per_s", "samples_s", "wait_for_mapping_p50_s", "sync_path_p50_s"}


def test_tiny_e2e_run_reports_lag_and_no_loss() -> None:
    spec = E2ESpec(backlog_entries=2_000, partitions=2, live_partitions=1, rate_per_s=100,
                   max_entries_per_batch=1_500, drain_timeout_s=15)
    out = json.loads(run_e2e(seconds=8, json_output=True, spec=spec))

    assert out.keys() >= TOP_KEYS
    assert out["mapping"].keys() >= MAPPING_KEYS
    assert out["lag"].keys() >= LAG_KEYS
    assert out["spec"]["trigger_interval_s"] == 1.0
    assert out["machine"]["cores"] >= 1
    assert out["backlog"]["entries"] >= 2_000
    # Every replicated pair of both topics is mapped, and mapped right.
    assert out["mapping"]["pairs_checked"] >= out["backlog"]["entries"]
    assert out["mapping"]["pairs_wrong"] == 0
    assert out["mapping"]["pairs_unmapped"] == 0
    assert out["mapping"]["entries_per_s"] > 0
    # Where each mapping batch's time went, by process group.
    for b in out["mapping"]["per_batch"]:
        assert b["cpu_s"].keys() >= {"driver", "spark jvm", "python workers"}
    # Rows per batch are the sink's count (a Spark row holds a record batch of them).
    assert sum(b["rows"] for b in out["mapping"]["per_batch"]) == out["mapping"]["rows_total"]
    assert all(b["spark_rows"] < b["rows"] for b in out["mapping"]["per_batch"])
    lag = out["lag"]
    assert lag["samples_s"], "no source ack reached the target"
    assert lag["count"] == len(lag["samples_s"])
    assert min(lag["samples_s"]) >= 0
    assert lag["p50_s"] <= lag["p99_s"] <= lag["max_s"]
    assert lag["acks_emitted"] > 0
    assert out["losses"] == 0
