"""``cursorsync-dev bench plan``: sync batches for many topic partitions on the driver, no
brokers.

The mappings of ``partitions`` topic partitions (topics of 100 partitions, two segments
each: a ledger rollover on the source) are written to a Delta table with delta-rs, then
loaded as the sync query loads them. Cursor states for one subscription per partition:
most idle (everything acked on both sides), an ``active`` fraction with acks to send, of
which a ``holes`` fraction has acknowledgement holes. Sync batches run through the real
:class:`~cursorsync.sync.step.SyncStep` (translate, guard; dry run, so nothing is sent):
those after a start, which plan the cursors a first time (at most the job's
``emission.first_plans_per_batch`` a batch, the others in the next ones; the idle ones
are packed as their plans turn out to need nothing sent), then two of a running job, the
last the steady state the figures report. Each batch first parses its cursors from
``pulsar-cursors`` rows as the sync sink does (``parse_seconds``; building the rows, which
Spark does in the job, is not timed); its ``cursor_states`` and ``sync_progress`` rows
are built and appended to the local Delta table, timed apart (``rows_seconds``), and each
batch after the first reads the mappings' new rows first, as the job does
(``refresh_seconds``, none here); a batch's time is all four. The
target's admin API is a function that answers from memory and counts the requests, as
the job's would be made: one per moving (partition, subscription) and batch, one per
idle one every few batches. The steady batch is then run twice more beside a thread that
runs Python without pause, as the mapping builder's batches do in the job's driver (the
sinks share its interpreter): ``..._beside_busy_thread`` beside the same figures alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import math
import resource
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from cursorsync import gc_pause
from cursorsync.app.metrics import Metrics
from cursorsync.app.queries import sync_sink_settings
from cursorsync.app.settings import Config, TablesConfig, parse_config
from cursorsync.app.settings.sync import EmissionConfig
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.sync.idle_store import IdleStore
from cursorsync.sync.observed import Observations, observations, poll_rows
from cursorsync.sync.sink import SyncSink
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.sync.step_totals import StepResult
from cursorsync.tables import open_store
from cursorsync.tables.mappings_table import MappingStore
from cursorsync.tables.rows import mapping_rows
from cursorsync.tables.spill import Spill

PARTITIONS_PER_TOPIC = 100
ENTRIES = 1_000  # per source ledger; two source ledgers per partition
SUBSCRIPTION = "bench"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class _Layout:
    keys: list[PartitionKey]
    source_first: np.ndarray  # each partition's first source ledger id
    target_ledger: np.ndarray  # each partition's one target ledger id


def _layout(partitions: int) -> _Layout:
    keys = [PartitionKey(f"persistent://bench/ns/t{i // PARTITIONS_PER_TOPIC}",
                         i % PARTITIONS_PER_TOPIC) for i in range(partitions)]
    idx = np.arange(partitions, dtype=np.int64)
    return _Layout(keys, 10_000 + 3 * idx, 10_000 + 3 * idx + 2)


def _template(layout: _Layout) -> TopicMapping:
    s0, t0 = int(layout.source_first[0]), int(layout.target_ledger[0])
    return TopicMapping(SegmentSet.of([Segment(s0, 0, t0, 0, ENTRIES),
                                       Segment(s0 + 1, 0, t0, ENTRIES, ENTRIES)]))


def write_mappings(store: Any, layout: _Layout, *, appends: int = 10) -> int:
    """Every partition's rows, from one partition's rows with its ids shifted; returns how
    many rows were written."""
    t = mapping_rows(layout.keys[0], _template(layout), source_cluster="a",
                     target_cluster="b", written_at=NOW)
    per, n = t.num_rows, len(layout.keys)
    rows = t.take(pa.array(np.tile(np.arange(per), n)))
    shift_s = np.repeat(layout.source_first - layout.source_first[0], per)
    shift_t = np.repeat(layout.target_ledger - layout.target_ledger[0], per)
    columns = {
        "topic": pa.array(np.repeat([k.topic for k in layout.keys], per), pa.string()),
        "partition": pa.array(np.repeat([k.partition for k in layout.keys], per), pa.int32()),
        "source_ledger": pa.array(rows["source_ledger"].to_numpy(zero_copy_only=False)
                                  + shift_s, pa.int64()),
        "target_ledger": pa.array(rows["target_ledger"].to_numpy(zero_copy_only=False)
                                  + shift_t, pa.int64()),
    }
    for name, values in columns.items():
        rows = rows.set_column(rows.schema.get_field_index(name), name, values)
    step = -(-rows.num_rows // appends)
    for b in range(appends):
        store.append("mappings", rows.slice(b * step, step), app_id="bench-mapping", batch_id=b)
    return int(rows.num_rows)


def _observations(layout: _Layout, *, active: float, holes: float, seed: int, moved: int,
                  ) -> tuple[list[ObservedCursor], dict[PartitionKey, CursorState], int, int]:
    """Source cursors, the target cursors the admin API reports for them, and how many
    partitions are active and have holes."""
    rng = np.random.default_rng(seed)
    n = len(layout.keys)
    is_active = rng.random(n) < active
    has_holes = is_active & (rng.random(n) < holes)
    obs, targets = [], {}
    at = datetime.fromtimestamp(NOW.timestamp() + moved, UTC)
    for i, key in enumerate(layout.keys):
        s0, t = int(layout.source_first[i]), int(layout.target_ledger[i])
        ledgers = Ledgers.of([(s0, ENTRIES), (s0 + 1, ENTRIES)])
        target_ledgers = Ledgers.of([(t, 2 * ENTRIES)])
        if not is_active[i]:
            state = CursorState(Position(s0 + 1, ENTRIES - 1), RangeSet(), ledgers)
            target = CursorState(Position(t, 2 * ENTRIES - 1), RangeSet(), target_ledgers)
        else:
            md = 100 + moved
            idm = RangeSet()
            if has_holes[i]:
                lo = np.arange(200, 400, 10, dtype=np.int64)  # past md, where they stay
                idm = RangeSet(np.stack([np.full(20, s0), lo, np.full(20, s0), lo + 8], axis=1))
            state = CursorState(Position(s0, md), idm, ledgers)
            target = CursorState(Position(t, 99), RangeSet(), target_ledgers)
        # An idle cursor was read at the start and its topic stats confirm it since.
        obs.append(ObservedCursor(key, SUBSCRIPTION, state, at, None) if is_active[i]
                   else ObservedCursor(key, SUBSCRIPTION, state, NOW, at))
        targets[key] = target
    return obs, targets, int(is_active.sum()), int(has_holes.sum())


def bench_plan(partitions: int, *, active: float = 0.05, holes: float = 0.2,
               seed: int = 1, first_plans_per_batch: int | None = None) -> dict[str, Any]:
    """Time the mapping load and the sync batches for ``partitions`` topic partitions: those
    after a start, until every cursor has had a first plan (``first_plans_per_batch`` a
    batch; by default the job's), and two more."""
    layout = _layout(partitions)
    with tempfile.TemporaryDirectory(prefix="cursorsync-bench-plan-") as root:
        store = open_store("delta-rs", root)
        t0 = time.perf_counter()
        written = write_mappings(store, layout)
        write_s = time.perf_counter() - t0

        rss0 = _rss_mib()
        t0 = time.perf_counter()
        loaded = MappingStore(store, "a", "b", spill=Spill())  # as the job's sink keeps it
        loaded.refresh()
        load_s = time.perf_counter() - t0
        rss_loaded = _rss_mib()

        requests = [0]
        targets: dict[PartitionKey, CursorState] = {}

        def read_target(topic: str, subscription: str) -> CursorState:
            requests[0] += 1
            return targets[_key(topic)]

        cap = first_plans_per_batch or EmissionConfig.model_fields[
            "first_plans_per_batch"].default
        step = SyncStep(StepSettings(dry_run=True, first_plans_per_batch=cap), None,
                        read_target)
        # As the job seeds it at a start: each cursor's newest state in the tables, from
        # before the start (the active ones have moved since). Which partitions are active
        # and have holes is the seed's, the same in every batch.
        seeded, _, n_active, n_holes = _observations(
            layout, active=active, holes=holes, seed=seed, moved=-5)
        step.previous = {(o.key, o.subscription): o for o in seeded}
        # The job's sink, with its metrics: it parses the rows, runs the step, builds and
        # writes the tables' rows and records the metrics, each phase timed.
        sink = SyncSink(sync_sink_settings(_config(root)), store, step, Metrics())
        sink.mappings = loaded
        figures: dict[str, Any] = {}

        def summarise(result: StepResult) -> None:
            """The step's figures, gathered in the batch and not counted in its time."""
            t0 = time.perf_counter()
            outcomes: dict[str, int] = {}
            for r in result.records:
                outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
            figures.update(
                translate_seconds=round(result.translate_seconds, 3),
                cursors_stepped=len(result.records),
                acks_planned_entries=sum(r.plan.to_ack.count_entries() for r in
                                         result.records),
                outcomes=outcomes, cursors_waiting=result.deferred,
                cursors_with_acks_planned=sum(1 for r in result.records if r.plan.to_ack))
            figures["seconds"] = time.perf_counter() - t0

        sink.on_result = summarise
        batches: list[dict[str, Any]] = []

        def run_batch(batch_id: int, sink: SyncSink, loaded: MappingStore) -> dict[str, Any]:
            moved = 5 * batch_id
            obs, targets_now, _, _ = _observations(
                layout, active=active, holes=holes, seed=seed, moved=moved)
            targets.clear()
            targets.update(targets_now)
            polled = poll_rows(obs, "a")  # what the sink gets from Spark
            requests[0] = 0
            t0 = time.perf_counter()
            sink(_Frame(polled), batch_id)
            batch_s = time.perf_counter() - t0 - figures.pop("seconds")
            fresh_s = None
            if not (batch_id == 0 or batches[-1]["cursors_waiting"]):
                # The baseline: the same rows parsed with nothing taken from the last batch.
                with gc_pause.paused():
                    t0 = time.perf_counter()
                    observations(polled)
                    fresh_s = round(time.perf_counter() - t0, 3)
            return {
                "batch_seconds": round(batch_s, 3),
                **{f"{phase}_seconds": round(v, 3) for phase, v in sink.timings.items()},
                "parse_seconds_without_the_last_batch": fresh_s,
                "target_requests": requests[0],
                "rows_written": sink.rows_written,
                "mappings_built": loaded.mappings.built,
                # Cursors with a record, and idle ones repeated without the step.
                "cursors": figures["cursors_stepped"] + sink.repeated,
                "cursors_repeated_in_bulk": sink.repeated,
                "idle_cursors_in_columns": len(sink.idle),
                **figures,
            }

        start_batches, steady = 0, 0
        for batch_id in itertools.count():
            if steady == 2:
                break
            batches.append(run_batch(batch_id, sink, loaded))
            if batch_id == 0 or batches[-2]["cursors_waiting"]:
                start_batches += 1  # until the batch that made the last first plans
            else:
                steady += 1
        # The steady batch again beside a thread that runs Python without pause, as the
        # mapping builder's batches do in the job's driver: what sharing the interpreter
        # costs the sync, beside the same batch alone.
        with _busy_thread():
            busy = [run_batch(len(batches) + i, sink, loaded) for i in range(2)]
        rss1, anon1 = _rss_mib(), _rss_anon_mib()
        # What the allocators hold free after the batches' peaks, handed back.
        pa.default_memory_pool().release_unused()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        anon_released = _rss_anon_mib()
        del sink, step, loaded
        gc.collect()
    steady_s = _batch_s(batches[-1])
    return {
        "benchmark": "plan",
        "partitions": partitions,
        "active_partitions": n_active,
        "partitions_with_holes": n_holes,
        "mapping_rows_written": written,
        "mapping_write_seconds": round(write_s, 2),
        "mapping_load_seconds": round(load_s, 3),
        "driver_rss_mib_growth_loading": round(rss_loaded - rss0),
        "delta_rows_read": written,
        "batches": batches,
        "first_plans_per_batch": cap,
        "start_batches": start_batches,
        "start_seconds": round(sum(_batch_s(b) for b in batches[:start_batches]), 2),
        "start_batch_max_seconds": round(max(_batch_s(b) for b in batches[:start_batches]), 2),
        "seconds_per_batch": round(steady_s, 3),
        "seconds_per_batch_beside_busy_thread": round(_batch_s(busy[-1]), 3),
        "translate_seconds": batches[-1]["translate_seconds"],
        "translate_seconds_beside_busy_thread": busy[-1]["translate_seconds"],
        "steady_batch_beside_busy_thread": busy[-1],
        "microseconds_per_partition": round(steady_s / partitions * 1e6, 1),
        "driver_rss_mib_after": round(rss1),
        "driver_rss_mib_growth": round(rss1 - rss0),
        "driver_rss_anon_mib_after": round(anon1),
        "driver_rss_anon_mib_after_free_memory_released": round(anon_released),
        **kept_bytes(min(partitions, KEPT_SAMPLE), holes=holes, seed=seed),
    }


#: Partitions of the runs that measure what the job keeps per partition (under tracemalloc,
#: which makes them slow; the figure does not depend on their number).
KEPT_SAMPLE = 2_000
#: How often the job writes an unchanged cursor's rows again, by default.
ROWS_EVERY = TablesConfig.model_fields["unchanged_rows_every_batches"].default


def kept_bytes(partitions: int, *, holes: float, seed: int) -> dict[str, int]:
    """Bytes the job keeps between batches per partition, after three batches with all
    partitions idle, or all moving: the mappings, the sync step's state and what the sink's
    parser keeps of the last batch (its parsed states and its Arrow columns). On the heap:
    live Python and numpy allocations as tracemalloc counts them, plus Arrow's own; mapped:
    the settled mappings and idle rows in files, as the job keeps them (``_on_heap``: the
    same kept on the heap instead, for comparison)."""
    layout = _layout(partitions)
    out: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="cursorsync-bench-kept-") as root:
        store = open_store("delta-rs", root)
        write_mappings(store, layout)
        for name, active, spill in (("idle", 0.0, Spill()), ("moving", 1.0, Spill()),
                                    ("idle", 0.0, None)):
            polls = []
            for moved in (0, 5, 10):
                obs, now, *_ = _observations(layout, active=active, holes=holes, seed=seed,
                                             moved=moved)
                polls.append((poll_rows(obs, "a"), now))
            del obs, now
            gc.collect()
            arrow = pa.total_allocated_bytes() - sum(t.nbytes for t, _ in polls)
            tracemalloc.start()
            try:
                held = MappingStore(store, "a", "b", spill=spill)
                targets: dict[PartitionKey, CursorState] = {}
                step = SyncStep(StepSettings(dry_run=True), None, _reader(targets))
                # The sink's parser and its store of idle cursors, with no tables.
                parse, idle = Observations(), IdleStore(spill)
                for batch_id in range(len(polls)):
                    rows, now = polls.pop(0)
                    targets.clear()
                    targets.update(now)
                    mappings = held.refresh()
                    split = idle.split(rows, mappings, step, bulk=batch_id > 0,
                                       batch_id=batch_id, rows_every=ROWS_EVERY)
                    obs = parse(split.rest)
                    idle.restore(split, obs, step)
                    step.run(obs, mappings)
                    parse.forget(idle.keep(step, split.rest, obs))
                del rows, now, split, obs, mappings
                targets.clear()
                gc.collect()
                kept = tracemalloc.get_traced_memory()[0]
            finally:
                tracemalloc.stop()
            kept += pa.total_allocated_bytes() - arrow
            if spill is None:
                out[f"kept_bytes_per_{name}_partition_on_heap"] = round(kept / partitions)
                continue
            out[f"kept_bytes_per_{name}_partition"] = round(kept / partitions)
            mapped = idle.nbytes + held.mappings.settled_bytes
            out[f"mapped_bytes_per_{name}_partition"] = round(mapped / partitions)
    return out


@contextlib.contextmanager
def _busy_thread() -> Iterator[None]:
    """A thread running Python, never letting go of the interpreter but at the switch
    interval, while the block runs."""
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            for _ in range(1_000):
                n += 1

    thread = threading.Thread(target=spin, name="bench-busy", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _batch_s(batch: dict[str, Any]) -> float:
    """A batch's time: the sink's call, from the rows Spark hands it to the metrics."""
    return float(batch["batch_seconds"])


class _Frame:
    """What the sink reads of a Spark DataFrame: toArrow()."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:
        return self.table


def _config(root: str) -> Config:
    """Clusters a -> b, the tables under ``root``; the rest the job's defaults."""
    return parse_config({
        "clusters": {"source": {"name": "a", "service_url": "pulsar://a:6650",
                                "admin_url": "http://a:8080"},
                     "target": {"name": "b", "service_url": "pulsar://b:6650",
                                "admin_url": "http://b:8080"}},
        "topics": [{"topic": "persistent://bench/ns/t0", "subscriptions": [SUBSCRIPTION]}],
        "tables": {"path": root}, "spark": {"checkpoint_dir": f"{root}/checkpoints"}})


def _reader(targets: dict[PartitionKey, CursorState]) -> Callable[[str, str], CursorState]:
    """The target's cursors, answered from ``targets`` as it is when asked."""
    return lambda topic, subscription: targets[_key(topic)]


def _key(topic: str) -> PartitionKey:
    base, _, part = topic.rpartition("-partition-")
    return PartitionKey(base, int(part))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _rss_anon_mib() -> float:
    """Resident memory that is not a file's pages (the heaps, not the mapped files)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return math.nan
