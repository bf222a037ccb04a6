"""The job running on the real test bed: the topics and traffic the tests give it, and
what they read of b's cursors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.app.job import run_job
from cursorsync.app.settings import Config
from cursorsync.core.positions import Position
from cursorsync.errors import ConfigError, CursorSyncError
from cursorsync_devtools.demo import TABLE_ROWS, caught_up, demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import FailoverCounts, failover_by_origin
from cursorsync_devtools.testbed.workload import WorkloadResult

#: The subscription the tests sync: Shared, on both clusters.
SUB = "sync-shared"


@contextmanager
def running(config: Any) -> Iterator[None]:
    """The job as `cursorsync run` runs it, with its restarts: a query that fails on a
    broker's transient error (a topic unloaded or deleted under it) starts again from its
    checkpoint."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            run_job(config, stop_event=stop)
        except BaseException as err:  # reported below
            errors.append(err)

    thread = threading.Thread(target=main, name="cursorsync-job", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)
    assert not errors, errors


def mark_delete(bed: TestBed, cluster: str, topic: str, subscription: str) -> Position:
    return Position.parse(bed.internal_stats(cluster, topic)["cursors"][subscription][
        "markDeletePosition"])


def last_data_entry(bed: TestBed, topic: str) -> Position:
    """b's last dispatchable entry (markers after it do not count)."""
    probe = bed.client("b").subscribe(topic, "probe", receiver_queue_size=0,
                                      consumer_type=pulsar.ConsumerType.Shared)
    try:
        mid = probe.get_last_message_id()
    finally:
        probe.unsubscribe()
    return Position(mid.ledger_id(), mid.entry_id())


def shared_topic(bed: TestBed, name: str, *, partitions: int = 0) -> str:
    """A topic with the Shared subscription SUB on b from its start, as the job finds it."""
    topic = bed.topic(name)
    bed.create_topic(topic, partitions=partitions)
    bed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest).close()
    return topic


def consumer_on_a(bed: TestBed, topic: str) -> pulsar.Consumer:
    """SUB on a, at Earliest: what the tests ack with."""
    return bed.client("a").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                     initial_position=pulsar.InitialPosition.Earliest)


def send_and_ack(bed: TestBed, topic: str, consumer: pulsar.Consumer, n: int) -> None:
    """n messages sent on a, then acked by ``consumer`` with whatever else it has."""
    producer = bed.client("a").create_producer(topic, batching_enabled=False,
                                               block_if_queue_full=True)
    for i in range(n):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    producer.close()
    for _ in range(n):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    ack_all(consumer, timeout_ms=200)


def ack_all(consumer: pulsar.Consumer, *, timeout_ms: int = 2000) -> None:
    """Ack what ``consumer`` receives until nothing comes for ``timeout_ms``."""
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return
        consumer.acknowledge(msg)


def nothing_redelivered_on_b(bed: TestBed, topic: str) -> None:
    """b's SUB has nothing left to deliver: every copy of what a acked is acked on b."""
    check = bed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
    try:
        with pytest.raises(pulsar.Timeout):
            check.receive(timeout_millis=2000)
    finally:
        check.close()


# ------------------------------------------------------------ three clusters (issue 34)

#: How long a job's sync must send no ack, with its mapping reading nothing new, to count as
#: done where its plans never come out exact (entries it cannot map stay unmapped).
SETTLE_S = 12.0


def strategy_subscription(strategies: Sequence[str]) -> str:
    """The subscription one strategy list syncs on the three-cluster bed."""
    return "sync-" + "-".join(strategies)


@dataclass
class ThreeClusterRun:
    """One strategy list's job on the three-cluster bed: what b delivered after failover,
    counted per origin of the messages."""

    strategies: tuple[str, ...]
    subscription: str
    by_origin: dict[str, FailoverCounts]
    #: How the wait for the job ended: ``exact`` (the demo's test: every plan exact with
    #: nothing unmapped, then a batch with nothing to send) or ``settled: <why not exact>``.
    caught_up: str
    seconds: float

    def total(self) -> FailoverCounts:
        out = FailoverCounts()
        for counts in self.by_origin.values():
            out = out.add(counts)
        return out

    def table(self) -> str:
        cols = {**{f"from {o}": c.to_dict() for o, c in sorted(self.by_origin.items())},
                "all": self.total().to_dict()}
        rows = [["", *cols]] + [[label, *(str(c[name]) for c in cols.values())]
                                for name, label in TABLE_ROWS]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                           for i, c in enumerate(r)) for r in rows]
        return (f"evidence {', '.join(self.strategies)} ({self.subscription}): caught up "
                f"{self.caught_up}; {self.seconds:.0f} s\n" + "\n".join(lines))


def three_cluster_config(bed: TestBed, result: WorkloadResult, strategies: Sequence[str],
                         work_dir: Path) -> Config:
    """The embedded config syncing a -> b, the workload's topics, one subscription."""
    return demo_config(bed, work_dir, topics=list(result.spec.topics()),
                       subscriptions=[strategy_subscription(strategies)],
                       strategies=list(strategies))


def refusal(config: Config) -> CursorSyncError | None:
    """What ``cursorsync check`` says when it refuses the config outright (a
    :class:`ConfigError`), else None."""
    from cursorsync.app.preflight import check

    try:
        check(config)
    except ConfigError as err:
        return err
    return None


def sync_and_fail_over(bed: TestBed, result: WorkloadResult, config: Config, *,
                       timeout_s: float = 240.0) -> ThreeClusterRun:
    """The job (as ``cursorsync run`` starts it, with its restarts) syncing the config's one
    subscription a -> b after the workload, until it has caught up; then the failover check
    on b, per origin. A job that refuses to start raises what it refused with."""
    from cursorsync.app.job import start_job

    t0 = time.monotonic()
    (sub,) = config.topics[0].subscriptions
    partitions = {t.topic: bed.partitions(t.topic) for t in config.topics}
    job = start_job(config)
    try:
        job, how = _wait_synced(job, config, result, sub, partitions, timeout_s)
    finally:
        job.stop()
    counts = failover_by_origin(bed, result, sub, "Shared", synced_at=result.last_ack_at)
    return ThreeClusterRun(tuple(config.evidence.strategies), sub, counts, how,
                           time.monotonic() - t0)


def _wait_synced(job: Any, config: Config, result: WorkloadResult, sub: str,
                 partitions: dict[str, list[str]], timeout_s: float) -> tuple[Any, str]:
    """Until the job has caught up (the demo's test) or, short of that, settled (no acks
    sent and nothing new mapped for SETTLE_S); the job (a restarted one, after a query
    failed) and how it ended."""
    from cursorsync.app.job import QueryFailedError, restart
    from cursorsync.tables import RowFilter, open_store

    chunked = {t for t in partitions if result.spec.chunked_topic
               and t.endswith("/" + result.spec.chunked_topic)}
    store = open_store(config.tables.backend, config.tables.path, spark=job.spark)
    deadline = time.monotonic() + timeout_s
    quiet_since = time.time()
    checked_at: float | None = None
    seen_sync = seen_mapping = -1
    restarts = 0
    why: float | str = "no sync batch yet"
    while True:
        if time.monotonic() > deadline:
            raise AssertionError(f"{sub}: the job neither caught up nor settled within "
                                 f"{timeout_s:.0f} s; it waits on {why}")
        try:
            job.wait_batches(1, timeout_s=max(1.0, deadline - time.monotonic()))
        except QueryFailedError as err:
            restarts += 1
            job = restart(job, config, err, restarts)  # raises what an operator must fix
            quiet_since, checked_at = time.time(), None
            continue
        if job.mapping_sink.skipped_waiting:
            quiet_since, checked_at = time.time(), None
            why = f"{job.mapping_sink.skipped_waiting} skipped target ids waiting for a check"
            continue
        checked_at = checked_at or time.time()
        why = caught_up(store, config, after=max(result.last_ack_at, checked_at),
                        since_batch=0, partitions=partitions, chunked=chunked)
        if not isinstance(why, str):
            return job, "exact"
        rows = store.read("sync_progress", RowFilter.of(
            subscription=sub, source_cluster=config.source.name,
            target_cluster=config.target.name, min_batch_id=seen_sync + 1)).to_pylist()
        if any(r["acks_sent"] for r in rows):
            quiet_since = time.time()
        seen_sync = max([seen_sync, *(r["batch_id"] for r in rows)])
        progress = job.queries[0].lastProgress
        if progress is not None:
            p = json.loads(progress.json)
            if p["batchId"] != seen_mapping and p.get("numInputRows", 0):
                quiet_since = time.time()
            seen_mapping = p["batchId"]
        if seen_sync >= 0 and time.time() - quiet_since >= SETTLE_S:
            return job, f"settled ({why})"

