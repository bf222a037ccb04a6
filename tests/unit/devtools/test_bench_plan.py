"""``cursorsync-dev bench plan``, small: the synthetic batch is what it says (idle partitions
exact with nothing to send, active ones acked up to their holes), figures out."""

from __future__ import annotations

import json
import logging

import pytest

from cursorsync_devtools.bench_plan import bench_plan


def test_a_small_plan_run_syncs_every_partition_and_reports(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    out = bench_plan(300, active=0.2, holes=0.5, seed=3)
    json.dumps(out)  # what --json prints
    assert out["partitions"] == 300 and out["mapping_rows_written"] == 600
    first, second, third = out["batches"]
    a, h = out["active_partitions"], out["partitions_with_holes"]
    assert 0 < h < a < 300
    # One sync_progress row per (partition, subscription) in every batch; the target is
    # read for each in the first, and later where the source moved and for a tenth of the
    # others (an idle cursor whose last plan sent nothing reads its target every tenth
    # batch, the cursors' reads spread over the batches).
    assert first["target_requests"] == first["cursors"] == first["rows_written"] / 2 == 300
    for batch in (second, third):
        assert a <= batch["target_requests"] < a + (300 - a) // 4 and batch["cursors"] == 300
    # Every cursor is idle but the active ones after the first batch: the step sees those,
    # and the idle ones whose target read or rows are due; the others are repeated in bulk.
    assert first["cursors_stepped"] == 300 and first["cursors_repeated_in_bulk"] == 0
    assert first["idle_cursors_in_columns"] == 300 - a
    for batch in (second, third):
        assert batch["cursors_stepped"] + batch["cursors_repeated_in_bulk"] == 300
        assert a < batch["cursors_stepped"] < a + (300 - a) // 4
        assert batch["idle_cursors_in_columns"] == 300 - a
    for batch in (first, second, third):
        # No rewind, nothing refused.
        assert batch["outcomes"] == {"exact": batch["cursors_stepped"]}
    # Idle cursors' rows are written every few batches: a moving one's every batch.
    for batch in (second, third):
        assert a <= batch["rows_written"] // 2 < a + (300 - a) // 5
    # The target stays at 99 on active partitions: the source's md (100, 105, 110) is one
    # entry, six, eleven past it; 20 acked ranges of 8 entries each where there are holes.
    assert first["acks_planned_entries"] == a * 1 + h * 160
    assert second["acks_planned_entries"] == a * 6 + h * 160
    assert third["acks_planned_entries"] == a * 11 + h * 160
    # The batch is the sink's call, its phases timed within it.
    phases = ("collect", "parse", "refresh", "step", "rows", "write", "metrics")
    timed = sum(third[f"{p}_seconds"] for p in phases)
    assert 0 < timed <= out["seconds_per_batch"] + 0.0005 * (len(phases) + 1)  # each rounded
    assert out["seconds_per_batch"] == third["batch_seconds"]
    assert first["parse_seconds_without_the_last_batch"] is None
    assert third["parse_seconds_without_the_last_batch"] > 0
    # Mappings are built for the partitions planned: all of them first, then the active.
    assert first["mappings_built"] == 300 and third["mappings_built"] == a
    assert out["microseconds_per_partition"] > 0
    # An idle partition is kept packed: less than one that moves, which keeps its states
    # and its mapping built; its idle row is in a mapped file. (Which of the heap and the
    # files keeps more at 300 partitions is the fixed part's: the per-partition figures are
    # for large runs.)
    assert 0 < out["kept_bytes_per_idle_partition"] < out["kept_bytes_per_moving_partition"]
    assert out["mapped_bytes_per_idle_partition"] > 0
    assert out["kept_bytes_per_idle_partition_on_heap"] > 0
    assert 0 < out["driver_rss_anon_mib_after_free_memory_released"] <= out[
        "driver_rss_anon_mib_after"] + 1
    assert "rewind" not in caplog.text


def test_a_start_plans_the_cursors_over_batches_of_first_plans() -> None:
    """100 first plans a batch: 300 cursors after a start take three batches, the moving
    ones in the first, while the cursors planned already go on; then the running job's
    two."""
    out = bench_plan(300, active=0.2, holes=0.5, seed=3, first_plans_per_batch=100)
    assert out["first_plans_per_batch"] == 100 and out["start_batches"] == 3
    batches = out["batches"]
    assert [b["cursors_waiting"] for b in batches] == [200, 100, 0, 0, 0]
    assert [b["cursors"] for b in batches] == [100, 200, 300, 300, 300]
    assert [b["outcomes"] for b in batches] == [{"exact": b["cursors_stepped"]}
                                                for b in batches]
    # Idle cursors go to columns as they are planned, and stay there.
    assert [b["idle_cursors_in_columns"] for b in batches][-1] == 300 - out["active_partitions"]
    assert out["start_batch_max_seconds"] <= out["start_seconds"]
    # The cursors that moved since the state the tables held before the start go first.
    assert batches[0]["cursors_with_acks_planned"] == out["active_partitions"]
    # The steady batch again beside a busy thread: the same work, timed.
    assert out["seconds_per_batch_beside_busy_thread"] > 0
    assert out["translate_seconds"] == batches[-1]["translate_seconds"] > 0
    assert out["translate_seconds_beside_busy_thread"] > 0
    assert len(batches) == out["start_batches"] + 2


def test_bench_plan_from_the_command_line() -> None:
    from typer.testing import CliRunner

    from cursorsync_devtools.cli import app

    result = CliRunner().invoke(app, ["bench", "plan", "--partitions", "50", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["partitions"] == 50 and out["batches"][0]["target_requests"] == 50
    assert out["batches"][-1]["target_requests"] < 50
