"""The Spark application: two streaming queries, one driver.

* **mapping**: ``pulsar-entries`` from the target (and the source, when
  identity evidence is on) -> :class:`cursorsync.mapping.builder.MappingBuilder` ->
  ``mappings`` table.
* **sync**: ``pulsar-cursors`` (source admin polling) -> the mapping from the
  ``mappings`` table -> :class:`cursorsync.sync.step.SyncStep` (translate, guard,
  emit) -> ``cursor_states`` and ``sync_progress`` tables.

Both sinks are ``foreachBatch`` functions on the driver; every table write is
idempotent per (query, batch id), and the builder's state is saved per batch
id under the checkpoint, so a batch Spark re-runs after a crash produces the
same rows and re-sends only acks (idempotent on the broker).

Emission runs on the driver by default. With
``emission.spread_across_executors`` the sync batch is repartitioned by topic
partition and each Spark task translates, guards and emits for its share
(:mod:`cursorsync.sync.executors`), reading mappings and previous cursor states from
the Delta tables; the driver only writes the tables.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pyarrow as pa

from cursorsync.app.metrics import Metrics
from cursorsync.app.settings import MAPPING_SUBSCRIPTION_PREFIX, Config
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.mapping import TopicMapping
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import CursorSyncError
from cursorsync.mapping.builder import BuilderConfig, HoleCheck, MappingBuilder
from cursorsync.mapping.entries import EVIDENCE_COLUMNS, unpack
from cursorsync.sync.step import SyncConfig, SyncStep, fresh_target
from cursorsync.tables import RowFilter, TableStore, open_store
from cursorsync.tables.rows import (
    ObservedCursor,
    PartitionKey,
    cursor_state_rows,
    mapping_rows,
    sync_progress_rows,
    topic_mappings,
)

log = logging.getLogger(__name__)

MAPPING_APP = "cursorsync-mapping"
SYNC_APP = "cursorsync-sync"
STATE_FILES_KEPT = 5


# --------------------------------------------------------------------- session


#: Our log4j2 file goes here; options configured under spark.conf are added to it.
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def driver_java_options(config: Config) -> str:
    """Our quiet log4j2 file, plus whatever spark.conf adds (not replaced by it)."""
    log4j = Path(__file__).with_name("log4j2.properties")
    return " ".join(filter(None, (f"-Dlog4j2.configurationFile={log4j}",
                                  config.spark.conf.get(DRIVER_JAVA_OPTIONS))))


#: Spark 4 refuses to start a query whose checkpoint holds no batch yet but any file in
#: its offsets, commits or state directory. A query stopped while it writes its first
#: offsets leaves exactly that, its temporary file (``.0.<uuid>.tmp``, never renamed), and
#: every restart then failed (seen in the crash-and-restart test). Our queries keep no
#: state, and a real batch file is read whatever this says, so the check can only refuse
#: a restart after such a stop: it is off for the job's queries.
RESTARTABLE_CONF = {"spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart": "false"}


def build_session(config: Config) -> Any:
    """A SparkSession from the config (Delta extension only when the backend needs it)."""
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(config.spark.master).appName(config.spark.app_name)
         .config(DRIVER_JAVA_OPTIONS, driver_java_options(config))
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.python.worker.reuse", "true")
         .config("spark.sql.streaming.metricsEnabled", "true"))
    if config.tables.backend == "delta-spark":
        from cursorsync.tables.delta_spark import DELTA_SPARK_CONF

        for k, v in DELTA_SPARK_CONF.items():
            b = b.config(k, v)
    for k, v in config.spark.conf.items():
        if k != DRIVER_JAVA_OPTIONS:
            b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ----------------------------------------------------------------- source options


def _admin_options(cluster: Any) -> dict[str, str]:
    opts = {"adminUrl": cluster.admin_url,
            "adminTimeoutMs": str(int(cluster.request_timeout_s * 1000))}
    token = cluster.auth.resolve_token() if cluster.auth else None
    if token:
        opts["adminToken"] = token
    tls = cluster.auth.tls if cluster.auth else None
    if tls is not None:
        if tls.ca_file:
            opts["adminTlsCaFile"] = tls.ca_file
        if tls.cert_file:
            opts["adminTlsCertFile"] = tls.cert_file
            opts["adminTlsKeyFile"] = tls.key_file or ""
        if tls.allow_insecure:
            opts["adminTlsInsecure"] = "true"
    return opts


def _client_options(cluster: Any) -> dict[str, str]:
    opts = {"serviceUrl": cluster.service_url, "cluster": cluster.name}
    token = cluster.auth.resolve_token() if cluster.auth else None
    if token:
        opts["authToken"] = token
    tls = cluster.auth.tls if cluster.auth else None
    if tls is not None and tls.ca_file:
        opts["tlsTrustCertsFilePath"] = tls.ca_file
    if tls is not None and tls.allow_insecure:
        opts["tlsAllowInsecureConnection"] = "true"
    return opts


def _topics_option(config: Config) -> dict[str, str]:
    if config.topics:
        return {"topics": ",".join(t.topic for t in config.topics)}
    ns = config.namespaces[0]
    return {"namespace": ns.namespace, "topicPattern": ns.regex}


def _subscriptions(config: Config) -> list[str]:
    subs: list[str] = []
    for t in config.topics:
        subs += [s for s in t.subscriptions if s not in subs]
    for n in config.namespaces:
        subs += [s for s in n.subscriptions if s not in subs]
    return subs


def entries_stream(spark: Any, config: Config, side: str) -> Any:
    cluster = config.source if side == "source" else config.target
    opts = {**_client_options(cluster), **_admin_options(cluster), **_topics_option(config),
            "maxRowsPerBatch": str(config.spark.max_entries_per_batch),
            "entriesPerTask": str(config.spark.entries_per_task),
            "rangesPerTask": str(config.spark.ranges_per_task),
            "identityFields": ",".join(config.evidence.identity_fields),
            "identity": str("identity" in config.evidence.strategies).lower(),
            "positionEvidence": str("position-property" in config.evidence.strategies).lower(),
            "identityScope": config.evidence.identity_scope,
            # The source side is read for identity evidence only: rows without a digest
            # would be dropped by the builder anyway.
            "identityRowsOnly": str(side == "source").lower(),
            "rowsPer": "entry",  # the builder works on entries; one row each crosses the JVM
            "columns": "evidence",  # and only the columns it reads
            # and a Spark row per record batch of them: the sink takes the batch to the
            # driver as Arrow at once, so rows would only cost the JVM a conversion each way
            "layout": "arrow",
            "receiverQueueSize": str(cluster.receiver_queue_size),
            "sourcePositionProperty": config.evidence.source_position_property,
            "subscription": f"{MAPPING_SUBSCRIPTION_PREFIX}-{side}",
            "startingPosition": "earliest"}
    return spark.readStream.format("pulsar-entries").options(**opts).load()


def cursors_stream(spark: Any, config: Config, state_dir: str) -> Any:
    opts = {**_admin_options(config.source), **_topics_option(config),
            "cluster": config.source.name, "subscriptions": ",".join(_subscriptions(config)),
            "stateDir": state_dir}
    return spark.readStream.format("pulsar-cursors").options(**opts).load()


# ---------------------------------------------------------------- mapping sink


class MappingSink:
    """foreachBatch of the mapping query: builder + idempotent append + per-batch state."""

    def __init__(self, config: Config, store: TableStore, state_dir: Path,
                 metrics: Metrics | None, hole_check: HoleCheck | None = None) -> None:
        """``hole_check``: what verifies skipped target ids (``evidence.holes: verified``)."""
        self.config = config
        self.store = store
        self.state_dir = state_dir
        self.metrics = metrics
        state_dir.mkdir(parents=True, exist_ok=True)
        self.builder = MappingBuilder(BuilderConfig(
            config.source.name, config.target.name, tuple(config.evidence.strategies),
            config.evidence.alignment_window,
            claim_holes=config.evidence.claims_holes), hole_check=hole_check)
        self._batch: int | None = None
        self.last_batch: int = -1

    def _state_file(self, batch_id: int) -> Path:
        return self.state_dir / f"builder-{batch_id}.json"

    def _prepare(self, batch_id: int) -> None:
        """Start from the state the batch started from the first time (replay-safe)."""
        if self._batch == batch_id - 1:
            return
        prev = self._state_file(batch_id - 1)
        builder = MappingBuilder(self.builder.config, hole_check=self.builder.hole_check)
        if prev.exists():
            builder.load_state(json.loads(prev.read_text()))
        elif batch_id > 0:
            log.warning("no builder state for batch %d: identity matching restarts with an "
                        "empty window (safe: only unmatched entries stay unacked)", batch_id - 1)
        rows = self.store.read("mappings", RowFilter.of(
            source_cluster=self.config.source.name, target_cluster=self.config.target.name,
            max_batch_id=batch_id - 1))
        builder.seed_known(topic_mappings(rows))
        self.builder = builder

    def __call__(self, df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        self._prepare(batch_id)
        table = unpack(df.toArrow(), EVIDENCE_COLUMNS)
        outcome = self.builder.process(table)
        now = datetime.now(UTC)
        parts = [mapping_rows(k, m, source_cluster=self.config.source.name,
                              target_cluster=self.config.target.name, written_at=now)
                 for k, m in sorted(outcome.mappings.items())]
        rows = pa.concat_tables(parts) if parts else _empty("mappings")
        self.store.append("mappings", rows, app_id=MAPPING_APP, batch_id=batch_id)
        self._state_file(batch_id).write_text(json.dumps(self.builder.state()))
        for old in self.state_dir.glob("builder-*.json"):
            if int(old.stem.split("-")[1]) < batch_id - STATE_FILES_KEPT:
                old.unlink(missing_ok=True)
        self._batch = batch_id
        self.last_batch = batch_id
        if self.metrics:
            for cluster in (self.config.source.name, self.config.target.name):
                n = int(table.filter(pa.compute.equal(table.column("cluster"), cluster)).num_rows
                        ) if table.num_rows else 0
                self.metrics.record_entries_ingested(cluster, n)
            segs = sum(len(m.segments) for m in outcome.mappings.values())
            self.metrics.record_segments_written(segs)
            self.metrics.record_skipped_ids(outcome.skipped_claimed,
                                            outcome.skipped_ids - outcome.skipped_claimed)
            self.metrics.observe_batch("mapping", time.perf_counter() - t0)
        log.info("mapping batch %d: %d entries, %d pairs, %d conflicts, %d given up, "
                 "%d of %d skipped target ids claimed as markers",
                 batch_id, outcome.entries_in, outcome.pairs, outcome.conflicts,
                 outcome.given_up_target, outcome.skipped_claimed, outcome.skipped_ids)


def _empty(table: str) -> pa.Table:
    """No rows, in the row helpers' schema: the batch id is still recorded as written."""
    from cursorsync.tables.rows import row_schema

    return row_schema(table).empty_table()  # type: ignore[arg-type]


# ------------------------------------------------------------------ sync sink


@dataclass
class MappingStore:
    """The ``mappings`` table, loaded incrementally by batch id; lookup only, no I/O else."""

    store: TableStore
    source_cluster: str
    target_cluster: str
    loaded_upto: int = -1
    mappings: dict[PartitionKey, TopicMapping] = field(default_factory=dict)

    def refresh(self) -> dict[PartitionKey, TopicMapping]:
        if not self.store.exists("mappings"):
            return self.mappings
        rows = self.store.read("mappings", RowFilter.of(
            source_cluster=self.source_cluster, target_cluster=self.target_cluster,
            min_batch_id=self.loaded_upto + 1))
        if rows.num_rows == 0:
            return self.mappings
        top = int(pa.compute.max(rows.column("batch_id")).as_py())
        for key, delta in topic_mappings(rows).items():
            self.mappings[key] = self.mappings.get(key, TopicMapping()).union(delta)
        self.loaded_upto = top
        return self.mappings


def observations(table: pa.Table) -> list[ObservedCursor]:
    """``pulsar-cursors`` rows -> observed cursor states."""
    out = []
    for r in table.to_pylist():
        ledgers = (None if r["ledgers"] is None
                   else Ledgers.of((x["ledger_id"], x["entries"]) for x in r["ledgers"]))
        state = CursorState(Position.parse(r["mark_delete"]),
                            RangeSet.parse(r["individually_deleted"]), ledgers)
        observed = r["observed_at"]
        if observed.tzinfo is None:
            observed = observed.replace(tzinfo=UTC)
        out.append(ObservedCursor(PartitionKey(r["topic"], int(r["partition"])),
                                  r["subscription"], state, observed))
    return out


def target_admin(config: Config) -> Any:
    """An admin client for the target cluster, from the config."""
    return cluster_admin(config.target)


def cluster_admin(cluster: Any) -> Any:
    """An admin client for one cluster of the config."""
    from cursorsync.pulsar.admin import AdminClient, AdminConfig

    return AdminClient(AdminConfig.from_urls(
        cluster.admin_url, cluster=cluster.name,
        token=cluster.auth.resolve_token() if cluster.auth else None,
        timeout_s=cluster.request_timeout_s, max_workers=cluster.max_concurrency))


def source_marker_lookup(admin: Any, config: Config) -> Any:
    """What the sync step asks which unmapped source entries are markers."""
    from cursorsync.mapping.hole_check import AdminMarkerLookup

    return AdminMarkerLookup(admin, max_workers=config.source.max_concurrency)


def target_emitter(config: Config) -> Any:
    """The ack emitter for the target cluster, from the config."""
    from cursorsync.pulsar.emitter import PulsarEmitter

    tgt = config.target
    tls = tgt.auth.tls if tgt.auth else None
    return PulsarEmitter(
        tgt.service_url, subscription_type=config.emission.subscription_type,
        ack_batch_size=config.emission.ack_batch_size,
        auth_token=tgt.auth.resolve_token() if tgt.auth else None,
        tls_trust_certs_file=tls.ca_file if tls else None,
        tls_allow_insecure=bool(tls and tls.allow_insecure))


def target_reader(admin: Any) -> Callable[[str, str], CursorState | None]:
    """The target cursor from the target's admin API; a missing subscription starts fresh."""
    from cursorsync.errors import TopicNotFoundError

    def read(topic: str, subscription: str) -> CursorState | None:
        try:
            stats = admin.internal_stats(topic)
        except TopicNotFoundError:
            return None
        cur = stats.subscriptions.get(subscription)
        if cur is None:
            return fresh_target(stats.ledgers)
        return CursorState(cur.state.mark_delete, cur.state.individually_deleted, stats.ledgers)

    return read


class _Synced(NamedTuple):
    """What one sync batch produced, on the driver or on the executors."""

    observed: list[ObservedCursor]
    rows: pa.Table  # sync_progress rows
    refused: int
    halted: int
    translate_seconds: float | None


class SyncSink:
    """foreachBatch of the sync query."""

    def __init__(self, config: Config, store: TableStore, step: SyncStep,
                 metrics: Metrics | None) -> None:
        self.config = config
        self.store = store
        self.step = step
        self.metrics = metrics
        self.mappings = MappingStore(store, config.source.name, config.target.name)
        self.last_batch = -1
        self.crash_after_emit: Callable[[int], None] | None = None  # tests inject a crash here

    def __call__(self, df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        done = (self._on_executors(df, batch_id) if self.config.emission.spread_across_executors
                else self._on_driver(df))
        obs, rows = done.observed, done.rows
        if self.crash_after_emit is not None:
            self.crash_after_emit(batch_id)
        src, tgt = self.config.source.name, self.config.target.name
        self.store.append("cursor_states", cursor_state_rows(
            obs, source_cluster=src, target_cluster=tgt), app_id=SYNC_APP, batch_id=batch_id)
        self.store.append("sync_progress", rows, app_id=SYNC_APP, batch_id=batch_id)
        self.last_batch = batch_id
        if self.metrics:
            self._record(done, time.perf_counter() - t0)
        acks = sum(rows.column("acks_sent").to_pylist()) if rows.num_rows else 0
        log.info("sync batch %d: %d cursors, %d acks sent, %d refused, %d halted", batch_id,
                 len(obs), acks, done.refused, done.halted)

    def _on_driver(self, df: Any) -> _Synced:
        """Translate, guard and emit here; returns the observations and sync_progress rows."""
        obs = observations(df.toArrow())
        result = self.step.run(obs, self.mappings.refresh())
        rows = sync_progress_rows(result.records, source_cluster=self.config.source.name,
                                  target_cluster=self.config.target.name)
        return _Synced(obs, rows, result.refused, result.halted, result.translate_seconds)

    def _on_executors(self, df: Any, batch_id: int) -> _Synced:
        """Translate, guard and emit in Spark tasks; the driver only writes the tables.
        Refusals and halts are logged by the tasks and not counted here."""
        from cursorsync.sync.executors import sync_on_executors

        df = df.persist()
        try:
            obs = observations(df.toArrow())
            rows = sync_on_executors(df, self.config, batch_id, dry_run=self.step.config.dry_run,
                                     cumulative=self.step.config.cumulative)
        finally:
            df.unpersist()
        return _Synced(obs, rows, 0, 0, None)

    def _record(self, done: _Synced, batch_s: float) -> None:
        """Metrics from the sync_progress rows, the same whichever path produced them."""
        m = self.metrics
        assert m is not None
        kind: Literal["cumulative", "individual"] = (
            "cumulative" if self.step.config.cumulative else "individual")
        if done.translate_seconds is not None:
            m.observe_translation(done.translate_seconds)
        for r in done.rows.to_pylist():
            sub = r["subscription"]
            m.record_acks(sub, kind, r["acks_sent"])
            m.set_unmapped_acked(sub, f"{r['topic']}#{r['partition']}",
                                 r["unmapped_acked_entries"])
            if r["rewound_entries"]:
                m.record_rewound(sub, r["rewound_entries"])
            m.observe_sync_lag(sub, r["lag_ms"] / 1000)
            m.mark_synced(sub)
        for _ in range(done.refused):
            m.record_error("guard")
        m.observe_batch("sync", batch_s)


# ---------------------------------------------------------------------- running


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
    stopped: bool = False

    def wait_batches(self, n: int, timeout_s: float) -> bool:
        """Until the sync query completed ``n`` more batches and the mapping query either did
        too or has nothing new to read (Spark runs no batch without new data)."""
        target_m = self.mapping_sink.last_batch + n
        target_s = self.sync_sink.last_batch + n
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for q in self.queries:
                if q.exception() is not None:
                    raise query_failure(q.name, q.exception())
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
        for admin in (self.admin, self.source_admin):
            if admin is not None:
                admin.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()


class _ProgressPoller:
    """Spark progress -> Prometheus gauges: one ``lastProgress`` call per query per trigger.

    A Python StreamingQueryListener receives each event converted field by field over
    py4j; during a backlog that took ~10% of a driver core plus JVM time (py-spy), for
    gauges that only need the latest value.
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
              metrics: Metrics | None = None, dry_run: bool | None = None) -> RunningJob:
    """Start both queries and return at once; :meth:`RunningJob.stop` ends them."""
    from cursorsync.app import sources

    config.require_resolved()
    spark = spark or build_session(config)
    for k, v in RESTARTABLE_CONF.items():
        spark.conf.set(k, v)
    sources.register(spark)
    store = open_store(config.tables.backend, config.tables.path, spark=spark,
                       storage_options=config.tables.storage_options or None)
    store.ensure_all()
    metrics = metrics or Metrics()
    server = metrics.serve(config.metrics) if config.metrics.enabled else None
    ckpt = Path(config.spark.checkpoint_dir)
    admin = target_admin(config)
    dry = config.emission.dry_run if dry_run is None else dry_run
    if emitter is None and not dry and not config.emission.spread_across_executors:
        emitter = target_emitter(config)
    cumulative = config.emission.cumulative
    source_admin = cluster_admin(config.source)
    step = SyncStep(SyncConfig(cumulative, dry, config.emission.rewind_policy), emitter,
                    target_reader(admin), source_marker_lookup(source_admin, config))
    hole_check = None
    if config.evidence.holes == "verified":
        from cursorsync.mapping.hole_check import AdminHoleCheck

        hole_check = AdminHoleCheck(admin, max_workers=config.target.max_concurrency)
    mapping_sink = MappingSink(config, store, ckpt / "builder-state", metrics, hole_check)
    sync_sink = SyncSink(config, store, step, metrics)
    trigger = f"{config.spark.trigger_interval_s} seconds"
    mapping_trigger = (f"{config.spark.mapping_trigger_interval_s} seconds"
                       if config.spark.mapping_trigger_interval_s else trigger)

    entries = entries_stream(spark, config, "target")
    if "identity" in config.evidence.strategies:
        entries = entries.unionByName(entries_stream(spark, config, "source"))
    mq = (entries.writeStream.queryName("cursorsync-mapping").foreachBatch(mapping_sink)
          .option("checkpointLocation", str(ckpt / "mapping"))
          .trigger(processingTime=mapping_trigger)
          .start())
    cq = (cursors_stream(spark, config, str(ckpt / "cursor-polls")).writeStream
          .queryName("cursorsync-sync").foreachBatch(sync_sink)
          .option("checkpointLocation", str(ckpt / "sync")).trigger(processingTime=trigger)
          .start())
    poller = _ProgressPoller([mq, cq], metrics, config.spark.trigger_interval_s)
    poller.start()
    return RunningJob(spark, [mq, cq], mapping_sink, sync_sink, emitter, admin, server, poller,
                      source_admin=source_admin)


class QueryFailedError(CursorSyncError):
    """A streaming query stopped with an error; the CLI prints its message."""


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
        return QueryFailedError(f"query {name} failed: {message} [{kind}]")
    first = next((line.strip() for line in text.splitlines() if line.strip()), repr(exc))
    return QueryFailedError(f"query {name} failed: {first}")


def run_job(config: Config, *, once: bool = False, dry_run_override: bool | None = None,
            stop_event: threading.Event | None = None) -> None:
    """The main job: run until stopped (Ctrl-C, the event) or, with ``once``, two batches."""
    job = start_job(config, dry_run=dry_run_override)
    try:
        if once:
            if not job.wait_batches(2, timeout_s=600):
                log.warning("--once: the queries did not complete two batches in 10 minutes")
            return
        while not (stop_event and stop_event.is_set()):
            for q in job.queries:
                if q.exception() is not None:
                    raise query_failure(q.name, q.exception())
            time.sleep(1)
    except KeyboardInterrupt:
        log.warning("interrupted: stopping both queries")
    finally:
        job.stop()
