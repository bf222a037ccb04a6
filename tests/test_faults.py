"""Faults on the real test bed, each checked by counting deliveries on b after failover:
0 losses and no foreign message acked in every run, and the job goes on by itself.

The job-kill series runs 3 seeds in CI; CURSORSYNC_SLOW=1 runs 20.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cursorsync_devtools.demo import DemoReport, demo
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.admin_proxy import AdminProxy, faulty_for
from cursorsync_devtools.testbed.workload import WorkloadSpec

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KILL_SEEDS = range(20) if os.environ.get("CURSORSYNC_SLOW") == "1" else range(3)


def spec(topic_name: Callable[[str], str], **kwargs: Any) -> WorkloadSpec:
    base: dict[str, Any] = dict(
        partitioned_topic=topic_name("orders"), plain_topic=topic_name("audit"),
        chunked_topic=None, entries_per_partition=60, produce_seconds=3.0)
    return WorkloadSpec(**{**base, **kwargs})


def safe(report: DemoReport) -> None:
    """The rule: nothing lost, nothing foreign acked, for every subscription type."""
    for ours in report.cursorsync.values():
        assert ours["losses"] == 0, report.table()
        assert ours["foreign_acked"] == 0, report.table()
        assert ours["messages"] > 0, report.table()


def test_the_admin_api_failing_for_a_while(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """Both admin APIs answer 503, hang past the client's timeout or return malformed JSON
    for every third request during the first 25 s; the job skips, retries and restarts
    its way through and then syncs: 0 losses after failover."""
    with AdminProxy(testbed.admin_url("a"), faulty_for(25.0)) as a, \
            AdminProxy(testbed.admin_url("b"), faulty_for(25.0)) as b:
        r = demo(bed=testbed, spec=spec(topic_name, seed=21), work_dir=str(tmp_path),
                 admin_urls={"a": a.url, "b": b.url}, timeout_s=300)
        counts = a.counts + b.counts
    safe(r)
    for fault in ("5xx", "malformed", "hang", "pass"):
        assert counts[fault] > 0, counts


@pytest.mark.parametrize("seed", KILL_SEEDS)
def test_the_job_killed_at_a_seeded_point(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path, seed: int) -> None:
    """The sync query dies in a seeded batch, after its acks went out and before its tables
    were written; the job restarts from its checkpoints and nothing is lost."""
    batch = random.Random(seed).randint(1, 5)
    r = demo(bed=testbed, spec=spec(topic_name, seed=100 + seed), work_dir=str(tmp_path),
             crash_sync_batch=batch)
    safe(r)
    assert r.restarts == 1, (batch, r.table())


@pytest.mark.parametrize("cluster", ["a", "b"])
def test_a_broker_killed_and_restarted_under_the_job(
        own_testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path,
        cluster: str) -> None:
    """A broker is SIGKILLed while the job runs and comes back on its stored state; the
    job goes on by itself (skipped polls, restarted queries), b follows a again, and b
    redelivers nothing a acked. When a crashes, its replicator sends entries again, and
    b's second copies are acked with the first."""
    testbed = own_testbed
    import pulsar

    from cursorsync.app.job import failure_of, restart, start_job
    from cursorsync_devtools.demo import demo_config

    sub = "sync-shared"
    topic = testbed.topic(topic_name(f"crash-{cluster}"))
    testbed.create_topic(topic)
    testbed.client("b").subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                                  initial_position=pulsar.InitialPosition.Earliest).close()

    def produce_and_ack(n: int) -> None:
        client = testbed.client("a")
        consumer = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer.send(f"m{i}".encode())
        producer.close()
        while True:
            try:
                consumer.acknowledge(consumer.receive(timeout_millis=2000))
            except pulsar.Timeout:
                break
        consumer.close()
        client.close()

    def b_follows_a(timeout_s: float) -> None:
        testbed.wait_replicated([topic], timeout_s=timeout_s)
        a_md = testbed.internal_stats("a", topic)["cursors"][sub]["markDeletePosition"]
        assert a_md == str(testbed.last_entry("a", topic)), a_md
        deadline = time.monotonic() + timeout_s
        while True:
            probe = testbed.client("b").subscribe(
                topic, "probe", receiver_queue_size=0, consumer_type=pulsar.ConsumerType.Shared)
            last = probe.get_last_message_id()
            probe.unsubscribe()
            md = testbed.internal_stats("b", topic)["cursors"][sub]["markDeletePosition"]
            led, ent = (int(x) for x in md.split(":"))
            if (led, ent) >= (last.ledger_id(), last.entry_id()):
                return
            assert time.monotonic() < deadline, f"b at {md}, last {last}"
            time.sleep(0.5)

    produce_and_ack(10)
    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[sub])
    job = start_job(config)
    try:
        b_follows_a(90)
        testbed.crash_and_restart(cluster)
        produce_and_ack(10)
        deadline = time.monotonic() + 240
        attempt = 0
        while True:
            failure = failure_of(job)
            if failure is not None:  # what `cursorsync run` does
                attempt += 1
                job = restart(job, config, failure, attempt)
            try:
                b_follows_a(5)
                break
            except Exception as err:  # b or a still coming back, or b not there yet
                if time.monotonic() > deadline:
                    raise AssertionError(f"b did not follow a after the restart: {err}") \
                        from err
    finally:
        job.stop()
    check = testbed.client("b").subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    try:
        with pytest.raises(pulsar.Timeout):
            check.receive(timeout_millis=2000)
    finally:
        check.close()
    if cluster == "a":  # the replicator sent entries again: b holds copies, all acked
        reader = testbed.client("b").create_reader(topic, pulsar.MessageId.earliest)
        copies = 0
        while reader.has_message_available():
            reader.read_next(10_000)
            copies += 1
        reader.close()
        assert copies > 20, copies
