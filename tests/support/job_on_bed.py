"""The job running on the real test bed: the topics and traffic the tests give it, and
what they read of b's cursors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.app.job import failure_of, run_job
from cursorsync.app.settings import Config
from cursorsync.core.positions import Position
from cursorsync.errors import ConfigError, CursorSyncError
from cursorsync_devtools.demo import caught_up, demo_config
from cursorsync_devtools.demo_report import TABLE_ROWS
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import FailoverCounts, failover_by_origin
from cursorsync_devtools.testbed.workload import WorkloadResult, verify_source_cursors

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

#: How long a job's sync must send no ack, after its mapping last read entries, to count as
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
    #: From the workload's last ack on a until the wait for the job ended.
    caught_up_s: float

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
                f"{self.caught_up}, {self.caught_up_s:.0f} s after the last ack on a\n"
                + "\n".join(lines))


def three_cluster_config(bed: TestBed, topics: Sequence[str], strategies: Sequence[str],
                         work_dir: Path) -> Config:
    """The embedded config syncing a -> b: the topics, the strategy list's subscription,
    tables and checkpoints under ``work_dir``."""
    return demo_config(bed, work_dir, topics=list(topics),
                       subscriptions=[strategy_subscription(strategies)],
                       strategies=list(strategies))


def refusal(config: Config) -> CursorSyncError | None:
    """What ``cursorsync check`` says when it refuses the configured evidence for the
    topics' replication (its problem finding, as an error), else None."""
    from cursorsync.app.preflight import check, problems

    found = [f for f in problems(check(config)) if f.what.startswith("evidence ")]
    return ConfigError(found[0].detail) if found else None


def refused_start(config: Config) -> None:
    """Start the job and let it run two batches, as ``cursorsync run`` would, then stop it:
    raises what a job that refuses the config raises, at its start or in its first
    batches."""
    from cursorsync.app.job import start_job

    job = start_job(config)
    try:
        if not job.wait_batches(2, timeout_s=120):
            raise AssertionError("the job ran fewer than two batches in 120 s")
        failure = failure_of(job)
        if failure is not None:
            raise failure
    finally:
        job.stop()


@dataclass
class ThreeClusterRuns:
    """The jobs of one three-cluster workload: per strategy list, its run, or what its
    start raised."""

    result: WorkloadResult
    configs: dict[tuple[str, ...], Config]
    runs: dict[tuple[str, ...], ThreeClusterRun | CursorSyncError]


def run_three_clusters(bed: TestBed, spec: Any, configs: dict[tuple[str, ...], Config], *,
                       timeout_s: float = 240.0) -> ThreeClusterRuns:
    """One live workload (:mod:`cursorsync_devtools.testbed.three_clusters`, topics made) with
    a job per strategy list running through it, as ``cursorsync run`` starts it (each in a
    Spark session of its own, so their queries' names do not clash; one SparkContext), each
    syncing its own subscription a -> b into its own tables and checkpoints. When every job
    has caught up, all stop, and each subscription fails over to b and is counted per
    origin. A job whose start raises is not run; its error is its outcome."""
    from cursorsync.app.job import start_job
    from cursorsync.app.session import build_session
    from cursorsync_devtools.testbed.three_clusters import run_three_cluster_workload
    from tests.support.spark_jvm import shut_down_jvm

    # A JVM of their own: a Python data source registered on the default session (an
    # earlier test's job) cannot be registered again on a new session, and the new session
    # cannot see it either (DATA_SOURCE_ALREADY_EXISTS, then DATA_SOURCE_NOT_FOUND; pyspark
    # 4.2). Each job's session here is a new one of a default session none registered on.
    shut_down_jvm()

    jobs: dict[tuple[str, ...], Any] = {}
    runs: dict[tuple[str, ...], ThreeClusterRun | CursorSyncError] = {}
    done_at: dict[tuple[str, ...], float] = {}
    try:
        for strategies, config in configs.items():
            try:
                spark = build_session(config).newSession()
                jobs[strategies] = start_job(config, spark=spark)
                jobs[strategies].wait_batches(1, timeout_s=120)
            except CursorSyncError as err:
                runs[strategies] = err
                if strategies in jobs:
                    jobs.pop(strategies).stop()
        result = run_three_cluster_workload(bed, spec)
        verify_source_cursors(bed, result)
        how: dict[tuple[str, ...], str] = {}
        for strategies, job in list(jobs.items()):
            config = configs[strategies]
            (sub,) = config.topics[0].subscriptions
            partitions = {t.topic: bed.partitions(t.topic) for t in config.topics}
            try:
                jobs[strategies], how[strategies] = _wait_synced(
                    job, config, result, sub, partitions, timeout_s)
                done_at[strategies] = time.time()
            except CursorSyncError as err:  # a refusal in a batch, or a query that failed
                runs[strategies] = err
                del jobs[strategies]  # stopped by _wait_synced
    finally:
        for job in jobs.values():
            job.stop()

    def count(strategies: tuple[str, ...]) -> ThreeClusterRun:
        (sub,) = configs[strategies].topics[0].subscriptions
        counts = failover_by_origin(bed, result, sub, "Shared", synced_at=result.last_ack_at)
        return ThreeClusterRun(strategies, sub, counts, how[strategies],
                               done_at[strategies] - result.last_ack_at)

    with ThreadPoolExecutor(max(1, len(jobs))) as pool:
        for strategies, run in zip(jobs, pool.map(count, jobs), strict=True):
            runs[strategies] = run
    return ThreeClusterRuns(result, configs, runs)


def _wait_synced(job: Any, config: Config, result: WorkloadResult, sub: str,
                 partitions: dict[str, list[str]], timeout_s: float) -> tuple[Any, str]:
    """Until the job has caught up (the demo's test) or, short of that, settled; the job
    (a restarted one, after a query failed) and how it ended.

    Settled: the mapping has read entries (the workload is over, so that is all of them),
    and for SETTLE_S after that and after the last batch that sent acks, at least three
    sync batches ran and none sent an ack. Whatever it raises, it stops the job first."""
    running = [job]  # a restart replaces it
    try:
        return _wait(running, config, result, sub, partitions, timeout_s)
    except BaseException:
        running[0].stop()
        raise


def _wait(running: list[Any], config: Config, result: WorkloadResult, sub: str,
          partitions: dict[str, list[str]], timeout_s: float) -> tuple[Any, str]:
    from cursorsync.app.job import QueryFailedError, restart
    from cursorsync.tables import RowFilter, open_store

    job = running[0]
    chunked = {t for t in partitions if result.spec.chunked_topic
               and t.endswith("/" + result.spec.chunked_topic)}
    store = open_store(config.tables.backend, config.tables.path, spark=job.spark)
    deadline = time.monotonic() + timeout_s
    mapped_at: float | None = None  # the end of the last mapping batch that read entries
    acked_at = 0.0  # when a sync batch last sent acks
    checked_at: float | None = None
    seen_sync = seen_mapping = -1
    emitted: dict[int, float] = {}  # sync batch id -> when it emitted
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
            # restart raises what an operator must fix
            job = running[0] = restart(job, config, err, restarts)
            mapped_at = checked_at = None
            seen_mapping = -1
            continue
        for progress in job.queries[0].recentProgress:
            p = json.loads(progress.json)
            if p["batchId"] > seen_mapping:
                seen_mapping = p["batchId"]
                if p.get("numInputRows", 0):
                    began = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
                    mapped_at = (began.timestamp()
                                 + p.get("durationMs", {}).get("triggerExecution", 0) / 1000)
        if job.mapping_sink.skipped_waiting:
            checked_at = None
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
        for r in rows:
            at = r["emitted_at"].replace(tzinfo=UTC).timestamp()
            emitted[r["batch_id"]] = max(at, emitted.get(r["batch_id"], at))
            if r["acks_sent"]:
                acked_at = max(acked_at, at)
            seen_sync = max(seen_sync, r["batch_id"])
        if mapped_at is None:
            why = f"the mapping's first batch that reads entries ({why})"
            continue
        quiet_from = max(mapped_at, acked_at)
        quiet_batches = sum(at > quiet_from for at in emitted.values())
        if time.time() - quiet_from >= SETTLE_S and quiet_batches >= 3:
            return job, f"settled ({why})"
