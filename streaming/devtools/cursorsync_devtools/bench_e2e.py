"""End-to-end benchmark on the real test bed (``cursorsync-dev bench e2e``).

Every figure is printed beside a baseline measured in the same run, on the same
brokers and cores, because absolute rates on a shared machine say little:

1. **Mapping ingestion.** A backlog is produced on a (a partitioned topic,
   asynchronous sends, a share of batches) and replicated to b. The baseline:
   plain pulsar-client Readers read every backlog entry of the clusters the job
   reads (b, and a too with identity evidence), one per topic partition, as
   many at a time as Spark has cores. Then the job starts and the time until
   its mapping query has ingested the whole backlog gives entries/s from job
   start and warm (after the first mapping batch, which pays for Spark's Python
   workers). The ``mappings`` table is then checked against ground truth: each
   backlog entry's position on a (send receipts) and on b (a Reader, by key).
2. **Sync lag.** A live workload on another partitioned topic, at a paced rate,
   acked alike on ``sync-shared`` (synced by the job) and ``builtin-shared``
   (Pulsar's replicated subscription state): per entry, the time from its ack on
   a until b's cursor covered its counterpart (:mod:`cursorsync_devtools.testbed.lag`).
3. **Failover.** The job stops; both subscriptions are drained on b and every
   delivery counted (:mod:`cursorsync_devtools.testbed.failover`).
4. **CPU-seconds per process group** in each phase (:mod:`cursorsync_devtools.testbed.cpu`),
   and per mapping batch.

Nothing here asserts a time: the tests check the report's structure and its
correctness facts only.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cursorsync.app.session import LOCAL_MASTER
from cursorsync.core.positions import Position
from cursorsync.errors import CursorSyncError
from cursorsync_devtools.batch_figures import phase_cpu_seconds, phase_seconds, trigger_phases
from cursorsync_devtools.bench_e2e_report import table
from cursorsync_devtools.bench_phases import BenchError, Phases
from cursorsync_devtools.testbed.cpu import CpuSampler
from cursorsync_devtools.testbed.lag import LiveSpec

log = logging.getLogger(__name__)

SYNC = "sync-shared"
BUILTIN = "builtin-shared"
#: Seconds of the live topic's first traffic its lag is also given apart for.
FIRST_WINDOW_S = 10.0
#: How many progress updates a query keeps (Spark's conf; its default is 100).
PROGRESS_KEPT = "spark.sql.streaming.numRecentProgressUpdates"


@dataclass(frozen=True)
class E2ESpec:
    """What the benchmark runs. The defaults are the ``cursorsync-dev bench e2e`` run."""

    backlog_topic: str = "bench-backlog"
    #: Entries of the backlog on a, all partitions together.
    backlog_entries: int = 200_000
    partitions: int = 4
    batched_fraction: float = 0.2
    batch_size: int = 5
    live_topic: str = "bench-live"
    live_partitions: int = 2
    #: Messages per second of the live workload, and for how long.
    rate_per_s: float = 200.0
    live_seconds: float = 60.0
    late_fraction: float = 0.1
    #: A live workload of this many seconds on a topic of its own comes before the measured
    #: one, with the job running: a bed just started answers its first live traffic with
    #: replicated subscriptions slowly (every admin request 4-5 times slower in its first
    #: 10 s; a pause before it changes nothing), and the lag is meant for a running
    #: system, not a cold one. Its lag is reported apart. 0: none.
    warm_up_topic: str = "bench-warm-up"
    warm_up_seconds: float = 20.0
    trigger_interval_s: float = 1.0
    #: spark.max_entries_per_batch; None: the embedded config's.
    max_entries_per_batch: int | None = None
    strategies: tuple[str, ...] = ("position-property", "identity")
    identity_scope: str = "all"
    #: How often b's cursors are read in the live phase: the lag's resolution.
    poll_interval_s: float = 0.1
    #: How long after the last ack on a both cursors on b may take to cover everything.
    settle_timeout_s: float = 30.0
    replication_timeout_s: float = 600.0
    mapping_timeout_s: float = 600.0
    #: managedLedgerMaxEntriesPerLedger on a and b when the benchmark starts its own test
    #: bed: ledgers still roll, at different places on each side.
    entries_per_ledger: tuple[int, int] = (5000, 3500)
    seed: int = 11

    def __post_init__(self) -> None:
        if self.backlog_entries < self.partitions or self.partitions < 1:
            raise BenchError(f"backlog_entries ({self.backlog_entries}) must be >= partitions "
                             f"({self.partitions}) >= 1")
        if self.live_partitions < 1 or self.rate_per_s <= 0 or self.batch_size < 2:
            raise BenchError("live_partitions >= 1, rate_per_s > 0 and batch_size >= 2 needed")
        if self.warm_up_seconds < 0:
            raise BenchError(f"warm_up_seconds ({self.warm_up_seconds}) must be >= 0")

    def live(self) -> LiveSpec:
        return LiveSpec(self.live_topic, self.live_partitions, self.rate_per_s,
                        self.live_seconds, self.batched_fraction, self.batch_size,
                        self.late_fraction, seed=self.seed + 1)

    def warm_up(self) -> LiveSpec:
        return replace(self.live(), topic=self.warm_up_topic, seconds=self.warm_up_seconds,
                       seed=self.seed + 2)

    @property
    def topics(self) -> list[str]:
        """The topics the job syncs."""
        return [self.backlog_topic, self.live_topic,
                *([self.warm_up_topic] if self.warm_up_seconds else [])]

    @property
    def identity(self) -> bool:
        return "identity" in self.strategies


# ------------------------------------------------------------------------ the run


def bench_e2e(spec: E2ESpec | None = None, *, bed: Any = None, work_dir: str | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every phase and return the report (see :func:`table` for its reading).

    ``bed``: a running :class:`~cursorsync_devtools.testbed.TestBed` (the tests share one); None
    starts one with ``spec.entries_per_ledger`` and stops it at the end.
    """
    from cursorsync_devtools.testbed import TestBed, TestBedConfig

    spec = spec or E2ESpec()
    say = progress or (lambda msg: log.info("bench e2e: %s", msg))
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cursorsync-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        if bed is not None:
            report = _run(bed, root, spec, say)
        else:
            say("starting the test bed")
            own = TestBed(TestBedConfig(work_dir=root / "pulsar",
                                        entries_per_ledger=spec.entries_per_ledger))
            try:
                own.start()  # stops what it started if it fails
            except CursorSyncError as err:
                raise BenchError(f"the test bed did not start: {err}") from err
            try:
                report = _run(own, root, spec, say)
            finally:
                own.stop()
    finally:
        if not work_dir:
            shutil.rmtree(root, ignore_errors=True)
    report["total_s"] = round(time.monotonic() - t0, 1)
    return report


def _run(bed: Any, root: Path, spec: E2ESpec, say: Callable[[str], None]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from cursorsync.app.session import build_session
    from cursorsync_devtools.testbed.ingestion import check_mapping
    from cursorsync_devtools.testbed.produce import Plan, entries_of, produce

    cpu = CpuSampler({name: c.pid for name, c in bed.clusters.items()})
    phase = Phases(cpu, say)
    config = _config(bed, root, spec)
    report: dict[str, Any] = {"benchmark": "e2e", "spec": asdict(spec), "machine": _machine()}
    with phase("backlog"):
        parts = bed.create_topic(spec.backlog_topic, spec.partitions)
        for topic in spec.topics[1:]:
            bed.create_topic(topic, spec.live_partitions)
            _target_subscription(bed, topic)
        retention_subscriptions(bed, spec.backlog_topic)
        t = time.monotonic()
        backlog = produce(bed, Plan.of(parts, spec.backlog_entries,
                                       batched_fraction=spec.batched_fraction,
                                       batch_size=spec.batch_size, seed=spec.seed))
        produce_s = time.monotonic() - t
        replicate_s = bed.wait_replicated([spec.backlog_topic],
                                          timeout_s=spec.replication_timeout_s)
    entries = entries_of(backlog)
    report["backlog"] = {
        "topic": bed.topic(spec.backlog_topic), "partitions": spec.partitions,
        "entries": len(entries), "messages": len(backlog),
        "batched_entries": sum(1 for m in entries.values() if m[0].batch_size),
        "produce_s": round(produce_s, 2), "replicate_s": round(replicate_s, 2)}
    messages = Counter(m.topic for m in backlog)
    # Where each message is on b, read before the job acks the backlog on its retention
    # subscription (the broker may then delete the ledgers).
    with phase("positions on b"):
        on_b = _on_target(bed, messages)
    with phase("baseline"):
        baseline = _baseline(bed, config, spec, messages, len(entries))
    had_session = SparkSession.getActiveSession() is not None
    with phase("spark start-up"):
        spark = build_session(config)
    report["spark_startup_s"] = phase.done[-1]["seconds"]
    try:
        mapping, failover, lag = _with_job(bed, config, spec, spark, cpu, phase, report)
    finally:
        if not had_session:
            spark.stop()
    with phase("mapping check"):
        mapping["check"] = check_mapping(config, backlog, on_b)
    mapping["baseline"] = baseline
    for figure in ("warm", "from_start"):
        rate = mapping[f"entries_per_s_{figure}"]
        mapping[f"ratio_{figure}"] = round(rate / baseline["entries_per_s"], 2) if rate else None
    report.update(mapping=mapping, lag=lag, failover=failover, phases=phase.done)
    return report


def _with_job(bed: Any, config: Any, spec: E2ESpec, spark: Any, cpu: CpuSampler,
              phase: Phases, report: Mapping[str, Any],
              ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The phases the job runs in: mapping ingestion, live lag; then failover without it."""
    from cursorsync.app.job import start_job
    from cursorsync_devtools.testbed.failover import count, drain
    from cursorsync_devtools.testbed.ingestion import (
        MappingRecorder,
        mapping_figures,
        wait_ingested,
    )

    recorder = MappingRecorder(cpu)
    want = {config.target.name: report["backlog"]["entries"]}
    if spec.identity:  # the source stream hands on the entries it digests
        want[config.source.name] = (report["backlog"]["batched_entries"]
                                    if spec.identity_scope == "batched"
                                    else report["backlog"]["entries"])
    job = None
    try:
        with phase("mapping"):
            t0, cpu0 = time.monotonic(), cpu.sample()
            job = start_job(config, spark=spark, metrics=recorder)
            covered = wait_ingested(job, recorder, want, spec.mapping_timeout_s)
        mapping = mapping_figures(job, recorder.done()[:covered + 1], t0, cpu0,
                                   report["backlog"]["entries"], config.target.name)
        warm_up = None
        if spec.warm_up_seconds:
            with phase("warm-up"):
                warm_up = _warm_up(bed, job, spec)
                phase.workload(warm_up["workload_cpu_s"])
        with phase("live"):
            result, lag = _live(bed, job, spec, config)
            phase.workload(lag["workload_cpu_s"])
        lag["warm_up"] = warm_up
        lag["batch_phases_mean_s"] = phase_seconds(recorder)
        lag["batch_phases_cpu_mean_s"] = phase_cpu_seconds(recorder)
    finally:
        if job is not None:
            job.stop()
    with phase("failover"):
        subs = (SYNC, BUILTIN)
        with ThreadPoolExecutor(len(subs)) as pool:
            drained = list(pool.map(lambda s: drain(bed, spec.live_topic, s, "Shared"), subs))
        failover = {name: count(result, sub, got).to_dict()
                    for name, sub, got in zip(("cursorsync", "builtin"), subs, drained,
                                              strict=True)}
    return mapping, failover, lag


def _baseline(bed: Any, config: Any, spec: E2ESpec, messages: Mapping[str, int],
              entries: int) -> dict[str, Any]:
    """Plain Readers over every backlog entry of the clusters the job reads."""
    from cursorsync_devtools.testbed.readers import reader_rate

    clusters = ["b", "a"] if spec.identity else ["b"]
    reads = [(bed.service_url(c), topic, n) for c in clusters for topic, n in messages.items()]
    rate = reader_rate(reads, processes=spark_cores(config.spark.master or LOCAL_MASTER),
                       receiver_queue_size=config.target.receiver_queue_size)
    return {"clusters": clusters, "readers": rate.readers, "processes": rate.processes,
            "messages_read": rate.messages, "entries_read": entries * len(clusters),
            "seconds": round(rate.seconds, 2),
            "entries_per_s": round(entries / rate.seconds, 1)}


def spark_cores(master: str) -> int:
    """Task slots of a ``local[N]`` master (``local[*]``: the machine's cores); else 2."""
    inside = master.partition("[")[2].partition("]")[0].split(",")[0]
    if inside == "*":
        return os.cpu_count() or 2
    return int(inside) if inside.isdigit() else 2


def _live(bed: Any, job: Any, spec: E2ESpec, config: Any) -> tuple[Any, dict[str, Any]]:
    """The live workload, b's cursors polled meanwhile and until they cover it; the lags,
    and cursorsync's split by stage."""
    live = spec.live()
    live_from = time.time()
    result, on_b, changes, lag = _measured_live(bed, job, spec, live)
    plan = live.plan(bed.partitions(live.topic))
    decisions = live.decisions(plan)
    late = sum(1 for _, key, _, index in plan.messages()
               if index <= 0 and decisions[key][0].kind == "late")
    lag.update(entries=plan.entry_count(), late_entries=late)
    lag["cursorsync_stages"] = _stages(config, result, on_b, changes, bed.topic(live.topic))
    lag["spark_phases"] = trigger_phases(
        {q.name: [json.loads(p.json) for p in q.recentProgress] for q in job.queries},
        live_from)
    return result, lag


def _warm_up(bed: Any, job: Any, spec: E2ESpec) -> dict[str, Any]:
    """The warm-up workload, measured as the live one is: the lag of a cold bed's first
    live traffic."""
    _, _, _, lag = _measured_live(bed, job, spec, spec.warm_up())
    return lag


def _measured_live(bed: Any, job: Any, spec: E2ESpec, live: LiveSpec,
                   ) -> tuple[Any, dict[str, Position], Any, dict[str, Any]]:
    """``live`` run with b's cursors polled meanwhile and until they cover it: the
    workload's result, where its messages are on b, the cursors' changes, and the lag of
    both subscriptions."""
    from cursorsync.app.job import query_failure
    from cursorsync_devtools.testbed.apart import in_own_process
    from cursorsync_devtools.testbed.lag import (
        CursorPoller,
        lag_of,
        lag_windows,
        run_live,
        uncovered,
    )
    from cursorsync_devtools.testbed.workload import verify_source_cursors

    poller = CursorPoller(bed.admin_url("b"), bed.topic(live.topic), (SYNC, BUILTIN),
                          spec.poll_interval_s).start()
    individual = {SYNC: True, BUILTIN: False}
    try:
        # In a process of its own, as a user's clients are: not the driver's interpreter.
        workload = in_own_process(run_live, bed, live, {SYNC: False, BUILTIN: True})
        result = workload.value
        verify_source_cursors(bed, result)
        bed.wait_replicated([live.topic])
        on_b = _on_target(bed, Counter(m.topic for m in result.messages))
        deadline = time.monotonic() + spec.settle_timeout_s
        while any(uncovered(result, s, on_b, poller.changes, individual=i)
                  for s, i in individual.items()) and time.monotonic() < deadline:
            for q in job.queries:
                if q.exception() is not None:
                    raise query_failure(q.name, q.exception())
            time.sleep(0.5)
    finally:
        poller.stop()
    lag = {"topic": bed.topic(live.topic), "partitions": live.partitions,
           "rate_per_s": live.rate_per_s, "seconds": round(result.finished_at
                                                           - result.started_at, 1),
           "messages": len(result.messages), "poll_interval_s": spec.poll_interval_s,
           "polls": poller.polls, "poll_errors": poller.errors,
           "workload_cpu_s": round(workload.cpu_s, 2),
           "settled_after_last_ack_s": round(time.time() - result.last_ack_at, 1)}
    for name, sub in (("cursorsync", SYNC), ("builtin", BUILTIN)):
        lag[name] = lag_of(result, sub, on_b, poller.changes,
                           individual=individual[sub]).figures()
        lag[name]["by_window"] = lag_windows(result, sub, on_b, poller.changes,
                                             individual=individual[sub], split_s=FIRST_WINDOW_S)
    return result, on_b, poller.changes, lag


def _stages(config: Any, result: Any, on_b: Mapping[str, Position], changes: Any,
            topic: str) -> dict[str, Any]:
    """cursorsync's lag by stage, from the rows its tables hold of the live topic."""
    from cursorsync.tables import RowFilter, open_store
    from cursorsync_devtools.testbed.lag_stages import entry_times, figures, figures_by_window

    store = open_store(config.tables.backend, config.tables.path)
    rows = RowFilter(topics=(topic,))
    times = entry_times(result, SYNC, on_b, changes, store.read("cursor_states", rows),
                        store.read("mappings", rows), store.read("sync_progress", rows))
    return {**figures(times), "by_window": figures_by_window(
        times, result.started_at, FIRST_WINDOW_S)}


def _on_target(bed: Any, messages: Mapping[str, int]) -> dict[str, Position]:
    from cursorsync_devtools.testbed.readers import positions_by_key

    return positions_by_key(bed, "b", messages)


def _target_subscription(bed: Any, topic: str) -> None:
    """b's ``sync-shared`` at the earliest position before anything is produced, as a DR
    site's consumers would have it (the built-in makes its own)."""
    import pulsar

    bed.client("b").subscribe(bed.topic(topic), SYNC, consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest,
                              receiver_queue_size=1).close()


def retention_subscriptions(bed: Any, topic: str) -> None:
    """The mapping query's subscriptions on both clusters before the backlog, as a job
    running before the traffic has them: without a subscription a broker deletes a
    topic's rolled ledgers once its replicator has passed them."""
    import pulsar

    for cluster in ("a", "b"):
        side = "source" if cluster == "a" else "target"
        bed.client(cluster).subscribe(
            bed.topic(topic), f"cursorsync-mapping-{side}",
            consumer_type=pulsar.ConsumerType.Failover,
            initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1).close()


def _config(bed: Any, root: Path, spec: E2ESpec) -> Any:
    from cursorsync.app.settings import parse_config
    from cursorsync_devtools.demo import demo_config

    cfg = demo_config(bed, root, topics=spec.topics,
                      subscriptions=[SYNC], strategies=list(spec.strategies),
                      identity_scope=spec.identity_scope)
    data = cfg.model_dump(mode="json", by_alias=True)
    data["spark"]["trigger_interval_s"] = spec.trigger_interval_s
    # Every batch of the live phase in the queries' recent progress (Spark keeps 100).
    data["spark"]["conf"][PROGRESS_KEPT] = "2000"
    if spec.max_entries_per_batch is not None:
        data["spark"]["max_entries_per_batch"] = spec.max_entries_per_batch
    return parse_config(data)


def _machine() -> dict[str, Any]:
    from cursorsync_devtools.testbed import PULSAR_VERSION

    return {"cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "platform": platform.platform(terse=True),
            "pulsar": PULSAR_VERSION}


# ------------------------------------------------------------------------ report


def run_e2e(*, seconds: float = 60.0, json_output: bool = False, backlog: int | None = None,
            strategies: tuple[str, ...] | None = None, identity_scope: str | None = None,
            spec: E2ESpec | None = None, bed: Any = None) -> str:
    """``cursorsync-dev bench e2e``: the default run (or ``spec``) with a live phase of
    ``seconds``; the text report, or JSON."""
    spec = replace(spec or E2ESpec(), live_seconds=seconds)
    if backlog is not None:
        spec = replace(spec, backlog_entries=backlog)
    if strategies is not None:
        spec = replace(spec, strategies=tuple(strategies))
    if identity_scope is not None:
        spec = replace(spec, identity_scope=identity_scope)
    report = bench_e2e(spec, bed=bed)
    return json.dumps(report, indent=2, sort_keys=True) if json_output else table(report)
