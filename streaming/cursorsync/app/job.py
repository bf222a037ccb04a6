"""The Spark application: two streaming queries, one driver.

* **mapping**: ``pulsar-entries`` from the target (and the source, when
  identity evidence is on) -> :class:`cursorsync.mapping.builder.MappingBuilder` ->
  ``mappings`` table (:class:`cursorsync.mapping.sink.MappingSink`).
* **sync**: ``pulsar-cursors`` (source admin polling) -> the mapping from the
  ``mappings`` table -> :class:`cursorsync.sync.step.SyncStep` (translate, guard,
  emit) -> ``cursor_states`` and ``sync_progress`` tables
  (:class:`cursorsync.sync.sink.SyncSink`).

Both sinks are ``foreachBatch`` functions on the driver; every table write is
idempotent per (query, batch id), and the builder's state is saved per batch
id under the checkpoint, so a batch Spark re-runs after a crash produces the
same rows and re-sends only acks (idempotent on the broker). Before the queries
start, each checkpoint is matched with the tables and its batch ids are bound to
theirs (:mod:`cursorsync.app.checkpoint_match`).

Emission runs on the driver by default. With
``emission.spread_across_executors`` the sync batch is repartitioned by topic
partition and each Spark task translates, guards and emits for its share
(:mod:`cursorsync.sync.executors`), reading mappings and previous cursor states from
the Delta tables; the driver only writes the tables.

Each sink maintains its own tables between its batches
(:mod:`cursorsync.app.maintenance`).
"""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cursorsync.app.checkpoint_match import bind_checkpoints
from cursorsync.app.lease import Lease, held
from cursorsync.app.metrics import Metrics
from cursorsync.app.queries import Clients, mapping_sink, start_queries, sync_sink
from cursorsync.app.session import RESTARTABLE_CONF, build_session
from cursorsync.app.settings import Config
from cursorsync.app.streams import selection
from cursorsync.app.topology import start_topologies
from cursorsync.core.retention import LiveLedgers
from cursorsync.errors import CursorSyncError, RunIncompleteError
from cursorsync.mapping.probe_check import ProbeHoleCheck
from cursorsync.mapping.sink import MappingSink
from cursorsync.sync.sink import SyncSink
from cursorsync.tables import open_store
from cursorsync.tables.store import TableStore

log = logging.getLogger(__name__)


@dataclass
class RunningJob:
    """Handles of a started job, for the CLI, the demo and the tests."""

    spark: Any
    queries: list[Any]
    mapping_sink: MappingSink
    sync_sink: SyncSink
    emitter: Any
    admin: Any
    metrics_server: Any = None
    progress: Any = None
    source_admin: Any = None
    #: The source tail checks' client (:mod:`cursorsync.pulsar.dispatchable`).
    source_tail: Any = None
    stopped: bool = False

    def wait_batches(self, n: int, timeout_s: float) -> bool:
        """Until the sync query completed ``n`` more batches and the mapping query either did
        too or has nothing new to read (Spark runs no batch without new data)."""
        target_m = self.mapping_sink.last_batch + n
        target_s = self.sync_sink.last_batch + n
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            failure = failure_of(self)
            if failure is not None:
                raise failure
            status = self.queries[0].status
            # Idle once it has run a trigger (before that, its status says neither, too): a
            # job restarted from its checkpoint with nothing new runs no mapping batch at all.
            started = self.mapping_sink.last_batch >= 0 or self.queries[0].lastProgress
            mapping_idle = (bool(started) and not status["isDataAvailable"]
                            and not status["isTriggerActive"])
            if self.sync_sink.last_batch >= target_s and (
                    self.mapping_sink.last_batch >= target_m or mapping_idle):
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.progress is not None:
            self.progress.stop()
        for q in self.queries:
            try:
                q.stop()
            except Exception as err:
                log.warning("stopping query %s: %s", getattr(q, "name", "?"), err)
        if self.emitter is not None:
            self.emitter.close()
        check = self.mapping_sink.builder.hole_check
        if isinstance(check, ProbeHoleCheck):
            check.close()
        self.sync_sink.step.lookups.close()
        if self.source_tail is not None:
            self.source_tail.close()
        for admin in (self.admin, self.source_admin):
            if admin is not None:
                admin.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()


class _ProgressPoller:
    """Spark progress -> Prometheus gauges: one ``lastProgress`` call per query per trigger.

    A Python StreamingQueryListener would receive every event converted field by field
    over py4j, a steady cost on the driver during a backlog, for gauges that only need
    the latest value.
    """

    def __init__(self, queries: list[Any], metrics: Metrics, interval_s: float) -> None:
        self.queries = queries
        self.metrics = metrics
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._seen: dict[str, int] = {}
        self._failed: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="cursorsync-progress",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def poll(self) -> None:
        for q in self.queries:
            name = str(q.name)
            p = q.lastProgress
            if p is not None:
                progress = json.loads(p.json)
                if self._seen.get(name) != progress.get("batchId"):
                    self._seen[name] = progress.get("batchId")
                    self.metrics.observe_progress(progress)
            if name not in self._failed and not q.isActive and q.exception() is not None:
                self._failed.add(name)
                self.metrics.record_error("query")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as err:  # the session is going away; the next poll will tell
                log.debug("progress not recorded: %s", err)


def start_job(config: Config, *, spark: Any = None, emitter: Any = None,
              metrics: Metrics | None = None, dry_run: bool | None = None,
              serve_metrics: bool = True) -> RunningJob:
    """Start both queries and return at once; :meth:`RunningJob.stop` ends them.

    ``serve_metrics``: start the metrics endpoint too (a caller that restarts the job
    serves its own ``metrics`` once instead)."""
    config.require_resolved()
    t0 = time.perf_counter()
    spark, store = _session_and_tables(config, spark)
    log.info("Spark session and tables (%s) ready in %.1f s", config.tables.backend,
             time.perf_counter() - t0)
    # Each query's checkpoint against what the tables recorded, before anything starts.
    ckpt = Path(config.spark.checkpoint_dir)
    bases = bind_checkpoints(store, {"mapping": str(ckpt / "mapping"),
                                     "sync": str(ckpt / "sync")},
                             builder_state=str(ckpt / "builder-state"))
    metrics = metrics or Metrics(subscriptions_of=selection(config).subscriptions_of)
    server = metrics.serve(config.metrics) if config.metrics.enabled and serve_metrics else None
    dry = config.emission.dry_run if dry_run is None else dry_run
    metrics.set_dry_run(dry)
    metrics.start_sync_clocks([*(s for t in config.topics for s in t.subscriptions),
                               *(s for n in config.namespaces for s in n.subscriptions)])
    clients = Clients.open(config, dry_run=dry, emitter=emitter)
    # Evidence that does not hold on a topic's replication clusters stops the start here.
    watch = start_topologies(config, clients.source_admin, clients.target_admin)
    live = LiveLedgers()
    mapping = mapping_sink(config, store, metrics, clients, watch, live)
    sync = sync_sink(config, store, metrics, clients, watch, live, dry_run=dry)
    queries = start_queries(spark, config, mapping, sync, bases)
    poller = _ProgressPoller(queries, metrics, config.spark.trigger_interval_s)
    poller.start()
    log.info("mapping and sync queries started %.1f s after the job", time.perf_counter() - t0)
    return RunningJob(spark, queries, mapping, sync, clients.emitter, clients.target_admin,
                      server, poller, source_admin=clients.source_admin,
                      source_tail=clients.source_tail)


def _session_and_tables(config: Config, spark: Any) -> tuple[Any, TableStore]:
    """The Spark session (``spark``, or one built from the configuration) with the job's
    data sources, and the tables, created where missing."""
    from cursorsync.app import sources

    spark = spark or build_session(config)
    for k, v in RESTARTABLE_CONF.items():
        spark.conf.set(k, v)
    sources.register(spark)
    store = open_store(config.tables.backend, config.tables.path, spark=spark,
                       storage_options=config.tables.storage_options or None)
    store.ensure_all()
    return spark, store


class QueryFailedError(CursorSyncError):
    """A streaming query stopped with an error; the CLI prints its message."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        #: The type name of our error that stopped it, when one did.
        self.kind = kind


#: Failures an operator must fix first: restarting would fail the same way.
FATAL_KINDS = frozenset({"ConfigError", "ConfigValidationError", "TableSchemaError",
                         "AdminAuthError", "DeltaSparkUnavailableError", "TopologyError"})
#: A cluster that gives no answer (down, restarting, unreachable): waited out for as long
#: as it takes, since it comes back by itself; each restart is logged and counted.
UNAVAILABLE_KINDS = frozenset({"AdminUnavailableError"})
#: Restarts in a row (no sync batch completed in between) before the job gives up on any
#: other failure.
MAX_RESTARTS = 5
#: Backoff before restart n (1-based): RESTART_BACKOFF_S * 2**(n-1), at most 60 s.
RESTART_BACKOFF_S = 2.0
MAX_BACKOFF_S = 60.0
#: How long ``run --once`` waits for its two batches before it fails.
ONCE_TIMEOUT_S = 600.0


def restart(job: RunningJob, config: Config, failure: QueryFailedError, attempt: int, *,
            dry_run: bool | None = None, metrics: Metrics | None = None,
            sleep: Callable[[float], None] = time.sleep) -> RunningJob:
    """Stop what is left of ``job`` and start it again from its checkpoints, after a backoff.

    Safe at any point: each query resumes from its checkpoint, table writes are idempotent
    per batch id and acks idempotent on the broker, so the failed batch is simply run again.
    Raises ``failure`` itself when it is one an operator must fix, or after
    :data:`MAX_RESTARTS` attempts unless it is an unavailable cluster.
    """
    waits_out = failure.kind in UNAVAILABLE_KINDS
    if failure.kind in FATAL_KINDS or (attempt > MAX_RESTARTS and not waits_out):
        raise failure
    job.stop()
    wait = min(MAX_BACKOFF_S, RESTART_BACKOFF_S * 2 ** min(attempt - 1, 10))
    budget = "until it answers" if waits_out else f"of {MAX_RESTARTS}"
    log.warning("restarting the job from its checkpoints in %.0f s (attempt %d %s) after: "
                "%s", wait, attempt, budget, failure)
    if metrics is not None:
        metrics.record_error("restart")
    sleep(wait)
    return start_job(config, spark=job.spark, metrics=metrics, dry_run=dry_run,
                     serve_metrics=False)


def failure_of(job: RunningJob) -> QueryFailedError | None:
    """The failure of the first query that stopped with an error, if one did."""
    for q in job.queries:
        if q.exception() is not None:
            return query_failure(q.name, q.exception())
    return None


#: Our error as a Python worker's traceback in a Spark exception ends it: "module.Error: text".
_OUR_ERROR = re.compile(r"^cursorsync\w*(?:\.\w+)+\.(\w+): (.+)$", re.MULTILINE)


def query_failure(name: str, exc: Any) -> QueryFailedError:
    """An operator's message for a failed query: Spark's exception text carries the worker's
    whole traceback, so the last error of ours in it is what is said (its type in
    brackets); otherwise the text's first line. The full text goes to the log."""
    text = str(exc)
    log.error("query %s failed: %s", name, text)
    ours = _OUR_ERROR.findall(text)
    if ours:
        kind, message = ours[-1]
        return QueryFailedError(f"query {name} failed: {message} [{kind}]", kind)
    first = next((line.strip() for line in text.splitlines() if line.strip()), repr(exc))
    return QueryFailedError(f"query {name} failed: {first}")


def run_job(config: Config, *, once: bool = False, dry_run_override: bool | None = None,
            stop_event: threading.Event | None = None) -> None:
    """The main job: run until stopped (Ctrl-C, SIGTERM, the event) or, with ``once``, two
    batches.

    A query that fails is restarted with the other from the checkpoints (:func:`restart`).
    The tables' lease is held throughout (:mod:`cursorsync.app.lease`): a job already on
    them refuses this one, and a lease lost stops it.
    """
    with held(config.tables.path, "cursorsync run",
              storage_options=config.tables.storage_options or None) as lease:
        _run(config, lease, once=once, dry_run_override=dry_run_override,
             stop_event=stop_event)


def _run(config: Config, lease: Lease, *, once: bool, dry_run_override: bool | None,
         stop_event: threading.Event | None) -> None:
    metrics = Metrics(subscriptions_of=selection(config).subscriptions_of)
    server = metrics.serve(config.metrics) if config.metrics.enabled else None
    job = start_job(config, dry_run=dry_run_override, metrics=metrics, serve_metrics=False)
    attempt = 0
    previous_handler = _stop_on_sigterm()
    try:
        if once:
            if not job.wait_batches(2, timeout_s=ONCE_TIMEOUT_S):
                raise RunIncompleteError(
                    f"run --once: the queries did not complete two batches in "
                    f"{ONCE_TIMEOUT_S:g} s; the batches they completed are kept, and the "
                    "next run goes on from there")
            return
        while not (stop_event and stop_event.is_set()):
            lease.check()
            failure = failure_of(job)
            if failure is None:
                if job.sync_sink.last_batch >= 0:
                    attempt = 0  # it made progress since the last restart
                time.sleep(1)
                continue
            attempt += 1
            job = restart(job, config, failure, attempt, dry_run=dry_run_override,
                          metrics=metrics)
    except KeyboardInterrupt:
        log.warning("interrupted: stopping both queries")
    finally:
        job.stop()
        if server is not None:
            server.stop()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_on_sigterm() -> Any:
    """SIGTERM (systemd, Kubernetes, ``kill``) stops the job as Ctrl-C does, with both
    queries stopped, rather than ending the process mid-batch. Only the main thread can
    take signals; elsewhere nothing changes (None)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)
