"""The demo's catch-up rule, on sync_progress rows alone (no brokers)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cursorsync_devtools.demo import _settled

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(*batches: tuple[str, int, int]) -> list[dict[str, Any]]:
    """(outcome, unmapped acked entries, acks sent) per batch, one second apart."""
    return [{"batch_id": i, "outcome": o, "unmapped_acked_entries": u, "acks_sent": a,
             "emitted_at": T0 + timedelta(seconds=i)} for i, (o, u, a) in enumerate(batches)]


def test_the_exact_plan_may_come_after_quiet_batches() -> None:
    """Markers the source wrote last stay unmapped until the mapping has settled, so
    batches that send nothing can come before the plan turns exact."""
    got = rows(("partial", 5, 3), ("partial", 5, 0), ("partial", 5, 0), ("exact", 0, 0),
               ("exact", 0, 0))
    settled = _settled(got, exact_needed=True)
    assert isinstance(settled, list) and [r["batch_id"] for r in settled] == [0, 1, 2, 3, 4]


def test_a_quiet_batch_must_follow_the_exact_one() -> None:
    got = rows(("partial", 2, 4), ("exact", 0, 1))
    reason = _settled(got, exact_needed=True)
    assert reason == "2 batches since the workload's end, none after batch 1 sending no acks"
    got = rows(("partial", 2, 4), ("exact", 0, 1), ("exact", 0, 0), ("exact", 0, 0))
    settled = _settled(got, exact_needed=True)
    assert isinstance(settled, list) and len(settled) == 3


def test_never_exact_says_what_is_unmapped() -> None:
    reason = _settled(rows(("partial", 5, 0), ("partial", 5, 0)), exact_needed=True)
    assert reason == ("no exact plan with nothing unmapped yet (last: outcome partial, 5 acked "
                      "entries unmapped)")
    assert _settled([], exact_needed=True) == "no exact plan with nothing unmapped yet"
    assert _settled([], exact_needed=False) == "no sync batch since the workload's end"


def test_a_chunked_topic_needs_two_batches_the_second_sending_nothing() -> None:
    settled = _settled(rows(("partial", 3, 2), ("partial", 3, 0)), exact_needed=False)
    assert isinstance(settled, list) and len(settled) == 2
    assert isinstance(_settled(rows(("partial", 3, 0)), exact_needed=False), str)


def test_snapshot_evidence_alone_needs_quiet_batches_spanning_the_settle_time() -> None:
    """No segment means no exact plan: quiet batches must span ``quiet_for_s`` after the last
    batch that sent acks (an anchor can arrive seconds after the last message)."""
    got = rows(("unknown", 0, 4), ("unknown", 0, 0), ("unknown", 0, 0), ("unknown", 0, 2),
               ("unknown", 0, 0), ("unknown", 0, 0), ("unknown", 0, 0))
    assert isinstance(_settled(got, exact_needed=False, quiet_for_s=4), str)
    settled = _settled(got, exact_needed=False, quiet_for_s=3)
    assert isinstance(settled, list) and [r["batch_id"] for r in settled] == list(range(7))


def test_phase_means_come_from_the_jobs_phase_histogram() -> None:
    from cursorsync.app.metrics import Metrics
    from cursorsync_devtools.batch_figures import phase_cpu_seconds, phase_seconds, phase_table

    m = Metrics()
    m.observe_batch_phases("sync", {"step": 2.0, "step:targets": 1.5, "write": 0.25},
                           cpu={"step": 0.5})
    m.observe_batch_phases("sync", {"step": 4.0, "step:targets": 2.5, "write": 0.75},
                           cpu={"step": 1.5})
    m.observe_batch_phases("mapping", {"read": 9.0, "build": 3.0}, cpu={"build": 1.0})
    m.observe_batch_phases("mapping", {"read": 7.0, "build": 5.0}, cpu={"build": 2.0})
    assert phase_seconds(m) == {"mapping": {"read": 8.0, "build": 4.0},
                                "sync": {"step": 3.0, "step:targets": 2.0, "write": 0.5}}
    assert phase_seconds(None) == {}
    # Each query thread's CPU per batch, beside its seconds; nothing where not measured.
    assert phase_cpu_seconds(m) == {"mapping": {"build": 1.5}, "sync": {"step": 1.0}}
    assert phase_cpu_seconds(None) == {}
    table = phase_table(phase_seconds(m), phase_cpu_seconds(m)).splitlines()
    assert "MAPPING CPU" in table[0] and "SYNC CPU" in table[0]
    build = next(line for line in table if line.startswith("build"))
    assert build.split() == ["build", "4.00", "1.50", "-", "-"]  # no sync phase "build"
    step = next(line for line in table if line.startswith("step "))
    assert step.split() == ["step", "-", "-", "3.00", "1.00"]
