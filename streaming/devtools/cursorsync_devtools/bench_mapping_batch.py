"""``cursorsync-dev bench mapping-batch``: the mapping query's batches for many topic
partitions on the driver, no brokers.

A running job's mapping builder, as the mapping sink holds it, for ``partitions`` topic
partitions (topics of 100 partitions): each partition's state (its last target and source
ids seen) and its mapping (one segment of 100 entries), the mappings settled in
memory-mapped files as the sink keeps them. Then batches of entry rows for an ``active``
fraction of the partitions, ``entries`` target entries each carrying the source-position
property, as the target's reader returns them. Per batch: the builder's work
(``process_seconds``), the state the sink saves with the batch (``state_seconds``, and
the file's size) and the batch's ``mappings`` rows as the sink makes them
(``rows_seconds``); once, a restart's read of that state back (``state_load_seconds``). The
heap the builder keeps per partition is traced apart (``state_bytes_per_partition``).
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.mapping.builder import BuilderSettings, MappingBuilder
from cursorsync.mapping.builder_state import PartitionState, read_state, write_state
from cursorsync.tables.rows import mappings_rows
from cursorsync.tables.spill import Spill

#: Entries each partition's mapping covers before the batches.
MAPPED = 100
#: When the batches' rows are written.
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _key(i: int) -> PartitionKey:
    return PartitionKey(f"persistent://bench/ns/topic-{i // 100}", i % 100)


def _batch(active: np.ndarray, batch: int, entries: int) -> pa.Table:
    """Target entry rows for the ``active`` partitions: ``entries`` each, after the ones
    the earlier batches returned, each stamped with its source id."""
    first = MAPPED + batch * entries
    part = np.repeat(active, entries)
    entry = np.tile(np.arange(first, first + entries), len(active))
    n = len(part)
    return pa.table({
        "cluster": pa.array(["B"] * n, pa.string()),
        "topic": pa.array([_key(i).topic for i in part.tolist()], pa.string()),
        "partition": pa.array(part % 100, pa.int32()),
        "ledger": pa.array(1_000_000 + part, pa.int64()),
        "entry": pa.array(entry, pa.int64()),
        "batch_index": pa.array(np.full(n, -1), pa.int32()),
        "source_position": pa.array([f"{500_000 + p}:{e}" for p, e in zip(
            part.tolist(), entry.tolist(), strict=True)], pa.string()),
        "entry_identity": pa.array([None] * n, pa.binary()),
    })


def bench_mapping_batch(partitions: int = 100_000, *, active: float = 0.05,
                        entries: int = 10, batches: int = 3, seed: int = 1,
                        ) -> dict[str, Any]:
    """Run the batches; return the figures (the last batch's are the steady state's)."""
    rng = np.random.default_rng(seed)
    moving = np.sort(rng.choice(partitions, max(1, round(partitions * active)), replace=False))
    builder = MappingBuilder(BuilderSettings("A", "B", ("position-property", "identity")),
                             spill=Spill())
    tracemalloc.start()
    for i in range(partitions):
        builder._parts[_key(i)] = PartitionState(
            last_target=Position(1_000_000 + i, MAPPED - 1),
            last_source=Position(500_000 + i, MAPPED - 1))
    state_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    builder.seed_known({_key(i): TopicMapping(SegmentSet.of([Segment(
        500_000 + i, 0, 1_000_000 + i, 0, MAPPED)])) for i in range(partitions)})
    rows = [_batch(moving, b, entries) for b in range(batches)]
    out: dict[str, Any] = {"partitions": partitions, "active_partitions": len(moving),
                           "entries_per_batch": rows[0].num_rows, "batches": []}
    with tempfile.TemporaryDirectory(prefix="cursorsync-bench-") as tmp:
        path = Path(tmp) / "builder-0.arrow"
        for b, batch in enumerate(rows):
            t0 = time.perf_counter()
            outcome = builder.process(batch)
            t1 = time.perf_counter()
            write_state(path, builder.state())
            t2 = time.perf_counter()
            rows = mappings_rows([(k, outcome.mappings[k], outcome.live.get(k))
                                  for k in sorted(outcome.mappings)],
                                 source_cluster="A", target_cluster="B", written_at=NOW)
            t3 = time.perf_counter()
            mapped = sum(m.segments.entry_count() for m in outcome.mappings.values())
            if mapped != len(moving) * entries:
                raise RuntimeError(f"batch {b} mapped {mapped} entries, not "
                                     f"{len(moving) * entries}")
            out["batches"].append({"process_seconds": round(t1 - t0, 3),
                                   "state_seconds": round(t2 - t1, 3),
                                   "rows_seconds": round(t3 - t2, 3),
                                   "rows": rows.num_rows})
        out["state_file_bytes"] = path.stat().st_size
        t0 = time.perf_counter()
        MappingBuilder(builder.config).load_state(read_state(path))
        out["state_load_seconds"] = round(time.perf_counter() - t0, 3)
    last = out["batches"][-1]
    out["batch_seconds"] = round(last["process_seconds"] + last["state_seconds"], 3)
    out["state_bytes_per_partition"] = round(state_bytes / partitions)
    return out
