"""The end-to-end benchmark, a tiny run on the test bed: the report's structure and its
correctness facts (no figure of time is asserted)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from cursorsync_devtools.bench_e2e import E2ESpec, run_e2e
from cursorsync_devtools.bench_e2e_report import GROUPS, table
from cursorsync_devtools.testbed import TestBed

TOP_KEYS = {"benchmark", "spec", "machine", "backlog", "spark_startup_s", "mapping", "lag",
            "failover", "phases", "total_s"}
MAPPING_KEYS = {"entries", "batches", "seconds_from_start", "first_batch_ended_after_s",
                "entries_per_s_from_start", "entries_per_s_warm", "per_batch", "baseline",
                "ratio_warm", "ratio_from_start", "check"}
LAG_FIGURES = {"entries", "covered", "never_covered", "p50_s", "p99_s", "max_s", "min_s"}
PHASES = ["backlog", "positions on b", "baseline", "spark start-up", "mapping", "warm-up", "live",
          "failover", "mapping check"]


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow  # a benchmark; the failovers it ends with run in test_e2e.py
def test_tiny_run_reports_each_figure_beside_its_baseline(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    # The wait for b's cursors ends once both cover the live entries; on a busy machine
    # the built-in's first snapshot can take longer than the 8 s of traffic.
    spec = E2ESpec(backlog_topic=topic_name("backlog"), backlog_entries=2_000, partitions=2,
                   live_topic=topic_name("live"), live_partitions=1, rate_per_s=100,
                   warm_up_topic=topic_name("warm-up"), warm_up_seconds=4,
                   max_entries_per_batch=500, settle_timeout_s=90)
    out = json.loads(run_e2e(seconds=8, json_output=True, spec=spec, bed=testbed))

    assert out.keys() >= TOP_KEYS
    assert out["machine"]["cores"] >= 1
    backlog, mapping = out["backlog"], out["mapping"]
    assert backlog["entries"] == 2_000 and 0 < backlog["batched_entries"] < 2_000
    assert backlog["messages"] == 2_000 + 4 * backlog["batched_entries"]
    assert mapping.keys() >= MAPPING_KEYS
    # The mapping is right for every backlog entry.
    assert mapping["check"] == {"pairs_checked": 2_000, "pairs_wrong": 0, "pairs_unmapped": 0}
    # Batches of at most 500 entries per stream: the first and warm ones.
    per_batch = mapping["per_batch"]
    assert len(per_batch) == mapping["batches"] >= 4
    assert sum(b["rows"]["b"] for b in per_batch) == 2_000
    assert sum(b["rows"]["a"] for b in per_batch) == 2_000  # identity digests all of a
    for b in per_batch:
        assert b["cpu_s"].keys() >= set(GROUPS)
    assert mapping["entries_per_s_warm"] > 0 and mapping["ratio_warm"] > 0
    baseline = mapping["baseline"]
    assert baseline["clusters"] == ["b", "a"] and baseline["readers"] == 4
    assert baseline["messages_read"] == 2 * backlog["messages"]
    assert baseline["entries_per_s"] > 0

    lag = out["lag"]
    assert lag["messages"] > 0 and lag["polls"] > 0
    for side in ("cursorsync", "builtin"):
        figures = lag[side]
        assert figures.keys() >= LAG_FIGURES
        assert figures["covered"] > 0, lag
        assert figures["min_s"] <= figures["p50_s"] <= figures["p99_s"] <= figures["max_s"]
        # The lag of the entries acked in the topic's first seconds, and after, apart.
        windows = figures["by_window"]
        assert set(windows) == {"first 10 s", "after 10 s"}, windows
        assert sum(w["entries"] for w in windows.values()) == figures["entries"], windows
        assert all(w["p50_s"] <= w["p99_s"] <= figures["max_s"] for w in windows.values()
                   if w["entries"])
    # b never acks an entry before a did.
    assert lag["cursorsync"]["min_s"] >= 0, lag
    # The job's tables time every step for most entries; each stage takes no negative time
    # (every row is written after the step before it), and they add up to the lag.
    stages = lag["cursorsync_stages"]
    assert stages["with_every_time"] > 0.9 * lag["cursorsync"]["covered"], stages
    for name in ("source poll", "mapping", "sync"):
        assert stages[name]["p50_s"] >= 0, stages
    # Spark's phases of the live phase's batches, for both queries.
    spark = lag["spark_phases"]
    assert spark.keys() == {"cursorsync-mapping", "cursorsync-sync"}, spark
    for figures in spark.values():
        assert figures["batches"] > 0
        whole = figures["triggerExecution"]
        assert 0 <= figures["addBatch"]["p50_ms"] <= whole["p90_ms"], figures

    warm_up = lag["warm_up"]
    assert warm_up["topic"].endswith(spec.warm_up_topic) and warm_up["messages"] > 0
    for name in ("cursorsync", "builtin"):
        assert warm_up[name]["covered"] > 0, warm_up

    failover = out["failover"]
    assert failover["cursorsync"]["losses"] == 0, failover
    assert failover["cursorsync"]["messages"] == lag["messages"]

    assert [p["phase"] for p in out["phases"]] == PHASES
    for p in out["phases"]:
        assert p["seconds"] >= 0 and p["cpu_s"].keys() >= {"driver", "broker a", "broker b"}
        assert p["broker_threads_cpu_s"].keys() == {"broker a", "broker b"}
        # A part of the broker's CPU (ticks of 10 ms each side of the difference).
        assert all(0 <= s <= p["cpu_s"][name] + 0.05 for name, kinds in
                   p["broker_threads_cpu_s"].items() for s in kinds.values()), p
    text = table(out)
    assert "the warm-up topic's entries" in text
    for heading in ("MAPPING INGESTION", "MAPPING BATCH", "SYNC LAG", "CURSORSYNC LAG BY STAGE",
                    "SPARK PHASE", "FAILOVER TO b",
                    "CPU-S BY PHASE", "BROKERS' JIT"):
        assert heading in text
