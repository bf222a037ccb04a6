"""The end-to-end benchmark, tiny, on the session's test bed: its report's structure and
its correctness facts, never its times."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from cursorsync.bench_e2e import E2ESpec, run_e2e, table
from cursorsync.testbed import TestBed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_tiny_run_maps_every_entry_right_and_loses_nothing(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    spec = E2ESpec(backlog_topic=topic_name("backlog"), live_topic=topic_name("live"),
                   backlog_entries=2_000, partitions=2, live_partitions=1, rate_per_s=100,
                   max_entries_per_batch=1_500)
    out = json.loads(run_e2e(seconds=6, json_output=True, spec=spec, bed=testbed))

    assert out.keys() >= {"benchmark", "spec", "machine", "backlog", "mapping", "lag",
                          "failover", "phases", "spark_startup_s", "total_s"}
    assert out["backlog"]["entries"] == 2_000 and out["backlog"]["batched_entries"] > 0
    mapping = out["mapping"]
    # Every backlog entry is mapped, and mapped to its real counterpart on b.
    assert mapping["check"]["pairs_checked"] == 2_000
    assert mapping["check"]["pairs_wrong"] == 0 and mapping["check"]["pairs_unmapped"] == 0
    assert mapping["batches"] >= 2  # 1,500 entries per cluster and batch
    assert mapping["entries_per_s_from_start"] > 0 and mapping["baseline"]["entries_per_s"] > 0
    assert sum(b["rows"]["b"] for b in mapping["per_batch"]) == 2_000
    for b in mapping["per_batch"]:
        assert b["cpu_s"].keys() >= {"driver", "spark jvm", "python workers", "broker a",
                                     "broker b"}
    for who in ("cursorsync", "builtin"):
        lag = out["lag"][who]
        assert lag["covered"] > 0 and lag["never_covered"] == 0
        assert 0 <= lag["min_s"] <= lag["p50_s"] <= lag["p99_s"] <= lag["max_s"]
        assert out["failover"][who]["losses"] == 0
    assert out["failover"]["cursorsync"]["duplicates"] == 0
    assert "MAPPING INGESTION" in table(out) and "SYNC LAG" in table(out)
