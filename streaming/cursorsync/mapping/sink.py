"""The mapping query's sink: entries in, mapping rows out, replay-safe per batch id."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from cursorsync import gc_pause, wake
from cursorsync.core.records import BuiltinUpdate, PartitionKey
from cursorsync.core.retention import LiveLedgers
from cursorsync.core.segments import TopicMapping
from cursorsync.mapping.builder import (
    AnchorRead,
    BuilderSettings,
    MappingBuilder,
)
from cursorsync.mapping.builder_state import read_state, write_state
from cursorsync.mapping.entries_options import EVIDENCE_COLUMNS
from cursorsync.mapping.entries_rows import unpack_batches
from cursorsync.mapping.outcome import BatchOutcome
from cursorsync.mapping.skipped_ids import HoleCheck
from cursorsync.phases import Phases
from cursorsync.pulsar.replication import TopologyWatch
from cursorsync.tables.mappings_table import load_mappings
from cursorsync.tables.rows import (
    builtin_update_rows,
    latest_waits,
    mapping_wait_rows,
    mappings_rows,
)
from cursorsync.tables.spill import Spill
from cursorsync.tables.store import RowFilter, TableStore

log = logging.getLogger(__name__)

#: The mapping query's writer id in the tables' transaction log.
MAPPING_APP = "cursorsync-mapping"
#: Builder states kept under the checkpoint, one per batch (a replay needs the previous).
STATE_FILES_KEPT = 5
_STATE_NAME = re.compile(r"builder-(\d+)\.(?:arrow|json)(?:\.part)?")
#: The delta of a partition the batch only has a live row for.
_NOTHING = TopicMapping()



class MappingMetrics(Protocol):
    """What the mapping sink records (:class:`cursorsync.app.metrics.Metrics` does)."""

    def record_entries_ingested(self, cluster: str, count: int) -> None: ...
    def record_segments_written(self, count: int) -> None: ...
    def record_skipped_ids(self, claimed: int, unclaimed: int, mapped: int = 0) -> None: ...
    def record_skipped_id_requests(self, kind: str, count: int) -> None: ...
    def set_skipped_waiting(self, by_partition: Mapping[PartitionKey, int]) -> None: ...
    def observe_batch(self, query: str, seconds: float) -> None: ...
    def observe_batch_phases(self, query: str, seconds: Mapping[str, float], *,
                             cpu: Mapping[str, float] | None = None) -> None: ...


@runtime_checkable
class CountsRequests(Protocol):
    """A hole check that counts the admin requests it made, by kind, since its start."""

    def requests_by_kind(self) -> dict[str, int]: ...


class MappingSink:
    """foreachBatch of the mapping query: builder + idempotent append + per-batch state."""

    #: A test hook (class-wide, so that it is in place before a job's first batch): rewrites
    #: a batch's mapping before it is written, as faulty evidence would; the anchors'
    #: cross-check is tested with it. Never set by the job.
    tamper: Callable[[int, dict[PartitionKey, TopicMapping]],
                     dict[PartitionKey, TopicMapping]] | None = None

    def __init__(self, builder: BuilderSettings, store: TableStore, state_dir: Path,
                 metrics: MappingMetrics | None, hole_check: HoleCheck | None = None,
                 anchor_read: AnchorRead | None = None,
                 builtin_updates: Callable[[], list[BuiltinUpdate]] | None = None,
                 wake_file: str | None = None, topology: TopologyWatch | None = None,
                 live: LiveLedgers | None = None, source_chunks: HoleCheck | None = None
                 ) -> None:
        """``builder``: what the builder is made with (the clusters, the evidence);
        ``hole_check``: what verifies skipped target ids (``evidence.holes: verified``);
        ``anchor_read``: what reads the source's snapshot markers (``snapshot`` evidence);
        ``builtin_updates``: the UPDATE markers the hole check read in the batch, written to
        ``builtin_updates``; ``wake_file``: where to ask the target's entries source for
        another batch while skipped ids wait for their check; ``topology``: refuses a batch
        with entries of a topic whose replication the configured evidence does not hold on
        (TopologyError), before anything of it is mapped; ``live``: the sync step's first
        live ledgers, which trim the builder's known mappings; ``source_chunks``: maps the
        chunks of the source's copies of target chunked messages (on the source's admin
        API)."""
        self.topology = topology
        self.builtin_updates = builtin_updates
        self.wake_file = wake_file
        self.clusters = {"source_cluster": builder.source_cluster,
                         "target_cluster": builder.target_cluster}
        self.store = store
        self.state_dir = state_dir
        self.metrics = metrics
        state_dir.mkdir(parents=True, exist_ok=True)
        self.builder = MappingBuilder(builder, hole_check=hole_check, anchor_read=anchor_read,
                                      spill=Spill(), live=live, source_chunks=source_chunks)
        self._batch: int | None = None
        self._requests_seen: dict[str, int] = {}
        self.last_batch: int = -1
        #: Skipped target ids the last batch left for later batches to check.
        self.skipped_waiting = 0
        #: Each partition's count as the ``mapping_waits`` table holds it (None: not read).
        self._waits_written: dict[PartitionKey, int] | None = None
        #: Runs after each batch's writes (the job's table maintenance).
        self.after_batch: Callable[[], object] | None = None
        #: Tests inject a crash here: after the builder's work (skipped ids checked, probes
        #: acked), before the batch's rows are written.
        self.crash_after_process: Callable[[int, BatchOutcome], None] | None = None

    def _state_file(self, batch_id: int, suffix: str = ".arrow") -> Path:
        return self.state_dir / f"builder-{batch_id}{suffix}"

    def _prepare(self, batch_id: int) -> None:
        """Start from the state the batch started from the first time (replay-safe)."""
        if self._batch == batch_id - 1:
            return
        prev = self._state_file(batch_id - 1)
        builder = MappingBuilder(self.builder.config, hole_check=self.builder.hole_check,
                                 anchor_read=self.builder.anchor_read, spill=self.builder.spill,
                                 live=self.builder.live,
                                 source_chunks=self.builder.source_chunks)
        before = self._state_file(batch_id - 1, ".json")  # as version 1 wrote it
        if prev.exists():
            builder.load_state(read_state(prev))
        elif before.exists():
            builder.load_state(json.loads(before.read_text()))
        elif batch_id > 0:
            log.warning("no builder state for batch %d: identity matching restarts with an "
                        "empty window (safe: only unmatched entries stay unacked)", batch_id - 1)
        known, _ = load_mappings(self.store, source_cluster=self.clusters["source_cluster"],
                                 target_cluster=self.clusters["target_cluster"],
                                 max_batch_id=batch_id - 1)
        builder.seed_known(known)
        self.builder = builder

    def __call__(self, df: Any, batch_id: int) -> None:
        # Named for the query: Spark calls the sink on a thread of its own, whose name a
        # thread dump or a benchmark's CPU per thread then shows.
        threading.current_thread().name = MAPPING_APP
        with gc_pause.paused():  # the batch's garbage is freed after it
            self._run(df, batch_id)

    def _run(self, df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        clock = Phases()
        self._prepare(batch_id)
        clock.step("prepare")
        table = unpack_batches(df.toArrow(), EVIDENCE_COLUMNS)
        clock.step("read")  # the batch's Spark tasks: every range's reader
        if self.topology is not None and table.num_rows:
            self.topology.check(pc.unique(table.column("topic")).to_pylist())
        outcome = self.builder.process(table)
        clock.step("build")  # pairs, evidence, the skipped ids' check
        # Parts of the build (a "build:" phase is inside "build").
        clock.seconds.update({f"build:{k}": v for k, v in outcome.seconds.items()})
        clock.cpu.update({f"build:{k}": v for k, v in outcome.cpu_seconds.items()})
        if self.crash_after_process is not None:
            self.crash_after_process(batch_id, outcome)
        self._write(outcome, batch_id)
        clock.step("write")
        self._keep_state(batch_id)
        clock.step("state")
        self.skipped_waiting = sum(outcome.skipped_waiting.values())
        if self.skipped_waiting and self.wake_file is not None:
            # Checked next batch, even with no new entries.
            wake.request(self.wake_file, batch_id + 1)
        if self.after_batch is not None:
            self.after_batch()
        if self.metrics:
            self._record(table, outcome, time.perf_counter() - t0)
            self.metrics.observe_batch_phases("mapping", clock.seconds, cpu=clock.cpu)
        log.info("mapping batch %d: %d entries, %d pairs, %d conflicts, %d given up, "
                 "%d of %d skipped target ids claimed as markers and %d mapped as chunks "
                 "(%d wait), %d snapshot anchors, %d unpaired copies",
                 batch_id, outcome.entries_in, outcome.pairs, outcome.conflicts,
                 outcome.given_up_target, outcome.skipped_claimed, outcome.skipped_ids,
                 outcome.skipped_mapped,
                 self.skipped_waiting, outcome.anchors, outcome.unpaired)
        log.debug("mapping batch %d seconds by phase: %s", batch_id, clock)

    def _write(self, outcome: BatchOutcome, batch_id: int) -> None:
        """The batch's mapping rows (a live row for each partition the sync found rows
        about deleted ledgers for) and the built-in's updates, once per batch id."""
        now = datetime.now(UTC)
        written = (outcome.mappings if self.tamper is None
                   else self.tamper(batch_id, dict(outcome.mappings)))
        # No rows still records the batch id as written.
        rows = mappings_rows([(k, written.get(k, _NOTHING), outcome.live.get(k))
                              for k in sorted(written.keys() | outcome.live.keys())],
                             **self.clusters, written_at=now)
        self.store.append("mappings", rows, app_id=MAPPING_APP, batch_id=batch_id)
        updates = self.builtin_updates() if self.builtin_updates is not None else []
        if updates:
            self.store.append("builtin_updates", builtin_update_rows(
                updates, **self.clusters, written_at=now), app_id=MAPPING_APP,
                batch_id=batch_id)
        self._write_waits(outcome.skipped_waiting, batch_id, now)

    def _write_waits(self, waiting: Mapping[PartitionKey, int], batch_id: int,
                     now: datetime) -> None:
        """A ``mapping_waits`` row for each partition whose count of skipped ids waiting
        changed since the table last said (0 once none waits): ``status`` reads them."""
        if self._waits_written is None:
            pair = RowFilter.of(source_cluster=self.clusters["source_cluster"],
                                target_cluster=self.clusters["target_cluster"])
            self._waits_written = latest_waits(self.store.read("mapping_waits", pair))
        before = self._waits_written
        changed = {k: n for k, n in waiting.items() if before.get(k, 0) != n}
        changed.update({k: 0 for k, n in before.items() if n and k not in waiting})
        if changed and self.store.append("mapping_waits", mapping_wait_rows(
                changed, **self.clusters, written_at=now), app_id=MAPPING_APP,
                batch_id=batch_id):
            before.update(changed)

    def _keep_state(self, batch_id: int) -> None:
        """The builder's state after the batch; only the last few batches' are kept."""
        write_state(self._state_file(batch_id), self.builder.state())
        for old in self.state_dir.glob("builder-*"):
            number = _STATE_NAME.fullmatch(old.name)
            if number and int(number[1]) < batch_id - STATE_FILES_KEPT:
                old.unlink(missing_ok=True)
        for torn in self.state_dir.glob(".builder-*.tmp"):  # a write a crash cut short
            torn.unlink(missing_ok=True)
        self._batch = batch_id
        self.last_batch = batch_id

    def _record(self, table: pa.Table, outcome: BatchOutcome, seconds: float) -> None:
        m = self.metrics
        assert m is not None
        for cluster in self.clusters.values():
            n = int(table.filter(pc.equal(table.column("cluster"), cluster)).num_rows
                    ) if table.num_rows else 0
            m.record_entries_ingested(cluster, n)
        m.record_segments_written(sum(len(x.segments) for x in outcome.mappings.values()))
        m.record_skipped_ids(outcome.skipped_claimed, outcome.skipped_ids
                             - outcome.skipped_claimed - outcome.skipped_mapped,
                             outcome.skipped_mapped)
        m.set_skipped_waiting(outcome.skipped_waiting)
        check = self.builder.hole_check
        if isinstance(check, CountsRequests):
            for kind, total in check.requests_by_kind().items():
                m.record_skipped_id_requests(kind, total - self._requests_seen.get(kind, 0))
                self._requests_seen[kind] = total
        m.observe_batch("mapping", seconds)
