"""End to end on the real test bed: the live workload on a, the job, then failover to b.

Each test runs the demo's flow on the session's two Apache Pulsar clusters with topics
of its own: the job (``by-id`` emission) syncs a Shared and a Failover subscription of a
partitioned, a plain and a chunked topic while the workload produces and acks on a, with
Pulsar's replicated subscriptions on beside it. After failover every delivery on b is
counted. cursorsync may redeliver only the acked messages of partially acked batches,
of chunked messages (whose chunks are mapped one by one only where their stamps are
evidence) and acks newer than the last completed sync (each
counted apart); it loses nothing and acks no foreign message. What it redelivers of each
kind agrees with its redelivery forecast, taken when the job stopped (printed beside).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cursorsync.core.positions import Position
from cursorsync_devtools.demo import demo
from cursorsync_devtools.demo_report import DemoReport
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import forecast_misses
from cursorsync_devtools.testbed.workload import WorkloadSpec, sync_subscription
from tests.support.job_on_bed import last_data_entry

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def spec(topic_name: Callable[[str], str], **kwargs: Any) -> WorkloadSpec:
    """A small workload on topics of the test's own: ledgers still roll on both sides."""
    base: dict[str, Any] = dict(
        partitioned_topic=topic_name("orders"), plain_topic=topic_name("audit"),
        chunked_topic=topic_name("blobs"), entries_per_partition=90, produce_seconds=4.0,
        chunked_messages=2)
    return WorkloadSpec(**{**base, **kwargs})


def check_forecast(report: DemoReport) -> None:
    """Each kind of redelivery measured agrees with the forecast: equal where it is exact,
    at most its bound; and nothing lost."""
    table = report.table()
    print(table)
    for kind, ours in report.cursorsync.items():
        assert not forecast_misses(ours, report.forecast[kind]), (
            forecast_misses(ours, report.forecast[kind]), table)


def check(report: DemoReport) -> None:
    """The rule and the promise, for every subscription type."""
    check_forecast(report)
    for kind, ours in report.cursorsync.items():
        builtin = report.builtin[kind]
        table = report.table()
        assert ours["losses"] == 0, table
        assert ours["foreign_acked"] == 0, table
        assert ours["unexplained"] == 0, table
        assert ours["messages"] > 0 and ours["acked_on_source"] > 0, table
        assert ours["foreign"] > 0 and ours["chunked"] <= ours["duplicates"], table
        # What the built-in redelivers includes everything cursorsync may redeliver.
        assert builtin["duplicates"] >= ours["duplicates"], table


def ledgers_rolled(bed: TestBed, topic: str) -> dict[str, int]:
    return {c: len(bed.internal_stats(c, p)["ledgers"])
            for c in ("a", "b") for p in bed.partitions(topic)[:1]}


def test_failover_with_position_property_and_identity(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    s = spec(topic_name)
    r = demo(bed=testbed, spec=s, work_dir=str(tmp_path), restart_on_source=True)
    check(r)
    assert r.evidence == ["position-property", "identity"]
    for kind, counts in r.cursorsync.items():
        assert counts["duplicates"] == counts["partial_batch"] + counts["chunked"] + counts[
            "acked_after_sync"]
        # Batch-index acks off (4.0's default): a's broker holds no ack for a partially
        # acked batch, so a restart on a delivers its acked messages again too.
        assert r.source_restart[kind]["partial_batch"] == counts["partial_batch"] > 0, (
            r.table())
        assert r.source_restart[kind]["losses"] == 0, r.table()
    rolled = ledgers_rolled(testbed, s.partitioned_topic)
    assert rolled["a"] >= 2 and rolled["b"] >= 2, rolled


def test_failover_with_skipped_ids_classified_by_the_probe(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """``evidence.holes: probe``, chunked messages among the markers: nothing lost, every
    duplicate explained, as with one request per skipped id."""
    r = demo(bed=testbed, spec=spec(topic_name, seed=17), work_dir=str(tmp_path),
             holes="probe")
    check(r)
    for counts in r.cursorsync.values():
        assert counts["duplicates"] == counts["partial_batch"] + counts["chunked"] + counts[
            "acked_after_sync"]


def test_failover_with_identity_evidence_alone(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """Brokers older than 4.0.4 stamp nothing: identity alignment maps every entry."""
    r = demo(bed=testbed, spec=spec(topic_name, seed=11), work_dir=str(tmp_path),
             strategies=["identity"])
    check(r)
    assert r.evidence == ["identity"]


def test_failover_with_snapshot_evidence_alone(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """The source's snapshot markers alone: b follows a's markDeletePosition to the newest
    anchor at or before it, as the built-in does, and loses nothing; what it redelivers is
    what the built-in redelivers (chunked messages aside), since neither carries individual
    acks."""
    r = demo(bed=testbed, spec=spec(topic_name, seed=29), work_dir=str(tmp_path),
             strategies=["snapshot"])
    assert r.evidence == ["snapshot"]
    check_forecast(r)
    table = r.table()
    for kind, ours in r.cursorsync.items():
        builtin = r.builtin[kind]
        assert ours["losses"] == 0 and ours["foreign_acked"] == 0, table
        assert ours["messages"] > 0 and ours["acked_on_source"] > 0, table
        assert ours["duplicates"] <= builtin["duplicates"] + ours["chunked"], table


@pytest.mark.parametrize("holes", ["verified", "probe"])
def test_markers_on_b_are_acked_so_its_mark_delete_passes_them(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path, holes: str) -> None:
    """Everything acked on a, nothing foreign on b (a foreign entry is never acked, so it
    holds the markDeletePosition): b's markDeletePosition, as the sync alone leaves it,
    reaches the last message, past every snapshot marker the brokers wrote in between (the
    hole check names them by X-Pulsar-marker-type, the probe cursor by the broker's own
    acks), and b redelivers nothing. Whether one of b's ledgers (they roll every 45
    entries) ends in markers depends on timing; that case is pinned in
    tests/integration/mapping/test_hole_check.py."""
    r = _markers_passed(testbed, topic_name, tmp_path, seed=5, holes=holes)
    requests = r.skipped_id_requests
    print(f"skipped-id requests with holes {holes}: {requests}")
    if holes == "probe":  # the probe answered: markers need no request of their own (one
        # is made per id only where the probe had not read that far within its wait)
        assert requests["cursor-read"] > 0 and requests["raw-entry"] <= requests[
            "cursor-read"], requests
    else:
        assert requests["raw-entry"] > 0 and "cursor-read" not in requests, requests


def test_markers_checked_a_few_a_batch_are_all_checked_after_traffic_stops(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """4 skipped ids checked a mapping batch: the rest wait, and the mapping query runs
    batches without new entries until every one is checked, so b's markDeletePosition
    still passes every marker once traffic has stopped."""
    import cursorsync.mapping.builder as builder_module

    monkeypatch.setattr(builder_module, "HOLE_CHECKS_PER_BATCH", 4)
    _markers_passed(testbed, topic_name, tmp_path, seed=7)
    # Batches were asked for: an offset of the target's entries source carries a tick.
    offsets = (tmp_path / "checkpoints" / "mapping" / "offsets").glob("[0-9]*")
    assert any('"tick"' in f.read_text() for f in offsets)


def _markers_passed(testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path,
                    seed: int, holes: str = "verified") -> DemoReport:
    s = spec(topic_name, hole_fraction=0.0, partial_batch_fraction=0.0, late_fraction=0.3,
             chunked_topic=None, foreign_per_partition=0, seed=seed)
    r = demo(bed=testbed, spec=s, work_dir=str(tmp_path), holes=holes)
    check_forecast(r)
    for counts in r.cursorsync.values():
        assert counts["losses"] == 0 and counts["foreign"] == 0, r.table()
    for kind, counts in r.cursorsync.items():
        assert counts["duplicates"] == 0 and counts["deliveries"] == 0, r.table()
        sub = sync_subscription(kind)
        for topic in (s.partitioned_topic, s.plain_topic):
            for p in testbed.partitions(topic):
                md = r.target_marks[sub][p]  # before the failover check's consumers
                last = last_data_entry(testbed, p)
                assert Position.parse(md) >= last, (p, md, last)
    return r



def test_killed_mid_batch_and_restarted_from_its_checkpoint(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """The sync query dies after emitting and before its tables are written; the job
    restarts from its checkpoint, re-runs the batch and goes on."""
    r = demo(bed=testbed, spec=spec(topic_name, seed=13), work_dir=str(tmp_path),
             crash_sync_batch=4)
    assert r.injected_crashes == 1 and r.restarts >= 1, r.table()
    check(r)


def test_mapping_killed_after_its_probe_claimed_skipped_ids_and_restarted(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """The mapping query dies in the middle of a run of skipped ids: the probe acked past
    them and nothing is written. The job restarts from its checkpoint and the batch is read
    again, its ids now before the new process's probe (placed again, at the first of them):
    nothing lost, every duplicate explained. (With ``verified`` a replayed check is the same
    raw-entry reads again: nothing carries over.)"""
    r = demo(bed=testbed, spec=spec(topic_name, seed=19), work_dir=str(tmp_path),
             crash_mapping_claims=True, holes="probe")
    # A loaded machine may add restarts of its own (a Python worker slow to start).
    assert r.injected_crashes == 1 and r.restarts >= 1, r.table()
    check(r)
    for counts in r.cursorsync.values():
        assert counts["duplicates"] == counts["partial_batch"] + counts["chunked"] + counts[
            "acked_after_sync"], r.table()


def test_emission_spread_across_executors(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """Each Spark task translates, guards and emits for its topic partitions."""
    r = demo(bed=testbed, spec=spec(topic_name, seed=17, chunked_topic=None),
             work_dir=str(tmp_path), spread=True)
    check(r)


def test_identity_scope_batched_on_stamping_brokers(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """4.0.x stamps every replicated entry: identity only for batches maps everything."""
    r = demo(bed=testbed, spec=spec(topic_name, seed=19, chunked_topic=None),
             work_dir=str(tmp_path), identity_scope="batched")
    check(r)
    for counts in r.cursorsync.values():
        assert counts["duplicates"] == counts["partial_batch"], r.table()


@pytest.fixture
def delta_spark_jars() -> Iterator[str]:
    """The Delta jars, in a JVM of this test's own (pyspark fixes the driver's classpath
    when it launches the JVM)."""
    from cursorsync_devtools.testbed.delta_jars import ensure_delta_jars
    from tests.support.spark_jvm import shut_down_jvm

    jars = ",".join(str(p) for p in ensure_delta_jars())
    shut_down_jvm()
    try:
        yield jars
    finally:
        shut_down_jvm()


def test_the_job_on_the_delta_spark_backend(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path,
        delta_spark_jars: str) -> None:
    r = demo(bed=testbed, spec=spec(topic_name, seed=23, chunked_topic=None),
             work_dir=str(tmp_path), backend="delta-spark",
             spark_conf={"spark.jars": delta_spark_jars,
                         "spark.databricks.delta.snapshotPartitions": "1"})
    check(r)
