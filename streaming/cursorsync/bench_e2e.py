"""End-to-end benchmark: the real job between two embedded clusters (``cursorsync bench e2e``).

Two phases on one sandbox (two pulsar-lite brokers, replication A -> B):

1. **Mapping ingestion.** A backlog is produced on A first (a partitioned
   topic, batched and unbatched entries, asynchronous sends) and replicated to
   B before the job starts. Then the job starts and we time how long the
   mapping query takes to cover the backlog: target entries mapped per second
   of wall time from ``start_job`` until the last backlog row was ingested,
   with the Spark session already up (its start-up is reported apart). Spark
   progress gives the per-batch rates; the foreachBatch time is split into
   reading (Pulsar -> Arrow on the executors), the mapping builder and the
   Delta append. The mapping is then checked against the replicator's ground
   truth, pair by pair.
2. **Sync lag.** A producer on A (another partitioned topic, paced) and
   recording consumers on A that ack each message as it comes, some late
   (out of order) and a few never (holes). For every source entry we keep the
   moment its ack left the consumer, and for every target entry the moment
   the emitter's ack reached B (the ack-recording proxy in front of B, which
   is what B's admin stats are folded from). Lag = target ack - source ack,
   per entry, through the replicator's (source -> target) pairs.

Zero-loss check, from ground truth: every target entry acked on B must be a
replica of a source entry that was fully acked on A before the target ack
(a target ack earlier than its source ack, or of an entry whose source is not
acked, is a loss on failover).

B's ack-recording proxy sees only the emitter's acks: the mapping query's
readers connect to B's broker directly (``E2ESpec.readers_via_proxy``). Through
the proxy every reader's cumulative acks became a subscription of its own in
the sandbox's state, folded on every internalStats call, and reading B's
cursors grew slower all run long (lag p99 by quarter 3.0 / 3.6 / 5.4 / 6.9 s
in a 60 s run; direct: flat at 2.7 - 3.0 s).

Why the phases use two topics: pulsar-lite dispatches badly to a live reader
while producers pipeline asynchronous sends (duplicated and missing messages,
seen here with 2,000 messages: 1,286 read / 1,000 distinct), which stops the
emulated replicator on a batched entry. So the backlog is produced with the
replicator stopped and replicated afterwards, and the steady workload sends
synchronously, one unbatched message at a time, at a few hundred per second.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from cursorsync.errors import CursorSyncError
from cursorsync.metrics import Metrics

log = logging.getLogger(__name__)

BULK_TOPIC = "bulk"
LIVE_TOPIC = "live"
SUBSCRIPTION = "app"
PAYLOAD_PAD = b"." * 64


class BenchError(CursorSyncError):
    """The benchmark could not complete a phase; the message says which and why."""


@dataclass(frozen=True)
class E2ESpec:
    """What the benchmark runs. The defaults are the ``cursorsync bench e2e`` run."""

    #: Entries in the backlog on A (all partitions together), before replication.
    backlog_entries: int = 200_000
    partitions: int = 4
    #: Share of backlog entries that are batches (of ``batch_size`` messages).
    batched_fraction: float = 0.2
    batch_size: int = 5
    live_partitions: int = 2
    #: Messages per second the steady producer sends (unbatched, synchronous).
    rate_per_s: float = 200.0
    steady_seconds: float = 60.0
    #: Share of received messages acked late (0.3 - 2 s after), so out of order.
    late_fraction: float = 0.1
    #: Share of received messages never acked (holes in the source cursor).
    hole_fraction: float = 0.01
    trigger_interval_s: float = 1.0
    #: Entries per stream per mapping batch; None: as the embedded config says (50,000).
    #: Per-batch costs (a reader opened per topic partition and a broker seek per range,
    #: commits, the sink) are paid per batch: at 20,000 the same backlog ran at 12.9k
    #: warm entries/s, at 50,000 at ~21k (README).
    max_entries_per_batch: int | None = None
    strategies: tuple[str, ...] = ("position-property", "identity")
    #: evidence.identity_scope: all, or batched (brokers that stamp the source position).
    identity_scope: str = "all"
    #: How long to wait for the last source acks to reach B after the workload.
    #: Let the mapping query's readers reach B through the ack-recording proxy too. The
    #: proxy records every reader's cumulative acks as a subscription of its own (one per
    #: mapping batch and partition), and the sandbox's internalStats folds all of them on
    #: every call, so reading B's cursors slows down as the run goes on. Off: the readers
    #: go to B's broker directly and only the emitter's acks pass the proxy.
    readers_via_proxy: bool = False
    drain_timeout_s: float = 20.0
    replication_timeout_s: float = 300.0
    mapping_timeout_s: float = 300.0
    seed: int = 11

    def __post_init__(self) -> None:
        if self.backlog_entries < self.partitions or self.partitions < 1:
            raise BenchError(f"backlog_entries ({self.backlog_entries}) must be >= partitions "
                             f"({self.partitions}) >= 1")
        if self.live_partitions < 1 or self.rate_per_s <= 0 or self.batch_size < 2:
            raise BenchError("live_partitions >= 1, rate_per_s > 0 and batch_size >= 2 needed")


# ------------------------------------------------------------------ instrumentation


@dataclass
class _Recorded:
    ingested: list[tuple[float, str, int]] = field(default_factory=list)
    batches: list[tuple[float, str, float]] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)
    acks: list[tuple[float, int]] = field(default_factory=list)
    translation_s: list[float] = field(default_factory=list)
    #: Rows the mapping sink took in, per mapping batch, in the order it ran them.
    mapping_batch_rows: list[int] = field(default_factory=list)


class RecordingMetrics(Metrics):
    """Metrics that also keep every observation with its time, for the benchmark's report."""

    def __init__(self) -> None:
        super().__init__()
        self.rec = _Recorded()
        self._rec_lock = threading.Lock()
        #: Set by the bench: CPU is then sampled at the end of every mapping batch.
        self.cpu: CpuSampler | None = None
        self.cpu_after_mapping_batch: list[dict[str, float]] = []
        self._rows_this_batch = 0

    def record_entries_ingested(self, cluster: str, count: int) -> None:
        super().record_entries_ingested(cluster, count)
        with self._rec_lock:
            self.rec.ingested.append((time.monotonic(), cluster, count))
            self._rows_this_batch += count

    def observe_batch(self, query: str, seconds: float) -> None:
        super().observe_batch(query, seconds)
        sample = self.cpu.sample() if self.cpu is not None and query == "mapping" else None
        with self._rec_lock:
            self.rec.batches.append((time.monotonic(), query, seconds))
            if sample is not None:
                self.cpu_after_mapping_batch.append(sample)
            if query == "mapping":  # the sink counts a batch's rows just before this
                self.rec.mapping_batch_rows.append(self._rows_this_batch)
                self._rows_this_batch = 0

    def observe_progress(self, progress: Mapping[str, Any], query: str | None = None) -> None:
        super().observe_progress(progress, query)
        with self._rec_lock:
            self.rec.progress.append(dict(progress))

    def record_acks(self, subscription: str, kind: Any, count: int = 1) -> None:
        super().record_acks(subscription, kind, count)
        with self._rec_lock:
            self.rec.acks.append((time.monotonic(), count))

    def observe_translation(self, seconds: float) -> None:
        super().observe_translation(seconds)
        with self._rec_lock:
            self.rec.translation_s.append(seconds)

    def ingested(self, cluster: str) -> int:
        with self._rec_lock:
            return sum(n for _, c, n in self.rec.ingested if c == cluster)

    def snapshot(self) -> _Recorded:
        with self._rec_lock:
            return _Recorded(list(self.rec.ingested), list(self.rec.batches),
                             list(self.rec.progress), list(self.rec.acks),
                             list(self.rec.translation_s), list(self.rec.mapping_batch_rows))


class _Timers:
    """Wall time spent inside wrapped callables, by name (the mapping sink's parts)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                    self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def get(self, name: str) -> float:
        with self._lock:
            return self.seconds.get(name, 0.0)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.seconds)


def _time_sync_parts(job: Any, timers: _Timers) -> None:
    """Time the sync sink's parts: the mapping refresh, reading B's cursors, emitting."""
    sink = job.sync_sink
    sink.mappings.refresh = timers.wrap("sync:mappings refresh", sink.mappings.refresh)
    sink.step.read_target = timers.wrap("sync:read target (B admin)", sink.step.read_target)
    if job.emitter is not None:
        job.emitter.apply = timers.wrap("sync:emit", job.emitter.apply)


DUPLICATE_KEY = ("cluster", "topic", "partition", "ledger", "entry", "batch_index")


@contextmanager
def _timed_builder(timers: _Timers, duplicates: list[int]) -> Iterator[None]:
    """Time MappingBuilder.process for the job's lifetime (the sink makes new builders), and
    count rows the mapping stream delivered twice (outside the timing)."""
    from cursorsync.builder import MappingBuilder

    original = MappingBuilder.process
    timed = timers.wrap("builder", original)

    def process(self: Any, table: Any) -> Any:
        if table.num_rows:
            distinct = table.select(list(DUPLICATE_KEY)).group_by(list(DUPLICATE_KEY)).aggregate([])
            duplicates.append(table.num_rows - distinct.num_rows)
        return timed(self, table)

    MappingBuilder.process = process  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        MappingBuilder.process = original  # type: ignore[method-assign]


def _time_appends(store: Any, timers: _Timers) -> None:
    """Time the store's appends per table (an instance attribute shadows the method)."""
    original = store.append

    def append(table: str, *args: Any, **kwargs: Any) -> Any:
        return timers.wrap(f"append:{table}", original)(table, *args, **kwargs)

    store.append = append


class CpuSampler:
    """CPU seconds by process group, from /proc (Linux): this driver process (with the
    sandbox's replicator, proxy and admin threads), the Spark JVM, its Python workers, and
    each broker. Empty where /proc is missing."""

    def __init__(self, brokers: Mapping[str, int | None]) -> None:
        self.brokers = {pid: f"broker {c}" for c, pid in brokers.items() if pid}
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _stats(self) -> dict[int, tuple[int, str, float]]:
        out: dict[int, tuple[int, str, float]] = {}
        for d in Path("/proc").glob("[0-9]*"):
            try:
                raw = (d / "stat").read_text()
            except OSError:
                continue  # the process ended between listing and reading
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            f = raw[raw.rindex(")") + 2:].split()
            # fields after comm: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
            cpu = sum(int(x) for x in f[11:15]) / self.tick
            out[int(d.name)] = (int(f[1]), comm, cpu)
        return out

    def sample(self) -> dict[str, float]:
        stats = self._stats()
        me = os.getpid()
        groups: dict[str, float] = {}

        def group(start: int) -> str | None:
            pid, descendant = start, False
            for _ in range(64):
                if pid in self.brokers:
                    return self.brokers[pid]
                if pid == me:
                    return "driver"
                ppid, comm, _ = stats.get(pid, (0, "", 0.0))
                if ppid == me:
                    if comm != "java":
                        return "driver children"
                    return "python workers" if descendant else "spark jvm"
                descendant = True
                pid = ppid
                if pid <= 1:
                    return None
            return None

        for pid, (_, _, cpu) in stats.items():
            g = group(pid)
            if g is not None:
                groups[g] = groups.get(g, 0.0) + cpu
        return groups

    @staticmethod
    def diff(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
        return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 2)
                for k in sorted(set(before) | set(after))}


# ------------------------------------------------------------------ phase 1: backlog


@dataclass(frozen=True)
class Backlog:
    entries: int
    messages: int
    batched_entries: int
    produce_s: float
    replicate_s: float


def _produce_backlog(sandbox: Any, spec: E2ESpec) -> tuple[int, float]:
    """Asynchronous sends, batched and unbatched runs interleaved; returns (messages, seconds)."""
    rng = random.Random(spec.seed)
    client = sandbox.client("A")
    per_part = spec.backlog_entries // spec.partitions
    done = threading.Semaphore(0)
    failures: list[str] = []

    import pulsar

    def cb(res: Any, _mid: Any) -> None:
        if res != pulsar.Result.Ok:
            failures.append(str(res))
        done.release()

    t0 = time.monotonic()
    sent = 0
    producers = []
    try:
        for i, topic in enumerate(sandbox.partitions(BULK_TOPIC)):
            single = client.create_producer(
                topic, producer_name=f"bulk-{i}-single", batching_enabled=False,
                max_pending_messages=50_000, block_if_queue_full=True)
            batching = client.create_producer(
                topic, producer_name=f"bulk-{i}-batch", batching_enabled=True,
                batching_max_messages=spec.batch_size, batching_max_publish_delay_ms=50,
                batching_max_allowed_size_in_bytes=1 << 22, max_pending_messages=50_000,
                block_if_queue_full=True)
            producers += [single, batching]
            entries = n = 0
            while entries < per_part:
                batched = rng.random() < spec.batched_fraction
                run = rng.randint(1, 20)
                for _ in range(run):
                    if entries >= per_part:
                        break
                    k = spec.batch_size if batched else 1
                    p = batching if batched else single
                    for _ in range(k):
                        payload = b"%d/%d " % (i, n) + PAYLOAD_PAD
                        p.send_async(payload, cb, properties={"n": str(n)},
                                     partition_key=f"k{n % 16}", event_timestamp=10**12 + n)
                        n += 1
                    entries += 1
                if batched:
                    batching.flush()
            sent += n
        for p in producers:
            p.flush()
        for _ in range(sent):
            if not done.acquire(timeout=60):
                raise BenchError("backlog: sends on A were not confirmed within 60 s")
        if failures:
            raise BenchError(f"backlog: {len(failures)} sends failed on A, e.g. {failures[0]}")
    finally:
        for p in producers:
            p.close()
    return sent, time.monotonic() - t0


def _seed_live(sandbox: Any) -> None:
    """One message per live partition: the mapping source probes an empty topic for 500 ms
    per trigger, which would slow every mapping batch of the backlog phase."""
    client = sandbox.client("A")
    for topic in sandbox.partitions(LIVE_TOPIC):
        p = client.create_producer(topic, producer_name="live-seed")
        p.send(b"seed", properties={"n": "seed"})
        p.close()


def _replicate(sandbox: Any, spec: E2ESpec) -> tuple[int, int, float]:
    """Start the replicator and wait until it copied every entry of A."""
    state = sandbox.state("A")
    topics = sandbox.partitions(BULK_TOPIC) + sandbox.partitions(LIVE_TOPIC)
    # Distinct positions: the sandbox's TopicLog can list a batched entry twice when a
    # refresh ends in the middle of the batch (it closes the partial entry).
    want = {t: len({(e.ledger, e.entry) for e in state.log(t).refresh()}) for t in topics}
    t0 = time.monotonic()
    sandbox.replicator.start()
    deadline = t0 + spec.replication_timeout_s
    while True:
        sandbox.replicator.check()
        got = sum(len(sandbox.replicator.entries(t)) for t in topics)
        if got >= sum(want.values()):
            break
        if time.monotonic() > deadline:
            raise BenchError(f"replication copied {got} of {sum(want.values())} entries in "
                             f"{spec.replication_timeout_s:.0f} s")
        time.sleep(0.25)
    elapsed = time.monotonic() - t0
    batched = sum(1 for e in sandbox.replicator.entries() if e.batch_size > 0)
    return sum(want.values()), batched, elapsed


# ------------------------------------------------------------------ phase 1: mapping


@dataclass(frozen=True)
class MappingResult:
    entries: int
    rows_target: int
    rows_total: int
    wall_s: float
    entries_per_s: float
    rows_per_s: float
    first_batch_after_s: float
    entries_per_s_after_first_batch_start: float | None
    batches: int
    sink_s: float
    read_s: float
    builder_s: float
    append_s: float
    spark_overhead_s: float
    per_batch: list[dict[str, Any]]
    pairs_checked: int
    pairs_wrong: int
    pairs_unmapped: int


def _wait_mapped(metrics: RecordingMetrics, want: Mapping[str, int], timeout_s: float,
                 job: Any) -> float:
    """Until the mapping query ingested ``want`` rows per cluster; returns when (monotonic)."""
    from cursorsync.job import query_failure

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for q in job.queries:
            if q.exception() is not None:
                raise BenchError(str(query_failure(q.name, q.exception())))
        if all(metrics.ingested(c) >= n for c, n in want.items()):
            rec = metrics.snapshot()
            totals = dict.fromkeys(want, 0)
            for t, c, n in rec.ingested:
                if c in totals:
                    totals[c] += n
                if all(totals[k] >= want[k] for k in want):
                    return t
        time.sleep(0.1)
    got = {c: metrics.ingested(c) for c in want}
    raise BenchError(f"the mapping query ingested {got} rows of {dict(want)} in {timeout_s:.0f} s")


def _check_mapping(sandbox: Any, config: Any, topics: list[str]) -> tuple[int, int, int]:
    """Every replicated pair looked up in the mappings table: (checked, wrong, unmapped)."""
    from cursorsync.job import MappingStore
    from cursorsync.pulsar.topics import TopicName
    from cursorsync.tables import open_store
    from cursorsync.tables.rows import PartitionKey

    store = open_store(config.tables.backend, config.tables.path)
    mappings = MappingStore(store, config.source.name, config.target.name).refresh()
    checked = wrong = unmapped = 0
    for topic in topics:
        tn = TopicName.parse(topic)
        pairs = sandbox.replicator.pairs(topic)
        m = mappings.get(PartitionKey(str(tn.base), tn.partition))
        src = np.array([(p[0].ledger, p[0].entry) for p in pairs], dtype=np.int64).reshape(-1, 2)
        tgt = np.array([(p[1].ledger, p[1].entry) for p in pairs], dtype=np.int64).reshape(-1, 2)
        checked += len(pairs)
        if m is None:
            unmapped += len(pairs)
            continue
        got = _lookup_all(m.segments.rows, src)
        unmapped += int((got[:, 0] < 0).sum())
        wrong += int(((got[:, 0] >= 0) & np.any(got != tgt, axis=1)).sum())
    return checked, wrong, unmapped


def _lookup_all(rows: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Vectorised segment lookup: target (ledger, entry) per source row, (-1, -1) if none."""
    out = np.full_like(src, -1)
    if len(rows) == 0 or len(src) == 0:
        return out
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    rows = rows[order]
    # Position key: ledger * 2**32 + entry (pulsar-lite ledgers and entries are small).
    seg_key = rows[:, 0] * (1 << 32) + rows[:, 1]
    key = src[:, 0] * (1 << 32) + src[:, 1]
    i = np.searchsorted(seg_key, key, side="right") - 1
    ok = i >= 0
    ic = np.clip(i, 0, None)
    off = src[:, 1] - rows[ic, 1]
    ok &= (rows[ic, 0] == src[:, 0]) & (off >= 0) & (off < rows[ic, 4])
    out[ok, 0] = rows[ic[ok], 2]
    out[ok, 1] = rows[ic[ok], 3] + off[ok]
    return out


def _mapping_batches(progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in progress:
        if p.get("name") != "cursorsync-mapping" or not p.get("numInputRows"):
            continue
        d = p.get("durationMs", {})
        out.append({
            "batch_id": p.get("batchId"),
            "rows": p.get("numInputRows"),
            "trigger_ms": d.get("triggerExecution"),
            "add_batch_ms": d.get("addBatch"),
            "latest_offset_ms": d.get("latestOffset"),
            "get_batch_ms": d.get("getBatch"),
            "planning_ms": d.get("queryPlanning"),
            "wal_commit_ms": d.get("walCommit"),
            "commit_ms": d.get("commitOffsets"),
        })
    return out


# ------------------------------------------------------------------ phase 2: steady


@dataclass
class _Steady:
    """What the steady workload did, with the times of its source acks."""

    produced: int = 0
    received: int = 0
    acked: int = 0
    late: int = 0
    holes: int = 0
    duplicates_received: int = 0
    source_ack_at: dict[tuple[str, int, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _producer_loop(sandbox: Any, spec: E2ESpec, stop: threading.Event, out: _Steady) -> None:
    client = sandbox.client("A")
    topics = sandbox.partitions(LIVE_TOPIC)
    producers = [client.create_producer(t, producer_name=f"live-{i}", batching_enabled=False)
                 for i, t in enumerate(topics)]
    try:
        interval = 1.0 / spec.rate_per_s
        nxt = time.monotonic()
        n = 0
        while not stop.is_set():
            p = producers[n % len(producers)]
            p.send(b"live %d " % n + PAYLOAD_PAD, properties={"n": str(n)},
                   event_timestamp=2 * 10**12 + n)
            n += 1
            with out.lock:
                out.produced = n
            nxt += interval
            delay = nxt - time.monotonic()
            if delay > 0:
                stop.wait(delay)
    finally:
        for p in producers:
            p.close()


def _consumer_loop(sandbox: Any, topic: str, spec: E2ESpec, seed: int, stop: threading.Event,
                   out: _Steady) -> None:
    """Ack as received, except late (held 0.3-2 s) and holes (never); dedups pulsar-lite's
    occasional redelivery of an entry to a live consumer by deciding per entry once."""
    import pulsar

    rng = random.Random(seed)
    consumer = sandbox.subscribe("A", topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared,
                                 initial_position=pulsar.InitialPosition.Earliest)
    decided: dict[tuple[int, int], str] = {}
    held: list[tuple[float, Any]] = []

    def ack(msg: Any) -> None:
        ev = consumer.acknowledge(msg)
        key = (consumer.topic, ev.ledger, ev.entry)
        with out.lock:
            out.acked += 1
            out.source_ack_at.setdefault(key, ev.at)

    try:
        while not stop.is_set() or held:
            now = time.monotonic()
            due = [m for t, m in held if t <= now or stop.is_set()]
            held = [(t, m) for t, m in held if t > now and not stop.is_set()]
            for m in due:
                ack(m)
            if stop.is_set():
                continue
            try:
                msg = consumer.receive(50)
            except pulsar.Timeout:
                continue
            mid = msg.message_id()
            pos = (mid.ledger_id(), mid.entry_id())
            with out.lock:
                out.received += 1
            if pos in decided:
                with out.lock:
                    out.duplicates_received += 1
                if decided[pos] == "ack":
                    ack(msg)
                continue
            r = rng.random()
            if r < spec.hole_fraction:
                decided[pos] = "hole"
                with out.lock:
                    out.holes += 1
            elif r < spec.hole_fraction + spec.late_fraction:
                decided[pos] = "ack"
                held.append((now + rng.uniform(0.3, 2.0), msg))
                with out.lock:
                    out.late += 1
            else:
                decided[pos] = "ack"
                ack(msg)
    finally:
        consumer.close()


def _target_ack_times(sandbox: Any, topics: list[str]) -> dict[tuple[str, int, int], float]:
    """When each target entry became fully acked on B, from the proxy's recorded acks."""
    from cursorsync.positions import Position

    sizes = {(e.topic, e.target.ledger, e.target.entry): e.batch_size
             for t in topics for e in sandbox.replicator.entries(t)}
    out: dict[tuple[str, int, int], float] = {}
    indexes: dict[tuple[str, int, int], set[int]] = {}
    cumulative: dict[str, list[tuple[Position, float]]] = {}
    wanted = set(topics)
    for ev in sandbox.state("B").ack_events():
        if ev.topic not in wanted or ev.subscription != SUBSCRIPTION:
            continue
        key = (ev.topic, ev.ledger, ev.entry)
        if ev.cumulative:
            cumulative.setdefault(ev.topic, []).append((Position(ev.ledger, ev.entry), ev.at))
            continue
        if ev.batch_index >= 0:
            got = indexes.setdefault(key, set())
            got.add(ev.batch_index)
            if len(got) < max(1, sizes.get(key, 0)):
                continue
        out.setdefault(key, ev.at)
    for topic, cums in cumulative.items():
        for e in sandbox.replicator.entries(topic):
            key = (topic, e.target.ledger, e.target.entry)
            for pos, at in cums:
                if e.target <= pos and at < out.get(key, float("inf")):
                    out[key] = at
    return out


@dataclass(frozen=True)
class LagResult:
    count: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    mean_s: float | None
    unsynced: int
    losses: int
    target_acks: int
    acks_emitted: int
    acks_per_s: float
    sync_batches: int
    sync_batch_p50_s: float | None
    sync_batch_p99_s: float | None
    translate_p99_ms: float | None


def _mapped_at(config: Any, topics: list[str]) -> dict[tuple[str, int, int], float]:
    """When each source entry of ``topics`` was first covered by a segment in ``mappings``
    (the row's written_at, Unix seconds): the earliest moment the sync could ack it."""
    from cursorsync.pulsar.topics import TopicName
    from cursorsync.tables import RowFilter, open_store

    names = {(str(TopicName.parse(t).base), TopicName.parse(t).partition): t for t in topics}
    store = open_store(config.tables.backend, config.tables.path)
    rows = store.read("mappings", RowFilter.of(topic=sorted({b for b, _ in names})))
    out: dict[tuple[str, int, int], float] = {}
    table = rows.filter(pc.equal(rows.column("kind"), "segment"))
    cols = {c: table.column(c).to_pylist() for c in (
        "topic", "partition", "source_ledger", "source_entry", "count", "written_at")}
    order = sorted(range(table.num_rows), key=lambda i: cols["written_at"][i])
    for i in order:
        topic = names.get((cols["topic"][i], cols["partition"][i]))
        if topic is None:
            continue
        at = cols["written_at"][i].timestamp()
        ledger, first = cols["source_ledger"][i], cols["source_entry"][i]
        for entry in range(first, first + cols["count"][i]):
            out.setdefault((topic, ledger, entry), at)
    return out


def _lag_breakdown(config: Any, topics: list[str], steady: _Steady,
                   target_at: Mapping[tuple[str, int, int], float]) -> dict[str, Any]:
    """Split each lag into waiting for the mapping (source ack -> segment written) and the
    sync path (later of the two -> target ack)."""
    mapped = _mapped_at(config, topics)
    with steady.lock:
        src_at = dict(steady.source_ack_at)
    waiting: list[float] = []
    syncing: list[float] = []
    for s, at in src_at.items():
        t_at = target_at.get(s)
        m_at = mapped.get(s)
        if t_at is None or m_at is None:
            continue
        waiting.append(max(0.0, m_at - at))
        syncing.append(t_at - max(at, m_at))
    return {"wait_for_mapping_p50_s": _pct(waiting, 50), "wait_for_mapping_p99_s":
            _pct(waiting, 99), "sync_path_p50_s": _pct(syncing, 50),
            "sync_path_p99_s": _pct(syncing, 99)}


def _by_quarter(steady: _Steady, target_at: Mapping[tuple[str, int, int], float],
                ) -> list[float | None]:
    """Lag p99 per quarter of the run (by source ack time): does the lag grow with time?"""
    with steady.lock:
        src_at = dict(steady.source_ack_at)
    pairs = sorted((at, target_at[s] - at) for s, at in src_at.items() if s in target_at)
    if not pairs:
        return []
    lo, hi = pairs[0][0], pairs[-1][0]
    width = (hi - lo) / 4 or 1.0
    quarters: list[list[float]] = [[], [], [], []]
    for at, lag in pairs:
        quarters[min(3, int((at - lo) / width))].append(lag)
    return [_pct(q, 99) for q in quarters]


def _target_at_by_source(sandbox: Any, topics: list[str]) -> dict[tuple[str, int, int], float]:
    tgt_at = _target_ack_times(sandbox, topics)
    out = {}
    for t in topics:
        for e in sandbox.replicator.entries(t):
            at = tgt_at.get((t, e.target.ledger, e.target.entry))
            if at is not None:
                out[(t, e.source.ledger, e.source.entry)] = at
    return out


def _lags(sandbox: Any, topics: list[str], steady: _Steady) -> tuple[list[float], int, int, int]:
    """(lag samples, source-acked entries without a target ack, losses, target acks)."""
    src_to_tgt: dict[tuple[str, int, int], tuple[str, int, int]] = {}
    tgt_to_src: dict[tuple[str, int, int], tuple[str, int, int]] = {}
    for t in topics:
        for e in sandbox.replicator.entries(t):
            src = (t, e.source.ledger, e.source.entry)
            tgt = (t, e.target.ledger, e.target.entry)
            src_to_tgt[src] = tgt
            tgt_to_src[tgt] = src
    tgt_at = _target_ack_times(sandbox, topics)
    with steady.lock:
        src_at = dict(steady.source_ack_at)
    lags: list[float] = []
    unsynced = 0
    for src, at in src_at.items():
        g = src_to_tgt.get(src)
        t_at = tgt_at.get(g) if g is not None else None
        if t_at is None:
            unsynced += 1
        else:
            lags.append(t_at - at)
    losses = 0
    for tgt, at in tgt_at.items():
        s = tgt_to_src.get(tgt)
        s_at = src_at.get(s) if s is not None else None
        if s_at is None or s_at > at:
            losses += 1
            log.error("loss: target entry %s acked at %.3f, its source %s %s", tgt, at, s,
                      "never acked" if s_at is None else f"acked later, at {s_at:.3f}")
    return lags, unsynced, losses, len(tgt_at)


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


# ------------------------------------------------------------------ the run


@dataclass(frozen=True)
class E2EReport:
    spec: dict[str, Any]
    machine: dict[str, Any]
    backlog: dict[str, Any]
    mapping: dict[str, Any]
    steady: dict[str, Any]
    lag: dict[str, Any]
    losses: int
    spark_startup_s: float
    total_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"benchmark": "e2e", **asdict(self)}

    def table(self) -> str:
        m, lag, b, s = self.mapping, self.lag, self.backlog, self.steady
        rows = [
            ("machine", f"{self.machine['cores']} cores, {self.machine['python']}, "
                        f"{self.machine['platform']}"),
            ("trigger interval", f"{self.spec['trigger_interval_s']} s"),
            ("backlog", f"{b['entries']} entries ({b['batched_entries']} batched), "
                        f"{b['messages']} messages, {self.spec['partitions']} partitions"),
            ("  produce / replicate", f"{b['produce_s']:.1f} s / {b['replicate_s']:.1f} s"),
            ("spark start-up", f"{self.spark_startup_s:.1f} s"),
            ("mapping ingestion", f"{m['entries_per_s']:,.0f} entries/s "
                                  f"({m['rows_per_s']:,.0f} rows/s incl. source side)"),
            ("  wall", f"{m['wall_s']:.1f} s for {m['entries']} entries in {m['batches']} "
                       f"batch(es); first batch after {m['first_batch_after_s']:.1f} s"),
            ("  start-up", f"start_job {m['start_job_s']:.1f} s, first trigger after "
                           f"{_fmt(m['first_trigger_after_s'])} s"),
            ("  where time goes", f"read {m['read_s']:.1f} s, builder {m['builder_s']:.1f} s, "
                                  f"append {m['append_s']:.1f} s, spark/driver "
                                  f"{m['spark_overhead_s']:.1f} s"),
            ("  after first batch start", f"{m['entries_per_s_after_first_batch_start']:,.0f} "
                                          "entries/s"),
            ("  warm batches (1..)", "-" if m["warm_rows_per_s"] is None else
             f"{m['warm_entries_per_s']:,.0f} entries/s ({m['warm_rows_per_s']:,.0f} rows/s)"),
            ("  spark batch rate", ", ".join(
                f"batch {b['batch_id']}: {b['rows']} rows at {b['processed_rows_per_s']:,.0f} "
                "rows/s" if b["processed_rows_per_s"] is not None else
                f"batch {b['batch_id']}: {b['spark_rows']} Spark rows"
                for b in m["per_batch"]) or "-"),
            ("  cpu seconds", ", ".join(f"{k} {v:.1f}" for k, v in m["cpu_seconds"].items())
             or "-"),
            ("  per cursorsync cpu-second", "-" if m["entries_per_cursorsync_cpu_s"] is None
             else f"{m['entries_per_cursorsync_cpu_s']:,.0f} entries (brokers took "
                  f"{100 * (m['broker_cpu_share'] or 0):.0f}% of all cpu)"),
            ("  reader alone", f"{m['reader_alone']['rows_per_s']:,.0f} rows/s on one core "
                               f"({m['reader_alone']['rows']} rows)"),
            ("  duplicate rows read", str(m["duplicate_rows_read"])),
            ("  mapping check", f"{m['pairs_checked']} pairs: {m['pairs_wrong']} wrong, "
                                f"{m['pairs_unmapped']} unmapped"),
            ("steady workload", f"{s['seconds']:.0f} s at {self.spec['rate_per_s']:.0f} msg/s "
                                f"on {self.spec['live_partitions']} partitions: "
                                f"{s['produced']} produced, {s['acked_entries']} entries acked "
                                f"({s['late']} late, {s['holes']} holes)"),
            ("sync lag p50 / p99 / max", f"{_fmt(lag['p50_s'])} / {_fmt(lag['p99_s'])} / "
                                         f"{_fmt(lag['max_s'])} s over {lag['count']} entries"),
            ("  waiting for mapping p50/p99", f"{_fmt(lag['wait_for_mapping_p50_s'])} / "
                                              f"{_fmt(lag['wait_for_mapping_p99_s'])} s"),
            ("  sync path p50/p99", f"{_fmt(lag['sync_path_p50_s'])} / "
                                    f"{_fmt(lag['sync_path_p99_s'])} s"),
            ("  p99 by quarter of the run", " / ".join(_fmt(x) for x in
                                                    lag["p99_by_quarter_s"]) + " s"),
            ("  sync batch parts (ms)", ", ".join(f"{k} {v}" for k, v in
                                                  lag["sync_batch_parts_ms"].items())),
            ("  sandbox internalStats (ms)", "start " + ", ".join(
                f"{k} {v}" for k, v in lag["sandbox_internal_stats_ms"]["start"].items())
             + "; end " + ", ".join(
                f"{k} {v}" for k, v in lag["sandbox_internal_stats_ms"]["end"].items())),
            ("  not synced at end", str(lag["unsynced"])),
            ("acks emitted", f"{lag['acks_emitted']} ({lag['acks_per_s']:.1f}/s); "
                             f"{lag['target_acks']} target entries acked"),
            ("sync batch p50 / p99", f"{_fmt(lag['sync_batch_p50_s'])} / "
                                     f"{_fmt(lag['sync_batch_p99_s'])} s"),
            ("losses (zero-loss check)", str(self.losses)),
            ("total", f"{self.total_s:.0f} s"),
        ]
        w = max(len(r[0]) for r in rows)
        return "\n".join(f"{a:<{w}}  {v}" for a, v in rows)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _config(sandbox: Any, root: Path, spec: E2ESpec) -> Any:
    from cursorsync.config import parse_config
    from cursorsync.demo import demo_config

    cfg = demo_config(sandbox, root, topics={BULK_TOPIC: spec.partitions,
                                             LIVE_TOPIC: spec.live_partitions},
                      subscription=SUBSCRIPTION, strategies=list(spec.strategies),
                      identity_scope=spec.identity_scope)
    data = cfg.model_dump(mode="json", by_alias=True)
    data["spark"]["trigger_interval_s"] = spec.trigger_interval_s
    if spec.max_entries_per_batch is not None:
        data["spark"]["max_entries_per_batch"] = spec.max_entries_per_batch
    data["metrics"]["port"] = 0
    if not spec.readers_via_proxy:
        data["clusters"]["target"]["service_url"] = sandbox.broker_url("B")
    return parse_config(data)


def _emitter(sandbox: Any, config: Any) -> Any:
    """The emitter start_job would make, but always through B's ack-recording proxy."""
    from cursorsync.emitter import PulsarEmitter

    return PulsarEmitter(sandbox.service_url("B"),
                         subscription_type=config.emission.subscription_type,
                         mode="receive-first", ack_batch_size=config.emission.ack_batch_size)


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def bench_e2e(spec: E2ESpec | None = None, *, work_dir: str | None = None,
              progress: Callable[[str], None] | None = None) -> E2EReport:
    """Run both phases on a fresh sandbox and return the figures."""
    from cursorsync.demo import _ensure_target_subscriptions
    from cursorsync.job import build_session, start_job
    from cursorsync.sandbox import Sandbox, SandboxConfig

    spec = spec or E2ESpec()
    say = progress or (lambda msg: log.info("%s", msg))
    t_start = time.monotonic()
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cursorsync-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    sb_cfg = SandboxConfig(topics={BULK_TOPIC: spec.partitions, LIVE_TOPIC: spec.live_partitions},
                           work_dir=root / "brokers", start_replicator=False)
    try:
        with _env("CURSORSYNC_EMIT_MODE", "receive-first"), Sandbox(sb_cfg) as sandbox:
            say(f"producing a backlog of {spec.backlog_entries} entries on A")
            messages, produce_s = _produce_backlog(sandbox, spec)
            _seed_live(sandbox)
            say("replicating the backlog to B")
            entries, batched, replicate_s = _replicate(sandbox, spec)
            live = sandbox.partitions(LIVE_TOPIC)
            bulk = sandbox.partitions(BULK_TOPIC)
            _ensure_target_subscriptions(sandbox, live, SUBSCRIPTION)
            backlog = Backlog(entries, messages + len(live), batched, produce_s, replicate_s)

            config = _config(sandbox, root, spec)
            say("starting Spark")
            t0 = time.monotonic()
            from pyspark.sql import SparkSession

            had_session = SparkSession.getActiveSession() is not None
            spark = build_session(config)
            spark_startup_s = time.monotonic() - t0
            metrics = RecordingMetrics()
            timers = _Timers()
            duplicates: list[int] = []
            try:
                with _timed_builder(timers, duplicates):
                    report = _run_job(sandbox, spec, config, spark, metrics, timers,
                                      duplicates, backlog, bulk, live, say, start_job)
            finally:
                if not had_session:
                    spark.stop()
            return E2EReport(
                spec=asdict(spec), machine=_machine(), backlog=asdict(backlog),
                mapping=report[0], steady=report[1], lag=report[2], losses=report[2]["losses"],
                spark_startup_s=round(spark_startup_s, 2),
                total_s=round(time.monotonic() - t_start, 1))
    finally:
        if not work_dir:
            shutil.rmtree(root, ignore_errors=True)


def _machine() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(terse=True), "machine": platform.machine()}


def _run_job(sandbox: Any, spec: E2ESpec, config: Any, spark: Any, metrics: RecordingMetrics,
             timers: _Timers, duplicates: list[int], backlog: Backlog, bulk: list[str],
             live: list[str], say: Callable[[str], None], start_job: Callable[..., Any],
             ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    # Rows each side's mapping stream must ingest: one per entry (the job reads rowsPer=entry).
    want = {config.target.name: backlog.entries}
    if "identity" in spec.strategies:
        # The source stream hands on the entries identity evidence digests (all, or the
        # batched ones with identity_scope batched).
        want[config.source.name] = (backlog.batched_entries if spec.identity_scope == "batched"
                                    else backlog.entries)
    say("mapping the backlog")
    cpu = CpuSampler({c: sandbox.brokers[c].pid for c in (sandbox.source, sandbox.target)})
    cpu0 = cpu.sample()
    metrics.cpu = cpu
    t0 = time.monotonic()
    t0_wall = time.time()
    job = start_job(config, spark=spark, metrics=metrics, emitter=_emitter(sandbox, config))
    start_job_s = time.monotonic() - t0
    try:
        _time_appends(job.mapping_sink.store, timers)
        _time_sync_parts(job, timers)
        covered_at = _wait_mapped(metrics, want, spec.mapping_timeout_s, job)
        covered_batch = job.mapping_sink.last_batch
        timed_mapping = timers.snapshot()
        cpu_mapping = CpuSampler.diff(cpu0, cpu.sample())
        alone = _reader_alone(sandbox, config, bulk[0])
        say(f"steady workload for {spec.steady_seconds:.0f} s")
        sync_batch0 = job.sync_sink.last_batch
        timed_before = timers.snapshot()
        steady, lag = _steady_phase(sandbox, spec, config, metrics, live)
        timed_after = timers.snapshot()
        sync_batches = max(1, job.sync_sink.last_batch - sync_batch0)
        progress = [p for p in _recent_progress(job.queries[0])
                    if p.get("batchId", 1 << 62) <= covered_batch]
        sync_progress = [p for p in _recent_progress(job.queries[1])
                         if p.get("batchId", -1) > sync_batch0]
    finally:
        job.stop()
    lag["sync_batch_parts_ms"] = _sync_parts(timed_before, timed_after, sync_batches,
                                             sync_progress)
    mapping = _mapping_result(sandbox, config, metrics, timed_mapping, backlog, bulk + live,
                              t0, covered_at, progress)
    _attach_batch_cpu(mapping["per_batch"], cpu0, metrics.cpu_after_mapping_batch)
    first_trigger = _first_trigger_after(progress, t0_wall)
    warm = [b for b in mapping["per_batch"]
            if b["batch_id"] and b["trigger_ms"] and b["rows"] is not None]
    warm_rows_s = (sum(b["rows"] for b in warm) / (sum(b["trigger_ms"] for b in warm) / 1000)
                   if warm else None)
    mapping["warm_rows_per_s"] = round(warm_rows_s, 1) if warm_rows_s else None
    mapping["warm_entries_per_s"] = (round(warm_rows_s * backlog.entries / mapping["rows_total"],
                                           1) if warm_rows_s and mapping["rows_total"] else None)
    mapping.update(start_job_s=round(start_job_s, 2), first_trigger_after_s=first_trigger,
                   cpu_seconds=cpu_mapping, duplicate_rows_read=sum(duplicates),
                   reader_alone=alone, **_cpu_shares(cpu_mapping, backlog.entries))
    return mapping, steady, lag


def _in_sink_order(per_batch: list[dict[str, Any]], recorded: int) -> bool:
    """Whether what the sink recorded per batch (``recorded`` of them, in the order it ran
    them) lines up with ``per_batch``: batches 0, 1, ... each reported. A batch without
    rows is not in per_batch, and the order would not match."""
    return recorded >= len(per_batch) and [b["batch_id"] for b in per_batch] == list(
        range(len(per_batch)))


def _attach_batch_rows(per_batch: list[dict[str, Any]], rows: list[int]) -> None:
    """Each batch's rows as the mapping sink counted them (``rows``); Spark's own count
    (``spark_rows``) is of Spark rows, which with ``layout=arrow`` each hold a record
    batch of entries. Where the order cannot be trusted, ``rows`` is left None rather
    than guessed."""
    trusted = _in_sink_order(per_batch, len(rows))
    for i, b in enumerate(per_batch):
        b["spark_rows"] = b["rows"]
        b["rows"] = rows[i] if trusted else None
        b["processed_rows_per_s"] = (round(rows[i] / (b["trigger_ms"] / 1000), 1)
                                     if trusted and b["trigger_ms"] else None)


def _attach_batch_cpu(per_batch: list[dict[str, Any]], start: Mapping[str, float],
                      after: list[dict[str, float]]) -> None:
    """CPU-s of each process group during each mapping batch (from the end of the one
    before, or the job's start), so where a batch's time goes is in the report itself.
    The sink samples at the end of each batch, in order; attached only when the count
    matches the batches reported, never guessed. A process that exits within a batch
    takes its CPU time out of its group's figure."""
    if not _in_sink_order(per_batch, len(after)):
        return
    before = dict(start)
    for b, sample in zip(per_batch, after, strict=False):
        b["cpu_s"] = CpuSampler.diff(before, sample)
        before = sample


def _cpu_shares(cpu: Mapping[str, float], entries: int) -> dict[str, float | None]:
    """The brokers run on the same cores here, so a rate per CPU-second of cursorsync's own
    processes (driver with the sandbox threads, JVM, Python workers) is what carries over
    to a deployment where the brokers are elsewhere."""
    total = sum(cpu.values())
    brokers = sum(v for k, v in cpu.items() if k.startswith("broker"))
    own = total - brokers
    return {"broker_cpu_share": round(brokers / total, 3) if total else None,
            "entries_per_cursorsync_cpu_s": round(entries / own, 1) if own > 0 else None}


def _sync_parts(before: Mapping[str, float], after: Mapping[str, float], batches: int,
                progress: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean milliseconds per sync batch in each part, and Spark's durations (p50/p99)."""
    out: dict[str, Any] = {}
    for name in sorted(after):
        if name.startswith("sync:") or name in ("append:cursor_states", "append:sync_progress"):
            out[name.removeprefix("sync:")] = round(
                1000 * (after[name] - before.get(name, 0.0)) / batches, 1)
    for op in ("latestOffset", "addBatch", "triggerExecution"):
        values = [float(p["durationMs"][op]) for p in progress
                  if op in p.get("durationMs", {})]
        if values:
            label = "poll A admin (latestOffset)" if op == "latestOffset" else op
            out[f"spark {label} p50/p99"] = [_pct(values, 50), _pct(values, 99)]
    return out


def _first_trigger_after(progress: list[dict[str, Any]], t0_wall: float) -> float | None:
    """Seconds from start_job to the mapping query's first trigger (progress timestamp)."""
    from datetime import datetime

    stamps = [p["timestamp"] for p in progress if p.get("batchId") == 0 and "timestamp" in p]
    if not stamps:
        return None
    at = datetime.fromisoformat(stamps[0].replace("Z", "+00:00")).timestamp()
    return round(at - t0_wall, 2)


def _reader_alone(sandbox: Any, config: Any, topic: str) -> dict[str, Any]:
    """The pulsar-entries reader in this process, without Spark: rows/s on one core."""
    from cursorsync.sources.entries import ClientSettings, EntriesPartition, read_entries

    last = max(e.target for e in sandbox.replicator.entries(topic))
    part = EntriesPartition(
        cluster=config.target.name, topic=topic, start="-1:-1", end=str(last),
        client=ClientSettings(sandbox.service_url("B")),
        identity_fields=tuple(config.evidence.identity_fields),
        identity="identity" in config.evidence.strategies,
        per_entry=True,
        source_position_property=config.evidence.source_position_property,
        read_timeout_ms=10_000)
    t0 = time.perf_counter()
    rows = sum(1 for _ in read_entries(part))
    dt = time.perf_counter() - t0
    return {"topic": topic, "rows": rows, "seconds": round(dt, 2),
            "rows_per_s": round(rows / dt, 1) if dt else None}


def _recent_progress(query: Any) -> list[dict[str, Any]]:
    """The query's recent progress reports (the last 100 by default) as dicts."""
    return [json.loads(p.json) for p in query.recentProgress]


def _mapping_result(sandbox: Any, config: Any, metrics: RecordingMetrics,
                    timed: Mapping[str, float],
                    backlog: Backlog, topics: list[str], t0: float, covered_at: float,
                    progress: list[dict[str, Any]]) -> dict[str, Any]:
    rec = metrics.snapshot()
    wall = covered_at - t0
    batches = [(t, s) for t, q, s in rec.batches if q == "mapping" and t <= covered_at + 1e-3]
    sink_s = sum(s for _, s in batches)
    first = min((t - s for t, s in batches), default=covered_at) - t0
    builder_s = timed.get("builder", 0.0)
    append_s = timed.get("append:mappings", 0.0)
    rows_total = sum(n for t, _, n in rec.ingested if t <= covered_at)
    rows_target = sum(n for t, c, n in rec.ingested
                      if t <= covered_at and c == config.target.name)
    checked, wrong, unmapped = _check_mapping(sandbox, config, topics)
    per_batch = _mapping_batches(progress)
    _attach_batch_rows(per_batch, rec.mapping_batch_rows)
    busy = covered_at - t0 - first
    return asdict(MappingResult(
        entries=backlog.entries, rows_target=rows_target, rows_total=rows_total,
        wall_s=round(wall, 2), entries_per_s=round(backlog.entries / wall, 1),
        rows_per_s=round(rows_total / wall, 1), first_batch_after_s=round(first, 2),
        entries_per_s_after_first_batch_start=round(backlog.entries / busy, 1) if busy else None,
        batches=len(batches), sink_s=round(sink_s, 2),
        read_s=round(max(0.0, sink_s - builder_s - append_s), 2),
        builder_s=round(builder_s, 2), append_s=round(append_s, 2),
        spark_overhead_s=round(max(0.0, wall - sink_s), 2), per_batch=per_batch,
        pairs_checked=checked, pairs_wrong=wrong, pairs_unmapped=unmapped))


def _admin_cost_ms(sandbox: Any, topic: str) -> dict[str, float]:
    """Milliseconds the sandbox takes to build internalStats of ``topic`` on A and on B, in
    this process (as its admin servers do per request): it folds every recorded ack."""
    from cursorsync.sandbox.admin_server import internal_stats

    out = {}
    for cluster in (sandbox.source, sandbox.target):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            internal_stats(sandbox.state(cluster), topic)
            best = min(best, time.perf_counter() - t0)
        out[cluster] = round(1000 * best, 1)
    return out


def _steady_phase(sandbox: Any, spec: E2ESpec, config: Any, metrics: RecordingMetrics,
                  live: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    steady = _Steady()
    stop_produce = threading.Event()
    stop_consume = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as err:  # reported after the join
                errors.append(err)
                log.error("steady workload thread failed: %s", err)
        return run

    consumers = [threading.Thread(target=guarded(_consumer_loop, sandbox, t, spec,
                                                 spec.seed + i, stop_consume, steady),
                                  name=f"e2e-consumer-{i}", daemon=True)
                 for i, t in enumerate(live)]
    producer = threading.Thread(target=guarded(_producer_loop, sandbox, spec, stop_produce,
                                               steady), name="e2e-producer", daemon=True)
    for th in consumers:
        th.start()
    t0 = time.monotonic()
    acks_before = sum(n for _, n in metrics.snapshot().acks)
    producer.start()
    time.sleep(min(2.0, spec.steady_seconds / 4))
    admin_start = _admin_cost_ms(sandbox, live[0])
    time.sleep(max(0.0, spec.steady_seconds - (time.monotonic() - t0)))
    admin_end = _admin_cost_ms(sandbox, live[0])
    stop_produce.set()
    producer.join(timeout=30)
    time.sleep(min(2.0, spec.steady_seconds / 4))  # let consumers receive the tail
    stop_consume.set()
    for th in consumers:
        th.join(timeout=30)
    if errors:
        raise BenchError(f"steady workload failed: {errors[0]}") from errors[0]
    produce_s = time.monotonic() - t0
    # Drain: until every acked source entry has its target ack (holes never will).
    deadline = time.monotonic() + spec.drain_timeout_s
    while time.monotonic() < deadline:
        lags, unsynced, _, _ = _lags(sandbox, live, steady)
        if unsynced == 0:
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    lags, unsynced, losses, target_acks = _lags(sandbox, live, steady)
    rec = metrics.snapshot()
    acks = sum(n for t, n in rec.acks) - acks_before
    sync_times = [s for t, q, s in rec.batches if q == "sync" and t >= t0]
    with steady.lock:
        steady_out = {"seconds": round(produce_s, 1), "produced": steady.produced,
                      "received": steady.received, "acked_messages": steady.acked,
                      "acked_entries": len(steady.source_ack_at), "late": steady.late,
                      "holes": steady.holes, "duplicates_received": steady.duplicates_received}
    lag = asdict(LagResult(
        count=len(lags), p50_s=_pct(lags, 50), p99_s=_pct(lags, 99),
        max_s=round(max(lags), 3) if lags else None,
        mean_s=round(float(np.mean(lags)), 3) if lags else None,
        unsynced=unsynced, losses=losses, target_acks=target_acks, acks_emitted=acks,
        acks_per_s=round(acks / elapsed, 1), sync_batches=len(sync_times),
        sync_batch_p50_s=_pct(sync_times, 50), sync_batch_p99_s=_pct(sync_times, 99),
        translate_p99_ms=(round(1000 * float(np.percentile(rec.translation_s, 99)), 2)
                          if rec.translation_s else None)))
    lag["sandbox_internal_stats_ms"] = {"start": admin_start, "end": admin_end}
    target_at = _target_at_by_source(sandbox, live)
    lag.update(_lag_breakdown(config, live, steady, target_at))
    lag["p99_by_quarter_s"] = _by_quarter(steady, target_at)
    lag["samples_s"] = [round(x, 3) for x in lags]
    return steady_out, lag


def run_e2e(*, seconds: float = 60.0, json_output: bool = False,
            spec: E2ESpec | None = None, backlog: int | None = None,
            strategies: tuple[str, ...] | None = None,
            identity_scope: str | None = None) -> str:
    """``cursorsync bench e2e``: the default run (or ``spec``) with a steady phase of
    ``seconds``; a table, or JSON with every lag sample."""
    from dataclasses import replace

    spec = replace(spec or E2ESpec(), steady_seconds=seconds)
    if backlog is not None:
        spec = replace(spec, backlog_entries=backlog)
    if strategies is not None:
        spec = replace(spec, strategies=strategies)
    if identity_scope is not None:
        spec = replace(spec, identity_scope=identity_scope)
    report = bench_e2e(spec)
    if json_output:
        data = report.to_dict()
        return json.dumps(data, indent=2, sort_keys=True)
    return report.table()
