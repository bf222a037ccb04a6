"""The mapping-ingestion measurement of ``cursorsync-dev bench e2e``: what each mapping batch
ingested, took and cost (:class:`MappingRecorder`, given to the job as its metrics), how
long the job took to ingest a backlog, and whether the ``mappings`` table maps it right.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cursorsync.app.metrics import Metrics
from cursorsync.core.positions import Position
from cursorsync.errors import CursorSyncError
from cursorsync_devtools.testbed.cpu import CpuSampler
from cursorsync_devtools.testbed.workload import Produced


class IngestionError(CursorSyncError):
    """The mapping query did not ingest what was asked in time."""


@dataclass(frozen=True)
class MappingBatch:
    """One mapping batch as its sink saw it."""

    ended_at: float  # time.monotonic()
    sink_s: float
    rows: dict[str, int]  # per cluster
    cpu: dict[str, float]  # cumulative CPU-seconds per group at its end


class MappingRecorder(Metrics):
    """The job's metrics, also noting each mapping batch's rows, time and CPU."""

    def __init__(self, cpu: CpuSampler) -> None:
        super().__init__()
        self.cpu = cpu
        self.batches: list[MappingBatch] = []
        self._rows: dict[str, int] = {}
        self._lock = threading.Lock()

    def record_entries_ingested(self, cluster: str, count: int) -> None:
        super().record_entries_ingested(cluster, count)
        with self._lock:
            self._rows[cluster] = self._rows.get(cluster, 0) + count

    def observe_batch(self, query: str, seconds: float) -> None:
        super().observe_batch(query, seconds)
        if query != "mapping":
            return
        sample = self.cpu.sample()
        with self._lock:  # the sink records a batch's rows just before this
            self.batches.append(MappingBatch(time.monotonic(), seconds, self._rows, sample))
            self._rows = {}

    def done(self) -> list[MappingBatch]:
        with self._lock:
            return list(self.batches)


def wait_ingested(job: Any, recorder: MappingRecorder, want: Mapping[str, int],
                   timeout_s: float) -> int:
    """Until the mapping query ingested ``want`` rows per cluster; the index of the batch
    that completed them."""
    from cursorsync.app.job import query_failure

    deadline = time.monotonic() + timeout_s
    while True:
        for q in job.queries:
            if q.exception() is not None:
                raise query_failure(q.name, q.exception())
        got = dict.fromkeys(want, 0)
        for i, b in enumerate(recorder.done()):
            for cluster in got:
                got[cluster] += b.rows.get(cluster, 0)
            if all(got[c] >= n for c, n in want.items()):
                return i
        if time.monotonic() > deadline:
            raise IngestionError(f"the mapping query ingested {got} rows of {dict(want)} within "
                             f"{timeout_s:.0f} s")
        time.sleep(0.1)


def mapping_figures(job: Any, batches: Sequence[MappingBatch], t0: float,
                     cpu0: Mapping[str, float], entries: int, target: str) -> dict[str, Any]:
    """Rates from job start and warm (after the first batch), and each batch's figures
    (Spark's progress report of the last batch follows its sink by a moment)."""
    query = job.queries[0]
    deadline = time.monotonic() + 5.0
    while (query.lastProgress is None or query.lastProgress["batchId"] < len(batches) - 1
           ) and time.monotonic() < deadline:
        time.sleep(0.05)
    trigger = {p["batchId"]: p["durationMs"].get("triggerExecution")
               for p in (json.loads(p.json) for p in query.recentProgress)}
    per_batch = []
    before = cpu0
    for i, b in enumerate(batches):
        ms = trigger.get(i)
        per_batch.append({"batch": i, "rows": b.rows, "sink_s": round(b.sink_s, 2),
                          "trigger_s": None if ms is None else round(ms / 1000, 2),
                          "cpu_s": CpuSampler.diff(before, b.cpu)})
        before = b.cpu
    seconds = batches[-1].ended_at - t0
    first = batches[0]
    warm_s = batches[-1].ended_at - first.ended_at
    warm_entries = entries - first.rows.get(target, 0)
    return {
        "entries": entries, "batches": len(batches), "seconds_from_start": round(seconds, 2),
        "first_batch_ended_after_s": round(first.ended_at - t0, 2),
        "entries_per_s_from_start": round(entries / seconds, 1),
        "entries_per_s_warm": round(warm_entries / warm_s, 1) if warm_s > 0 else None,
        "per_batch": per_batch}


def check_mapping(config: Any, produced: Sequence[Produced],
                  on_target: Mapping[str, Position]) -> dict[str, int]:
    """Every produced entry's position on a looked up in the ``mappings`` table against
    where its messages are on b: pairs checked, wrong, unmapped."""
    from cursorsync.core.records import PartitionKey
    from cursorsync.pulsar.topics import TopicName
    from cursorsync.tables import open_store
    from cursorsync.tables.mappings_table import MappingStore
    from cursorsync_devtools.testbed.produce import entries_of

    store = open_store(config.tables.backend, config.tables.path)
    mappings = MappingStore(store, config.source.name, config.target.name).refresh()
    checked = wrong = unmapped = 0
    for (topic, pos), messages in entries_of(produced).items():
        tn = TopicName.parse(topic)
        m = mappings.get(PartitionKey(str(tn.base), tn.partition))
        got = None if m is None else m.lookup(pos)
        checked += 1
        if got is None:
            unmapped += 1
        elif {on_target[x.key] for x in messages} != {got}:
            wrong += 1
    return {"pairs_checked": checked, "pairs_wrong": wrong, "pairs_unmapped": unmapped}
