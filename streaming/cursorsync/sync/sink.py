"""The sync query's sink: observed source cursors in; acks out (on the driver, or spread
across executors); ``cursor_states`` and ``sync_progress`` rows written per batch id.

A cursor that did not change since the previous batch (an idle one: the same source
state, nothing sent) repeats the rows written for it then; they are written again only
every ``tables.unchanged_rows_every_batches`` batches, so the tables grow with the cursors
that move, and every cursor's newest rows stay among the last RECENT_BATCHES batches,
where a restart reads them. The metrics count every cursor, every batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from cursorsync import gc_pause
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.phases import Phases
from cursorsync.sync.executors import ExecutorSettings
from cursorsync.sync.halts import (
    HaltCause,
    HaltedKeys,
    HaltKey,
    cause_of,
    halt_cause,
    halted_counts,
    new_halts,
    read_halt_causes,
    record_halts,
)
from cursorsync.sync.idle_store import IdleStore
from cursorsync.sync.kept_plans import newest
from cursorsync.sync.observed import Observations, observations, previous_states
from cursorsync.sync.plans import stable_hash
from cursorsync.sync.step import SyncStep
from cursorsync.sync.step_totals import StepResult
from cursorsync.sync.target_reads import AdminTargets
from cursorsync.tables.mappings_table import MappingStore, WaitsStore
from cursorsync.tables.rows import cursor_state_rows, sync_progress_rows
from cursorsync.tables.spill import Spill
from cursorsync.tables.store import TableStore

log = logging.getLogger(__name__)

#: The sync query's writer id in the tables' transaction log.
SYNC_APP = "cursorsync-sync"


class _Synced(NamedTuple):
    """What one sync batch produced, on the driver or on the executors."""

    observed: list[ObservedCursor]
    rows: pa.Table  # the sync_progress rows to write
    translate_seconds: float | None
    unavailable: int = 0  # subscriptions skipped: the target's admin API did not answer
    anchor_conflicts: int = 0  # plans refused: the mapping contradicts a snapshot anchor
    #: Cursors whose rows repeat those written in an earlier batch and are not due again.
    unchanged: frozenset[tuple[PartitionKey, str]] = frozenset()
    #: Per subscription, the lags of the unchanged cursors' records (not in ``rows``: each
    #: repeats an idle cursor's plan, emitted with nothing sent, unmapped or rewound).
    unchanged_lags: dict[str, list[float]] | None = None

    def count(self, outcome: str) -> int:
        """Rows with this outcome (the same in both emission modes)."""
        return int(pc.sum(pc.equal(self.rows.column("outcome"), outcome)).as_py() or 0)


@dataclass(frozen=True)
class SyncSinkSettings:
    """What the sync sink is made with, besides its step."""

    source_cluster: str
    target_cluster: str
    #: An idle cursor's rows are written once every this many batches.
    unchanged_rows_every_batches: int = 20
    #: Emission on executors: how the tasks reach the clusters and the tables (None: the
    #: driver emits).
    executors: ExecutorSettings | None = None


class SyncMetrics(Protocol):
    """What the sync sink records (:class:`cursorsync.app.metrics.Metrics` does)."""

    def set_first_plans_waiting(self, count: int) -> None: ...
    def set_idle_cursors(self, count: int) -> None: ...
    def observe_translation(self, seconds: float) -> None: ...
    def record_outcome(self, subscription: str, result: str, count: int = 1) -> None: ...
    def record_acks(self, subscription: str, kind: Literal["cumulative", "individual"],
                    count: int = 1) -> None: ...
    def set_unmapped_acked_many(self, subscription: str, entries: Mapping[str, int]) -> None: ...
    def set_redelivery_forecast(self, subscription: str, cause: str,
                                messages: Mapping[str, int]) -> None: ...
    def record_rewound(self, subscription: str, entries: int) -> None: ...
    def record_error(self, stage: str, count: int = 1) -> None: ...
    def observe_sync_lags(self, subscription: str, seconds: Iterable[float]) -> None: ...
    def mark_synced(self, subscription: str, at: float | None = None) -> None: ...
    def record_source_lookups(self, kind: str, count: int) -> None: ...
    def record_target_cursor_reads(self, way: str, count: int) -> None: ...
    def set_failover_ready(self, subscription: str, ready: bool) -> None: ...
    def observe_batch(self, query: str, seconds: float) -> None: ...
    def observe_batch_phases(self, query: str, seconds: Mapping[str, float], *,
                             cpu: Mapping[str, float] | None = None) -> None: ...
    def set_halted(self, counts: Mapping[tuple[str, str], int]) -> None: ...


class TailRequests(Protocol):
    """The tail checks' or the marker lookups' client, counting its requests to the
    source."""

    def requests_by_kind(self) -> dict[str, int]:
        """Requests made so far, by kind (``tail-check``: a reader each, ``plugin-tail``;
        ``raw-entry``: an entry each, ``plugin-markers``)."""
        ...


class SyncSink:
    """foreachBatch of the sync query."""

    def __init__(self, settings: SyncSinkSettings, store: TableStore, step: SyncStep,
                 metrics: SyncMetrics | None) -> None:
        self.settings = settings
        self.clusters = {"source_cluster": settings.source_cluster,
                         "target_cluster": settings.target_cluster}
        self.store = store
        self.step = step
        self.metrics = metrics
        #: Keeps the per-partition rows kept between batches off the heap.
        self.spill = Spill()
        self.mappings = MappingStore(store, settings.source_cluster, settings.target_cluster,
                                     spill=self.spill)
        #: Partitions whose mapping has skipped ids waiting: their gaps' lookups wait too.
        self.waits = WaitsStore(store, settings.source_cluster, settings.target_cluster)
        #: The step's target reads, whose requests the metrics count (None: not counted).
        self.target_reads: AdminTargets | None = None
        self._target_reads_seen: dict[str, int] = {}
        #: The step's tail checks (:mod:`cursorsync.pulsar.dispatchable`), whose requests
        #: are counted by kind; without it, the checks the step had answered are.
        self.source_tail: TailRequests | None = None
        self._tail_requests_seen: dict[str, int] = {}
        #: The marker lookups' client, counting its requests (None: a raw entry read per
        #: entry the step looked up).
        self.source_lookups: TailRequests | None = None
        self._lookups_seen: dict[str, int] = {}
        self.last_batch = -1
        self._seeded = False
        #: Parses a batch's rows, taking again what the last batch parsed.
        self._observations = Observations()
        #: The idle cursors between batches, in columns.
        self.idle = IdleStore(self.spill)
        #: Cursors in the last batch's rows, and those of them repeated in bulk.
        self.cursors = self.repeated = 0
        #: The batch the step last ran for (written or not).
        self._ran = -1
        #: Per subscription, the partitions (``topic#partition``) whose last row was not
        #: ready for a failover: only those are kept, so idle partitions cost nothing here.
        self._not_ready: dict[str, set[str]] = {}
        self.crash_after_emit: Callable[[int], None] | None = None  # tests inject a crash here
        #: Runs after each batch's writes (the job's table maintenance).
        self.after_batch: Callable[[], object] | None = None
        #: Seconds of the last batch by phase (halts, collect, parse, refresh, step, rows,
        #: write, metrics, collector; collect to rows on the driver path only, with the
        #: step's parts: step:targets, step:translate, step:emit), and of them the seconds
        #: the batch's thread spent on a core.
        self.timings: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        #: Rows the last batch wrote to cursor_states and sync_progress.
        self.rows_written = 0
        #: Called with each batch's step result on the driver path, outside the timed
        #: phases (a benchmark's figures). The sink keeps no record past its batch: the
        #: collector would walk a row's worth of objects per cursor after every batch.
        self.on_result: Callable[[StepResult], None] | None = None
        #: The last batch left acked source entries unmapped: it waits for the mapping
        #: (:class:`cursorsync.sync.follow.FollowMapping`). Set on the driver path only.
        self.waits_on_mapping = False

    def __call__(self, df: Any, batch_id: int) -> None:
        # Named for the query: Spark calls the sink on a thread of its own, whose name a
        # thread dump or a benchmark's CPU per thread then shows.
        threading.current_thread().name = SYNC_APP
        clock = Phases()
        self.timings, self.cpu = clock.seconds, clock.cpu
        with gc_pause.paused():  # the batch's garbage is freed after it
            self._run(df, batch_id, clock)
            clock.skip()
        clock.step("collector")
        if self.metrics:
            self.metrics.observe_batch_phases("sync", clock.seconds, cpu=clock.cpu)

    def _run(self, df: Any, batch_id: int, clock: Phases) -> None:
        t0 = time.perf_counter()
        src, tgt = self.settings.source_cluster, self.settings.target_cluster
        causes = read_halt_causes(self.store, source_cluster=src, target_cluster=tgt)
        known = set(causes)
        clock.step("halts")
        if self.settings.executors is not None:
            done = self._on_executors(df, batch_id, self.settings.executors)
            clock.skip()  # the tasks' time: the batch's, in no phase of the driver's
        else:
            done = self._on_driver(df, batch_id, known, clock)
        obs, rows = done.observed, done.rows
        if self.crash_after_emit is not None:
            self.crash_after_emit(batch_id)
        clock.skip()
        fresh = new_halts(rows, known, lambda keys: self._halt_causes(keys, obs, batch_id))
        if fresh:
            record_halts(self.store, fresh, source_cluster=src, target_cluster=tgt,
                         app_id=SYNC_APP, batch_id=batch_id)
            causes.update({(h.key, h.subscription): cause_of(h.reason) for h in fresh})
        skip = done.unchanged
        written = [o for o in obs if (o.key, o.subscription) not in skip] if skip else obs
        self.store.append("cursor_states", cursor_state_rows(
            written, source_cluster=src, target_cluster=tgt), app_id=SYNC_APP,
            batch_id=batch_id)
        self.store.append("sync_progress", rows, app_id=SYNC_APP, batch_id=batch_id)
        self.rows_written = len(written) + rows.num_rows
        self.last_batch = batch_id
        clock.step("write")
        if self.metrics:
            self._record(done, time.perf_counter() - t0)
            self.metrics.set_halted(halted_counts(causes))
            clock.step("metrics")
        if self.after_batch is not None:
            self.after_batch()
        acks = int(pc.sum(rows.column("acks_sent")).as_py() or 0)
        sent = ("DRY RUN, nothing acked on the target" if self.step.config.dry_run
                else f"{acks} acks sent")
        log.info("sync batch %d: %d cursors, %s, %d halted, %d refused, %d failed",
                 batch_id, self.cursors, sent, done.count("halted"), done.count("refused"),
                 done.count("failed"))
        log.debug("sync batch %d seconds by phase: %s; %d rows parsed, %d as the last batch's",
                  batch_id, ", ".join(f"{k} {v:.3f}" for k, v in self.timings.items()),
                  len(obs) - self._observations.taken_again, self._observations.taken_again)
        log.debug("sync batch %d: %d idle cursors repeated in bulk, %d kept in columns",
                  batch_id, self.repeated, len(self.idle))

    def _halt_causes(self, keys: set[HaltKey], obs: list[ObservedCursor], batch_id: int
                     ) -> dict[HaltKey, HaltCause]:
        """The causes of a batch's new halts: each cursor's source now, against its last
        state before the batch in ``cursor_states`` (read for these cursors alone)."""
        now = newest(o for o in obs if (o.key, o.subscription) in keys)
        before = previous_states(self.store, now, batch_id, **self.clusters)
        rewind_halts = self.step.config.rewind_policy == "halt"
        found = {(o.key, o.subscription): o.state for o in now}
        return {k: halt_cause(found.get(k), before[k].state if k in before else None,
                              rewind_halts=rewind_halts) for k in keys}

    def _on_driver(self, df: Any, batch_id: int, known: HaltedKeys, clock: Phases) -> _Synced:
        """Translate, guard and emit here; returns the observations and sync_progress rows."""
        table = df.toArrow()
        clock.step("collect")
        mappings = self.mappings.refresh()
        self.step.lookups.mapping_waits(self.waits.refresh())
        clock.step("refresh")
        self.step.halted_keys = known
        # A repeated record repeats rows written by an earlier batch only if the step's
        # previous run was the previous batch, and that batch's rows were written.
        follows = self._ran == batch_id - 1 == self.last_batch
        self._ran = batch_id
        every = self.settings.unchanged_rows_every_batches
        self.step.note_batches()
        split = self.idle.split(table, mappings, self.step, bulk=follows, batch_id=batch_id,
                                rows_every=every)
        obs = self._observations(split.rest)
        self.cursors, self.repeated = table.num_rows, split.repeated
        clock.step("parse")
        if not self._seeded:
            # After a start, a rewind is measured against the last state the tables hold.
            self.step.previous = {**previous_states(self.store, obs, batch_id, **self.clusters),
                                  **self.step.previous}
            self._seeded = True
        self.idle.restore(split, obs, self.step)
        result = self.step.run(obs, mappings)
        self.waits_on_mapping = any(r.plan.unmapped_acked_entries for r in result.records)
        self._observations.forget(self.idle.keep(self.step, split.rest, obs))
        clock.step("step")
        # Parts of the step (a "step:" phase is inside "step"): where a moving cursor's
        # time goes.
        for part, seconds in (("targets", result.target_read_seconds),
                              ("translate", result.translate_seconds),
                              ("emit", result.emit_seconds)):
            clock.seconds[f"step:{part}"] = seconds
            clock.cpu[f"step:{part}"] = result.cpu_seconds.get(part, 0.0)
        if result.deferred:
            log.info("sync batch %d: %d cursors wait for their first plan in the next "
                     "batches (emission.first_plans_per_batch %d)", batch_id, result.deferred,
                     self.step.config.first_plans_per_batch)
        if self.metrics:
            self.metrics.set_first_plans_waiting(result.deferred)
            self.metrics.set_idle_cursors(len(self.idle))
        write = (rows_due(result.records, batch_id, every) if follows
                 else [True] * len(result.records))
        written, unchanged = _due_or_unchanged(result.records, write, split.lags)
        rows = sync_progress_rows(written, **self.clusters)
        done = _Synced(obs, rows, result.translate_seconds, result.unavailable,
                       result.anchor_conflicts, unchanged, split.lags)
        clock.step("rows")
        if self.on_result is not None:
            self.on_result(result)
        return done

    def _on_executors(self, df: Any, batch_id: int, settings: ExecutorSettings) -> _Synced:
        """Translate, guard and emit in Spark tasks; the driver only writes the tables."""
        from cursorsync.sync.executors import sync_on_executors

        df = df.persist()
        try:
            obs = observations(df.toArrow())
            self.cursors = len(obs)
            topologies = None
            if self.step.topology is not None:
                topologies = {t: self.step.topology(t) for t in {o.key.topic for o in obs}}
            rows = sync_on_executors(df, settings, batch_id, dry_run=self.step.config.dry_run,
                                     cumulative=self.step.config.cumulative,
                                     topologies=topologies)
        finally:
            df.unpersist()
        return _Synced(obs, rows, None)

    def _record(self, done: _Synced, batch_s: float) -> None:
        """Metrics from the sync_progress rows, the same whichever path produced them;
        added up per subscription first (a batch has a row per cursor, 100,000 at scale)."""
        m = self.metrics
        assert m is not None
        kind: Literal["cumulative", "individual"] = (
            "cumulative" if self.step.config.cumulative else "individual")
        if done.translate_seconds is not None:
            m.observe_translation(done.translate_seconds)
        for sub, b in _per_subscription(done, dry_run=self.step.config.dry_run).items():
            not_ready = self._not_ready.setdefault(sub, set())
            not_ready -= b.ready
            not_ready |= b.not_ready
            m.set_failover_ready(sub, not not_ready)
            for result, count in b.outcomes.items():
                m.record_outcome(sub, result, count)
            m.record_acks(sub, kind, b.acks)
            m.set_unmapped_acked_many(sub, b.unmapped)
            # What the sync knows of the forecast: each unmapped acked entry holds at least
            # one message (status --forecast reads how many, and the other causes).
            m.set_redelivery_forecast(sub, "acked_unmapped", b.unmapped)
            if b.rewound:
                m.record_rewound(sub, b.rewound)
            if b.outcomes.get("refused"):
                m.record_error("guard", b.outcomes["refused"])
            if b.outcomes.get("failed"):
                m.record_error("emit", b.outcomes["failed"])
            if b.lags:
                m.observe_sync_lags(sub, b.lags)
                m.mark_synced(sub)
        lookups = self.step.lookups
        if self.source_lookups is None:
            m.record_source_lookups("raw-entry", lookups.count)
        else:
            _record_new(m.record_source_lookups, self.source_lookups.requests_by_kind(),
                        self._lookups_seen)
        if self.source_tail is None:
            m.record_source_lookups("tail-check", lookups.tail_checks)
        else:
            _record_new(m.record_source_lookups, self.source_tail.requests_by_kind(),
                        self._tail_requests_seen)
        if self.target_reads is not None:
            t = self.target_reads
            _record_new(m.record_target_cursor_reads,
                        {"internal-stats": t.requests, "plugin": t.plugin.reads},
                        self._target_reads_seen)
        if done.unavailable:
            m.record_error("admin", done.unavailable)
        if done.anchor_conflicts:
            m.record_error("anchor_conflict", done.anchor_conflicts)
        m.observe_batch("sync", batch_s)


def _record_new(record: Callable[[str, int], None], totals: Mapping[str, int],
                seen: dict[str, int]) -> None:
    """Records what each kind's running total added since ``seen`` (updated to them)."""
    for kind, total in totals.items():
        record(kind, total - seen.get(kind, 0))
        seen[kind] = total


@dataclass
class _SubscriptionBatch:
    """One subscription's share of a batch's rows, for the metrics."""

    outcomes: dict[str, int] = field(default_factory=dict)
    acks: int = 0
    unmapped: dict[str, int] = field(default_factory=dict)
    rewound: int = 0
    lags: list[float] = field(default_factory=list)
    #: Partitions (``topic#partition``) whose row says a failover now would redeliver no
    #: more than cursorsync cannot carry over (exact, nothing unmapped, no dry run), and not.
    ready: set[str] = field(default_factory=set)
    not_ready: set[str] = field(default_factory=set)


def _per_subscription(done: _Synced, *, dry_run: bool) -> dict[str, _SubscriptionBatch]:
    """The batch's rows, and its unchanged cursors' lags, added up per subscription (an
    unchanged cursor's readiness is as its last row said)."""
    cols = {c: done.rows.column(c).to_pylist() for c in (
        "subscription", "outcome", "dry_run", "acks_sent", "topic", "partition",
        "unmapped_acked_entries", "rewound_entries", "lag_ms")}
    subs: dict[str, _SubscriptionBatch] = {}
    for (sub, outcome, dry, acks, topic, partition, unmapped, rewound,
         lag_ms) in zip(*cols.values(), strict=True):
        b = subs.setdefault(sub, _SubscriptionBatch())
        emitted = outcome not in ("halted", "refused", "failed")
        result = ("dry_run" if dry else "emitted") if emitted else outcome
        b.outcomes[result] = b.outcomes.get(result, 0) + 1
        b.acks += acks
        where = f"{topic}#{partition}"
        b.unmapped[where] = unmapped
        exact = outcome == "exact" and not unmapped and not dry
        (b.ready if exact else b.not_ready).add(where)
        b.rewound += rewound
        if emitted and not dry:  # a dry run synced nothing: no lag, no last sync
            b.lags.append(lag_ms / 1000)
    for sub, lags in (done.unchanged_lags or {}).items():
        b = subs.setdefault(sub, _SubscriptionBatch())
        result = "dry_run" if dry_run else "emitted"
        b.outcomes[result] = b.outcomes.get(result, 0) + len(lags)
        if not dry_run:
            b.lags.extend(lags)
    return subs


def _due_or_unchanged(records: list[SyncRecord], write: list[bool],
                      lags: dict[str, list[float]],
                      ) -> tuple[list[SyncRecord], frozenset[tuple[PartitionKey, str]]]:
    """The records whose rows are written this batch, and the cursors whose rows are not
    (their lags go to ``lags``, per subscription, for the metrics)."""
    written: list[SyncRecord] = []
    unchanged: set[tuple[PartitionKey, str]] = set()
    for r, w in zip(records, write, strict=True):
        if w:
            written.append(r)
        else:
            unchanged.add((r.key, r.subscription))
            lags.setdefault(r.subscription, []).append(r.lag_ms / 1000)
    return written, frozenset(unchanged)


def rows_due(records: list[SyncRecord], batch_id: int, every: int) -> list[bool]:
    """Per record, whether a batch that follows the previous one writes its rows: a
    repeated record's only every ``every`` batches."""
    return [not r.repeated or history_due(r.key, r.subscription, batch_id, every)
            for r in records]


def history_due(key: PartitionKey, subscription: str, batch_id: int, every: int) -> bool:
    """Whether an unchanged cursor's rows are written in this batch: once every ``every``
    batches, which one chosen by its key (so that the rows spread over them)."""
    return (stable_hash((key, subscription)) + batch_id) % every == 0
