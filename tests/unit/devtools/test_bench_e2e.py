"""The end-to-end benchmark's parts, without a test bed (its tiny run on the bed:
tests/e2e/test_bench_e2e.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from cursorsync.core.positions import Position
from cursorsync_devtools.bench_e2e import spark_cores
from cursorsync_devtools.bench_phases import BenchError, Phases
from cursorsync_devtools.testbed.apart import in_own_process
from cursorsync_devtools.testbed.cpu import CpuSampler
from cursorsync_devtools.testbed.lag import LiveSpec, first_covered
from cursorsync_devtools.testbed.produce import Plan


def test_a_phase_that_cannot_complete_is_named() -> None:
    phase = Phases(CpuSampler({}), lambda _: None)
    with phase("backlog"):
        pass
    with (pytest.raises(BenchError, match="phase live could not complete: no broker"),
          phase("live")):
        raise ConnectionError("no broker")
    assert [p["phase"] for p in phase.done] == ["backlog"]


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_phase_tells_its_workload_s_process_apart_from_the_driver() -> None:
    phase = Phases(CpuSampler({}), lambda _: None)
    with phase("live"):
        workload = in_own_process(_busy, 1.0)
        phase.workload(workload.cpu_s)
    used = phase.done[0]["cpu_s"]
    assert used["workload"] == round(workload.cpu_s, 2) >= 1.0
    # The driver reaped the workload's process (its time is in the driver's otherwise),
    # and only waited for it itself.
    assert 0.0 <= used["driver"] < 0.5
    with phase("failover"):
        pass
    assert "workload" not in phase.done[1]["cpu_s"]


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


def test_spark_phases_of_the_batches_since_a_time() -> None:
    from cursorsync_devtools.batch_figures import trigger_phases, trigger_table

    def update(at: str, **ms: int) -> dict[str, object]:
        return {"timestamp": at, "durationMs": ms}

    progress = {
        "q": [update("2026-01-01T00:00:00.000Z", addBatch=900, triggerExecution=1000),
              # An idle trigger: no batch ran.
              update("2026-01-01T00:00:19.500Z", latestOffset=3, triggerExecution=3),
              *(update(f"2026-01-01T00:00:1{i}.000Z", latestOffset=10 * i, walCommit=20,
                       addBatch=100 * i, commitOffsets=20, triggerExecution=100 * i + 50)
                for i in range(1, 5))],
        "idle": [update("2026-01-01T00:00:00.000Z", addBatch=1, triggerExecution=2)]}
    since = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC).timestamp()
    figures = trigger_phases(progress, since)
    assert list(figures) == ["q"]  # no batch of "idle" since then
    q = figures["q"]
    assert q["batches"] == 4
    assert q["addBatch"] == {"p50_ms": 300, "p90_ms": 400}
    assert q["latestOffset"] == {"p50_ms": 30, "p90_ms": 40}
    assert q["walCommit"] == {"p50_ms": 20, "p90_ms": 20}
    assert "300 / 400" in trigger_table(figures)
