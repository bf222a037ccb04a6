"""cursorsync's Prometheus metrics: one registry per :class:`Metrics`, nothing global.

Every metric is named ``cursorsync_*``; what each one answers is its help text, and the
table of docs/operation.md ("Metrics"). ``cursorsync_query_*{query}`` come from Spark's
progress reports (:meth:`Metrics.observe_progress`).

Label cardinality is kept low on purpose: no metric has a ``topic`` label.
A namespace regex can match thousands of topics, times their partitions, and a
histogram costs one series per bucket per label value, so a topic label would
multiply the scrape by the topic count. Subscriptions are few and chosen by
the operator in the config, so they are the finest label; per-topic detail
lives in the ``sync_progress`` Delta table. Gauges that are naturally per
topic (unmapped entries) take the topic as an argument and are exposed as the
sum over topics.
"""

from __future__ import annotations

import math
import platform
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from cursorsync.app.metrics_server import MetricsServer, serve_registry
from cursorsync.app.settings import MetricsConfig
from cursorsync.core.records import PartitionKey

AckKind = Literal["cumulative", "individual"]
ACK_KINDS: tuple[AckKind, ...] = ("cumulative", "individual")

#: The stages errors are usually counted under (any lower_snake_case name is accepted).
STAGES: tuple[str, ...] = (
    "config", "admin", "ingest", "mapping", "translate", "guard", "emit", "tables", "spark",
    "query", "restart", "anchor_conflict",
)

_STAGE_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")

LAG_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TRANSLATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
BATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from cursorsync import __version__

    out = {"version": __version__, "python": platform.python_version()}
    for dist in ("pyspark", "pulsar-client", "deltalake", "delta-spark"):
        try:
            out[dist.replace("-", "_")] = version(dist)
        except PackageNotFoundError:
            out[dist.replace("-", "_")] = ""
    return out


class Metrics:
    """All of cursorsync's metrics, in a registry of their own (safe to create many, e.g. in tests).

    Methods are thread-safe; counts must be non-negative.
    """

    # Longer than 50 lines: one declaration per metric, the list of what the job exports,
    # read best in one place.
    def __init__(self, registry: CollectorRegistry | None = None,
                 subscriptions_of: Callable[[str], Sequence[str]] | None = None) -> None:
        """``subscriptions_of``: the subscriptions synced on a topic partition (the config's
        selection); per-partition figures are added up per subscription with it."""
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.subscriptions_of = subscriptions_of
        self._waiting_subscriptions: set[str] = set()
        self._sync_clocks: set[str] = set()
        # cursorsync_process_start_time_seconds shows a driver restart (the errors counter
        # counts the job's own restarts of its queries, within one process); CPU and memory
        # besides.
        ProcessCollector(namespace="cursorsync", registry=self.registry)
        versions = _versions()
        Gauge("cursorsync_build_info", "1, labelled with the versions the job runs with.",
              sorted(versions), registry=self.registry).labels(**versions).set(1)
        r = self.registry
        self._entries_ingested = Counter(
            "cursorsync_mapping_entries_ingested", "Entries read by the mapping query.",
            ["cluster"], registry=r)
        self._segments_written = Counter(
            "cursorsync_segments_written", "Segments appended to the mappings table.",
            ["evidence"], registry=r)
        self._skipped_ids = Counter(
            "cursorsync_skipped_target_ids",
            "Entry ids the target reader skipped: claimed (markers, acked after the entry "
            "before them), mapped (chunks, acked as their source chunks are) or unclaimed "
            "(unmapped chunks and the like, never acked).",
            ["outcome"], registry=r)
        self._skipped_id_requests = Counter(
            "cursorsync_skipped_id_requests",
            "Admin requests made to classify skipped target ids, by kind: raw-entry (one per "
            "id, evidence.holes: verified, and what a probe cursor cannot answer) and "
            "cursor-read (one internalStats per probed partition and batch), "
            "plugin-cursor-read (spark.cursor_digests: many probed partitions per request), "
            "ledger-list (one internalStats per partition whose reader skipped whole "
            "ledgers) and plugin-ledger-list (spark.cursor_digests: those lists at once).",
            ["kind"], registry=r)
        self._source_lookups = Counter(
            "cursorsync_source_lookups",
            "Requests to the source made to classify acked source entries the mapping does "
            "not map, by kind: raw-entry (one per entry), tail-check (a reader per "
            "partition: whether anything past its last mapped entry is dispatchable) and "
            "plugin-tail (spark.cursor_digests: those answers for every partition a broker "
            "serves, one request per broker and namespace).",
            ["kind"], registry=r)
        self._target_cursor_reads = Counter(
            "cursorsync_target_cursor_reads",
            "Admin requests the sync made to read target cursors, by way: internal-stats (one "
            "per partition) and plugin (spark.cursor_digests: one per target broker and "
            "namespace, for many partitions).",
            ["way"], registry=r)
        self._skipped_waiting = Gauge(
            "cursorsync_skipped_target_ids_waiting",
            "Skipped target ids not checked yet: the check of each mapping batch is bounded, "
            "and the rest wait for the next batches (a growing value means markers arrive "
            "faster than the target's admin API is asked about them).", registry=r)
        self._failover_ready = Gauge(
            "cursorsync_failover_ready",
            "1 when every partition of the subscription the job has synced since its start "
            "had an exact last sync with nothing acked on the source unmapped and no dry "
            "run (what `cursorsync status --ready` checks, with the age of each sync), "
            "else 0.", ["subscription"], registry=r)
        self._dry_run = Gauge(
            "cursorsync_dry_run",
            "1 while the job runs in dry-run (emission.dry_run or --dry-run): it plans and "
            "records, and acknowledges nothing on the target; 0 otherwise.", registry=r)
        self._skipped_waiting_by_subscription = Gauge(
            "cursorsync_skipped_target_ids_waiting_by_subscription",
            "Skipped target ids not checked yet on the topic partitions a subscription is "
            "synced on (\"*\": every subscription of a topic): what holds the subscription's "
            "target markDeletePosition back until they are checked.",
            ["subscription"], registry=r)
        self._first_plans_waiting = Gauge(
            "cursorsync_sync_cursors_waiting_first_plan",
            "Source cursors observed but not planned yet: the driver plans at most "
            "emission.first_plans_per_batch new cursors a sync batch (after a start), and "
            "the rest wait for the next batches.", registry=r)
        self._idle_cursors = Gauge(
            "cursorsync_sync_idle_cursors",
            "Source cursors idle after the last sync batch, kept in columns: their last plan "
            "passed the guard and needed nothing sent, and a poll row that repeats their "
            "state is counted without being planned again.", registry=r)
        self._sync_lag = Histogram(
            "cursorsync_sync_lag_seconds",
            "From a source cursor state last known current to the target reflecting it.",
            ["subscription"], buckets=LAG_BUCKETS, registry=r)
        self._acks_sent = Counter(
            "cursorsync_acks_sent", "Acknowledgements sent to target subscriptions.",
            ["subscription", "kind"], registry=r)
        self._outcomes = Counter(
            "cursorsync_sync_outcomes",
            "Plans by what became of them: emitted, dry_run, halted, refused, failed.",
            ["subscription", "result"], registry=r)
        self._unmapped = Gauge(
            "cursorsync_unmapped_acked_entries",
            "Entries acked on the source that no segment maps yet (summed over topics).",
            ["subscription"], registry=r)
        self._forecast = Gauge(
            "cursorsync_redelivery_forecast_messages",
            "Messages a failover now would deliver again on the target, by cause, as the sync "
            "knows them at each batch (summed over topics). acked_unmapped: entries acked on "
            "the source whose target copy is unknown (chunked messages' entries among them), "
            "one message counted per entry: a floor where entries are batches. Acks since the "
            "last sync are none at the moment of a sync, and partially acked batches show in "
            "no broker statistic, so neither has a series here: `cursorsync status "
            "--forecast` reads the source for them, and for the messages per entry.",
            ["subscription", "cause"], registry=r)
        self._rewound = Counter(
            "cursorsync_rewound_entries",
            "Entries seen acked on the source that later became unacked (a rewind).",
            ["subscription"], registry=r)
        self._halted = Gauge(
            "cursorsync_halted_partitions",
            "Topic partitions whose sync of the subscription is halted now (the halts table), "
            "by cause: source_rewind, topic_recreated, target_reset, first_sync, unknown.",
            ["subscription", "cause"], registry=r)
        self._halted_labels: set[tuple[str, str]] = set()
        self._translation = Histogram(
            "cursorsync_translation_seconds", "Time of one translation of one cursor.",
            buckets=TRANSLATION_BUCKETS, registry=r)
        self._batch_duration = Histogram(
            "cursorsync_batch_duration_seconds", "Time of one micro-batch, by query.",
            ["query"], buckets=BATCH_BUCKETS, registry=r)
        self._batch_phase = Histogram(
            "cursorsync_batch_phase_seconds",
            "Time of one phase of one micro-batch, by query and phase (a phase a:b is part "
            "of phase a).", ["query", "phase"], buckets=BATCH_BUCKETS, registry=r)
        self._batch_phase_cpu = Counter(
            "cursorsync_batch_phase_cpu_seconds",
            "CPU seconds the batch's own thread spent in each phase, by query and phase (the "
            "mapping query): its share of the phase's seconds is work, the rest waiting on "
            "brokers, on threads it started, or for a core or the interpreter.",
            ["query", "phase"], registry=r)
        self._last_sync = Gauge(
            "cursorsync_last_successful_sync_timestamp_seconds",
            "Unix time of the last batch that synced the subscription without error.",
            ["subscription"], registry=r)
        self._errors = Counter(
            "cursorsync_errors", "Errors, by pipeline stage.", ["stage"], registry=r)
        self._rows_expired = Counter(
            "cursorsync_table_rows_expired", "Rows table maintenance deleted (retention).",
            ["table"], registry=r)
        self._maintained = Gauge(
            "cursorsync_table_maintenance_timestamp_seconds",
            "Unix time of the last successful maintenance of the table.", ["table"], registry=r)
        self._query_input_rows = Gauge(
            "cursorsync_query_input_rows", "numInputRows of the last progress report.",
            ["query"], registry=r)
        self._query_input_rate = Gauge(
            "cursorsync_query_input_rows_per_second",
            "inputRowsPerSecond of the last progress report.", ["query"], registry=r)
        self._query_processed_rate = Gauge(
            "cursorsync_query_processed_rows_per_second",
            "processedRowsPerSecond of the last progress report.", ["query"], registry=r)
        self._query_duration = Gauge(
            "cursorsync_query_duration_seconds",
            "durationMs of the last progress report, per operation, in seconds.",
            ["query", "operation"], registry=r)
        self._query_batch_id = Gauge(
            "cursorsync_query_batch_id", "batchId of the last progress report.",
            ["query"], registry=r)
        self._lock = threading.Lock()
        self._unmapped_by_topic: dict[str, dict[str, int]] = {}
        self._unmapped_total: dict[str, int] = {}
        self._forecast_parts: dict[tuple[str, str], dict[str, int]] = {}

    # ------------------------------------------------------------------ mapping

    def record_entries_ingested(self, cluster: str, count: int) -> None:
        """``count`` entries of ``cluster`` were read into the mapping query."""
        self._entries_ingested.labels(cluster=cluster).inc(_count(count, "count"))

    def record_segments_written(self, count: int, *, evidence: str = "position-property") -> None:
        """``count`` segments of one evidence kind were appended to the mappings table."""
        self._segments_written.labels(evidence=evidence).inc(_count(count, "count"))

    def record_skipped_ids(self, claimed: int, unclaimed: int, mapped: int = 0) -> None:
        """Skipped target ids of one mapping batch: claimed as markers, mapped as chunks,
        or neither."""
        self._skipped_ids.labels(outcome="claimed").inc(_count(claimed, "claimed"))
        self._skipped_ids.labels(outcome="mapped").inc(_count(mapped, "mapped"))
        self._skipped_ids.labels(outcome="unclaimed").inc(_count(unclaimed, "unclaimed"))

    def record_skipped_id_requests(self, kind: str, count: int) -> None:
        """``count`` more admin requests of ``kind`` classified skipped target ids."""
        self._skipped_id_requests.labels(kind=kind).inc(_count(count, "count"))

    def record_source_lookups(self, kind: str, count: int) -> None:
        """``count`` more requests of ``kind`` classified acked source entries."""
        self._source_lookups.labels(kind=kind).inc(_count(count, "count"))

    def record_target_cursor_reads(self, way: str, count: int) -> None:
        """``count`` more admin requests of ``way`` read target cursors for the sync."""
        self._target_cursor_reads.labels(way=way).inc(_count(count, "count"))

    def set_failover_ready(self, subscription: str, ready: bool) -> None:
        """Whether the subscription's partitions were all ready at their last sync."""
        self._failover_ready.labels(subscription=subscription).set(1 if ready else 0)

    def set_dry_run(self, dry_run: bool) -> None:
        """Whether the job acknowledges nothing on the target."""
        self._dry_run.set(1 if dry_run else 0)

    def set_skipped_waiting(self, by_partition: Mapping[PartitionKey, int]) -> None:
        """Skipped target ids left for later mapping batches to check, per topic partition:
        in all, and per subscription synced on the partitions."""
        self._skipped_waiting.set(sum(_count(n, "count") for n in by_partition.values()))
        if self.subscriptions_of is None:
            return
        per: dict[str, int] = {}
        for key, n in by_partition.items():
            for sub in self.subscriptions_of(key.concrete_topic()):
                per[sub] = per.get(sub, 0) + n
        with self._lock:
            for sub in self._waiting_subscriptions - per.keys():
                self._skipped_waiting_by_subscription.labels(subscription=sub).set(0)
            for sub, n in per.items():
                self._skipped_waiting_by_subscription.labels(subscription=sub).set(n)
            self._waiting_subscriptions |= per.keys()

    # ------------------------------------------------------------------ sync

    def set_first_plans_waiting(self, count: int) -> None:
        """Cursors the last sync batch left for later batches to plan a first time."""
        self._first_plans_waiting.set(_count(count, "count"))

    def set_idle_cursors(self, count: int) -> None:
        """Cursors kept idle in columns after the last sync batch."""
        self._idle_cursors.set(_count(count, "count"))

    def observe_sync_lag(self, subscription: str, seconds: float) -> None:
        """How old the source state the target reflects was (negative clock skew counts
        as 0)."""
        self.observe_sync_lags(subscription, (seconds,))

    def observe_sync_lags(self, subscription: str, seconds: Iterable[float]) -> None:
        """:meth:`observe_sync_lag` for each of a batch's plans of ``subscription``."""
        histogram = self._sync_lag.labels(subscription=subscription)
        for s in seconds:
            histogram.observe(max(0.0, s))

    def record_acks(self, subscription: str, kind: AckKind, count: int = 1) -> None:
        """``count`` acks of one kind were sent on the target subscription."""
        if kind not in ACK_KINDS:
            raise ValueError(
                f"{kind!r} is not a valid ack kind. Valid values are: {', '.join(ACK_KINDS)}"
            )
        self._acks_sent.labels(subscription=subscription, kind=kind).inc(_count(count, "count"))

    def record_outcome(self, subscription: str, result: str, count: int = 1) -> None:
        """``count`` plans of ``subscription`` ended as ``result`` (see the metric's help)."""
        self._outcomes.labels(subscription=subscription, result=result).inc(
            _count(count, "count"))

    def set_unmapped_acked(self, subscription: str, topic: str, entries: int) -> None:
        """The current unmapped-acked count of one topic; the gauge shows the sum over topics."""
        self.set_unmapped_acked_many(subscription, {topic: entries})

    def set_unmapped_acked_many(self, subscription: str, entries: Mapping[str, int]) -> None:
        """:meth:`set_unmapped_acked` for several topics at once (a batch's)."""
        counts = {topic: _count(n, "entries") for topic, n in entries.items()}
        with self._lock:
            per_topic = self._unmapped_by_topic.setdefault(subscription, {})
            total = self._unmapped_total.get(subscription, 0)
            for topic, n in counts.items():
                total += n - per_topic.get(topic, 0)
                if n:
                    per_topic[topic] = n
                else:
                    per_topic.pop(topic, None)
            self._unmapped_total[subscription] = total
            self._unmapped.labels(subscription=subscription).set(total)

    def set_redelivery_forecast(self, subscription: str, cause: str,
                                messages: Mapping[str, int]) -> None:
        """The forecast messages of one cause per topic partition (a batch's; partitions not
        named keep their last figure); the gauge shows the sum."""
        counts = {part: _count(n, "messages") for part, n in messages.items()}
        with self._lock:
            parts = self._forecast_parts.setdefault((subscription, cause), {})
            parts.update(counts)
            self._forecast.labels(subscription=subscription, cause=cause).set(
                sum(parts.values()))

    def record_rewound(self, subscription: str, entries: int) -> None:
        """A source rewind un-acked ``entries`` entries (acks on the target stay)."""
        self._rewound.labels(subscription=subscription).inc(_count(entries, "entries"))

    def set_halted(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Partitions halted now per (subscription, cause); a pair no longer halted reads 0."""
        with self._lock:
            for sub, cause in self._halted_labels - counts.keys():
                self._halted.labels(subscription=sub, cause=cause).set(0)
            for (sub, cause), n in counts.items():
                self._halted.labels(subscription=sub, cause=cause).set(_count(n, "count"))
            self._halted_labels |= counts.keys()

    def observe_translation(self, seconds: float) -> None:
        self._translation.observe(max(0.0, seconds))

    @contextmanager
    def time_translation(self) -> Iterator[None]:
        """``with metrics.time_translation(): plan = translate(...)``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe_translation(time.perf_counter() - start)

    def observe_batch(self, query: str, seconds: float) -> None:
        self._batch_duration.labels(query=query).observe(max(0.0, seconds))

    def observe_batch_phases(self, query: str, seconds: Mapping[str, float], *,
                             cpu: Mapping[str, float] | None = None) -> None:
        """The seconds of each phase of one batch of ``query``, and the CPU seconds its
        thread spent in each (``cpu``, where measured)."""
        for phase, value in seconds.items():
            self._batch_phase.labels(query=query, phase=phase).observe(max(0.0, value))
        for phase, value in (cpu or {}).items():
            self._batch_phase_cpu.labels(query=query, phase=phase).inc(max(0.0, value))

    @contextmanager
    def time_batch(self, query: str) -> Iterator[None]:
        """Time one micro-batch of ``query`` (also when it fails)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe_batch(query, time.perf_counter() - start)

    def mark_synced(self, subscription: str, at: float | None = None) -> None:
        """The subscription was synced without error at Unix time ``at`` (default: now)."""
        self._last_sync.labels(subscription=subscription).set(time.time() if at is None else at)
        self._sync_clocks.add(subscription)

    def start_sync_clocks(self, subscriptions: Iterable[str], at: float | None = None) -> None:
        """The named subscriptions (``*`` aside) without a last sync in this process get the
        job's start (``at``, default now) as theirs: one that is never synced after a start
        then goes stale like one whose syncs stopped, instead of having no series."""
        now = time.time() if at is None else at
        for name in subscriptions:
            if name != "*" and name not in self._sync_clocks:
                self._last_sync.labels(subscription=name).set(now)
                self._sync_clocks.add(name)

    def record_error(self, stage: str, count: int = 1) -> None:
        """``count`` failures in ``stage`` (see :data:`STAGES`); never pass a message as the
        stage."""
        if not _STAGE_RE.fullmatch(stage):
            raise ValueError(
                f"{stage!r} is not a valid stage: use a short lower_snake_case name such as "
                f"{', '.join(STAGES)}"
            )
        self._errors.labels(stage=stage).inc(_count(count, "count"))

    # ------------------------------------------------------------------ tables

    def record_maintenance(self, table: str, expired_rows: int) -> None:
        """The table was compacted and vacuumed, and ``expired_rows`` rows expired."""
        self._rows_expired.labels(table=table).inc(_count(expired_rows, "expired rows"))
        self._maintained.labels(table=table).set(time.time())

    # ------------------------------------------------------------------ Spark progress

    def observe_progress(self, progress: Mapping[str, Any], query: str | None = None) -> None:
        """Record a StreamingQueryProgress (as a dict, e.g. ``json.loads(progress.json)``).

        Sets numInputRows, inputRowsPerSecond, processedRowsPerSecond, batchId
        and every durationMs operation (converted to seconds), labelled by
        ``query`` or else the progress's ``name`` (or ``id``). Missing or
        non-numeric values are left as they were.
        """
        name = query or progress.get("name") or progress.get("id") or "unnamed"
        name = str(name)
        for key, gauge in (
            ("numInputRows", self._query_input_rows),
            ("inputRowsPerSecond", self._query_input_rate),
            ("processedRowsPerSecond", self._query_processed_rate),
            ("batchId", self._query_batch_id),
        ):
            value = _number(progress.get(key))
            if value is not None:
                gauge.labels(query=name).set(value)
        durations = progress.get("durationMs")
        if isinstance(durations, Mapping):
            for operation, millis in durations.items():
                value = _number(millis)
                if value is not None:
                    self._query_duration.labels(query=name, operation=str(operation)).set(
                        value / 1000.0)

    # ------------------------------------------------------------------ exposition

    def exposition(self) -> str:
        """The registry in Prometheus text format (what /metrics serves)."""
        return generate_latest(self.registry).decode("utf-8")

    def start_http_server(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve /metrics on host:port (port 0 = any free port; see ``MetricsServer.port``)."""
        return serve_registry(self.registry, port, host)

    def serve(self, config: MetricsConfig) -> MetricsServer | None:
        """Start the endpoint the config asks for, or nothing when ``metrics.port`` is 0."""
        if not config.enabled:
            return None
        return self.start_http_server(config.port, config.host)


def _count(value: int, what: str) -> int:
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return None if math.isinf(number) else number
