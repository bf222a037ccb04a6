"""The end-to-end benchmark: a tiny run on the session's test bed (the report's structure
and its correctness facts; no figure of time is asserted), and its parts without one."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from cursorsync.core.positions import Position
from cursorsync_devtools.bench_e2e import (
    GROUPS,
    BenchError,
    E2ESpec,
    _Phases,
    run_e2e,
    spark_cores,
    table,
)
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.cpu import CpuSampler
from cursorsync_devtools.testbed.lag import LiveSpec, first_covered
from cursorsync_devtools.testbed.produce import Plan

TOP_KEYS = {"benchmark", "spec", "machine", "backlog", "spark_startup_s", "mapping", "lag",
            "failover", "phases", "total_s"}
MAPPING_KEYS = {"entries", "batches", "seconds_from_start", "first_batch_ended_after_s",
                "entries_per_s_from_start", "entries_per_s_warm", "per_batch", "baseline",
                "ratio_warm", "ratio_from_start", "check"}
LAG_FIGURES = {"entries", "covered", "never_covered", "p50_s", "p99_s", "max_s", "min_s"}
PHASES = ["backlog", "positions on b", "baseline", "spark start-up", "mapping", "live", "failover",
          "mapping check"]


@pytest.mark.integration
@pytest.mark.spark
def test_tiny_run_reports_each_figure_beside_its_baseline(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    spec = E2ESpec(backlog_topic=topic_name("backlog"), backlog_entries=2_000, partitions=2,
                   live_topic=topic_name("live"), live_partitions=1, rate_per_s=100,
                   max_entries_per_batch=500, settle_timeout_s=20)
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
    # b never acks an entry before a did.
    assert lag["cursorsync"]["min_s"] >= 0, lag

    failover = out["failover"]
    assert failover["cursorsync"]["losses"] == 0, failover
    assert failover["cursorsync"]["messages"] == lag["messages"]

    assert [p["phase"] for p in out["phases"]] == PHASES
    for p in out["phases"]:
        assert p["seconds"] >= 0 and p["cpu_s"].keys() >= {"driver", "broker a", "broker b"}
    text = table(out)
    for heading in ("MAPPING INGESTION", "MAPPING BATCH", "SYNC LAG", "FAILOVER TO b",
                    "CPU-S BY PHASE"):
        assert heading in text


def test_a_phase_that_cannot_complete_is_named() -> None:
    phase = _Phases(CpuSampler({}), lambda _: None)
    with phase("backlog"):
        pass
    with (pytest.raises(BenchError, match="phase live could not complete: no broker"),
          phase("live")):
        raise ConnectionError("no broker")
    assert [p["phase"] for p in phase.done] == ["backlog"]


def test_first_covered_by_mark_delete_or_individual_acks() -> None:
    positions = [Position(5, 0), Position(5, 1), Position(5, 2), Position(6, 0)]
    changes = [(1.0, "5:-1", "[]"), (2.0, "5:0", "[(5:1..5:2]]"), (3.0, "5:2", "[]"),
               (4.0, "6:0", "[]")]
    by_mark_delete = first_covered(changes, positions, individual=False)
    assert by_mark_delete.tolist() == [2.0, 3.0, 3.0, 4.0]
    both = first_covered(changes, positions, individual=True)
    assert both.tolist() == [2.0, 3.0, 2.0, 4.0]
    never = first_covered(changes[:2], positions, individual=True)
    assert never[3] != never[3]  # NaN: never covered


def test_live_plan_paces_messages_and_acks_some_late() -> None:
    live = LiveSpec("t", rate_per_s=200, seconds=10, batched_fraction=0.2, batch_size=5)
    plan = live.plan(["t-partition-0", "t-partition-1"])
    assert 1_800 <= plan.message_count() <= 2_200
    decisions = live.decisions(plan)
    assert len(decisions) == plan.message_count()
    late = [c for c, index in decisions.values() if c.kind == "late" and index <= 0]
    assert 0 < len(late) < plan.entry_count() / 4
    assert all(0.3 <= c.delay_s <= 2.0 for c in late)
    # A batch's messages share their entry's choice.
    keys = [(key, size, index) for _, key, size, index in plan.messages()]
    first = next(i for i, (_, size, index) in enumerate(keys) if size and index == 0)
    assert len({decisions[k][0] for k, _, _ in keys[first:first + 5]}) == 1


def test_plan_spreads_entries_and_batches_over_partitions() -> None:
    plan = Plan.of(["a-partition-0", "a-partition-1", "a-partition-2"], 1_000,
                   batched_fraction=0.2, batch_size=5, seed=3)
    assert plan.entry_count() == 1_000
    assert sorted(len(v) for v in plan.entries.values()) == [333, 333, 334]
    assert plan.message_count() == 1_000 + 4 * plan.batched_count()
    assert 150 < plan.batched_count() < 250


def test_spark_cores() -> None:
    assert spark_cores("local[2]") == 2
    assert spark_cores("local[3,4]") == 3
    assert spark_cores("local[*]") >= 1
    assert spark_cores("spark://host:7077") == 2
