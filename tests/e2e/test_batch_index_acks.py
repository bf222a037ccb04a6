"""Failover with batch-index acknowledgement on, as Pulsar 4.1 has it by default: the brokers
keep the acked messages of a partially acked batch (``acknowledgmentAtBatchIndexLevelEnabled``)
and a's consumers ack by batch index.

A restart on a delivers none of those messages again. With ``emission.batch_index_acks``
and cursorsync's broker plugin on the brokers, b holds the same batch indexes after the
sync, and a failover to b delivers none of them either; Pulsar's built-in replicated
subscriptions, beside it, deliver them. With it off (every other failover test) a restart on
a delivers them again too (tests/e2e/test_e2e.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pulsar
import pytest

from cursorsync.app.job import RunningJob, failure_of, start_job
from cursorsync.app.metrics import Metrics
from cursorsync.core.positions import Position
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.batch_acks import fetch_batch_acks
from cursorsync.sync.plans import IDLE_TARGET_READ_EVERY
from cursorsync_devtools.demo import demo, demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import drain
from tests.e2e.test_e2e import check, spec
from tests.support.entries import send_batches
from tests.support.job_on_bed import SUB, shared_topic

# A test bed of its own: batch-index acks on, the broker plugin loaded (about a minute).
pytestmark = [pytest.mark.integration, pytest.mark.spark]

BATCH = 5


def test_with_batch_index_acks_failover_to_b_delivers_what_a_restart_on_a_delivers(
        index_testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    r = demo(bed=index_testbed, spec=spec(topic_name, seed=23, batch_index_acks=True),
             work_dir=str(tmp_path), restart_on_source=True)
    check(r)
    assert r.batch_index_acks
    carried = False
    for kind, counts in r.cursorsync.items():
        restarted = r.source_restart[kind]
        # a's broker holds those acks: a restart there delivers none of them, and after the
        # sync neither does b; the built-in, which carries no batch index, does.
        assert restarted["partial_batch"] == 0 and restarted["losses"] == 0, r.table()
        assert counts["partial_batch"] == 0 and counts["losses"] == 0, r.table()
        assert r.builtin_source_restart[kind]["partial_batch"] == 0, r.table()
        carried |= r.builtin[kind]["partial_batch"] > 0
    assert carried, f"no partly acked batch in the workload:\n{r.table()}"


def _b_entry(bed: TestBed, topic: str, payload: bytes) -> Position:
    """The entry of b's copy of the message ``payload``."""
    reader = bed.client("b").create_reader(topic, pulsar.MessageId.earliest)
    try:
        while True:
            m = reader.read_next(10_000)
            if m.data() == payload:
                return Position(m.message_id().ledger_id(), m.message_id().entry_id())
    finally:
        reader.close()


def _holds(bed: TestBed, topic: str, cluster: str = "b") -> Mapping[Position, frozenset[int]]:
    with AdminClient(AdminSettings.from_urls(bed.admin_url(cluster), cluster=cluster)) as admin:
        return fetch_batch_acks(admin, topic, SUB).acked


def test_an_idle_cursors_new_batch_indexes_reach_the_target_within_a_few_batches(
        index_testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """A consumer on a that acks more of a partly acked batch and nothing else changes no
    field of a's internalStats: the cursor the sync keeps idle looks as it was. The
    plugin's batches digest of it moves, and the sync carries the new indexes at its next
    batches, long before the idle cursor's periodic recheck
    (:data:`~cursorsync.sync.plans.IDLE_TARGET_READ_EVERY` batches)."""
    bed = index_testbed
    topic = shared_topic(bed, topic_name("idle"))
    consumer = bed.client("a").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                         batch_index_ack_enabled=True)
    send_batches(bed.client("a"), topic, 2 * BATCH, BATCH, prefix="i")
    got = sorted((consumer.receive(10_000) for _ in range(2 * BATCH)),
                 key=lambda m: (m.message_id().ledger_id(), m.message_id().entry_id(),
                                m.message_id().batch_index()))
    first, second = got[:BATCH], got[BATCH:]
    assert len({m.message_id().entry_id() for m in first}) == 1
    for m in first[:3]:
        consumer.acknowledge(m)
    bed.wait_replicated([topic])
    on_b = _b_entry(bed, topic, first[0].data())

    metrics = Metrics()
    config = demo_config(bed, tmp_path, topics=[topic], subscriptions=[SUB],
                         batch_index_acks=True)
    job = start_job(config, metrics=metrics, serve_metrics=False)
    try:
        _until(lambda: _holds(bed, topic) == {on_b: frozenset({0, 1, 2})}, job, 180,
               "b holds the first three indexes")
        _until(lambda: (metrics.registry.get_sample_value("cursorsync_sync_idle_cursors")
                        or 0) >= 1, job, 120, "the sync keeps the cursor idle")
        consumer.acknowledge(first[3])
        start = job.sync_sink.last_batch
        _until(lambda: _holds(bed, topic) == {on_b: frozenset(range(4))}, job, 120,
               lambda: f"b holds the index acked on a's idle cursor: a holds "
               f"{_holds(bed, topic, 'a')}, b {_holds(bed, topic)}")
        took = job.sync_sink.last_batch - start
        assert took < IDLE_TARGET_READ_EVERY // 2, (
            f"{took} sync batches: the idle cursor waited for its recheck")
    finally:
        job.stop()
    consumer.close()
    # After failover b delivers exactly what a restart on a would.
    again = drain(bed, topic, SUB, "Shared", batch_index_acks=True)
    assert sorted(m.data() for m in again) == sorted(m.data() for m in [first[4], *second])


def _until(done: Callable[[], bool], job: RunningJob, timeout_s: float,
           what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        failure = failure_of(job)
        if failure is not None:
            raise failure
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: "
                                 f"{what() if callable(what) else what}")
        time.sleep(0.3)
