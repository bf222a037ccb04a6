"""Benchmarks that print their figures; never timed assertions.

``translate``: a source cursor with N acknowledgement holes over a backlog of
10*N entries across many ledgers, through segments broken by ledger rollover
on both sides and a marker every 1000 target entries. The per-entry oracle
runs on a subset it can finish (stated in the output) for the speedup, and
its plan is checked equal to the fast one on that subset.

``mapping_rows``: a steady stream on one partition (one ledger each side, a
share of its entries batched, so mapped by ``identity`` between entries mapped
by ``position-property``) fed to the :class:`MappingBuilder` in micro-batches,
as the mapping query feeds it; counts the segment rows the batches write, and
beside them the rows the same mapping needs with one evidence for every row
(per batch, and with one open tail carried across batches, which the builder
does not do: each batch starts its own segments).
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs, SegmentSet, TopicMapping
from cursorsync.core.translate import translate
from cursorsync.mapping.builder import BuilderSettings, MappingBuilder
from cursorsync_devtools.oracle import oracle_translate

SOURCE_LEDGER_ENTRIES = 50_000
TARGET_LEDGER_ENTRIES = 40_000
MARKER_EVERY = 1_000
ENTRIES_PER_HOLE = 10


@dataclass(frozen=True)
class TranslateInput:
    source: CursorState
    mapping: TopicMapping
    target: CursorState
    entries: int


def _ledgers(total: int, per: int, first_id: int, stride: int) -> tuple[Ledgers, np.ndarray]:
    n = -(-total // per)
    ids = first_id + stride * np.arange(n, dtype=np.int64)
    counts = np.full(n, per, dtype=np.int64)
    counts[-1] = total - per * (n - 1)
    return Ledgers(ids, counts), ids


def build_translate_input(ranges: int) -> TranslateInput:
    """A cursor with ``ranges`` holes over ``10 * ranges`` entries, and its mapping."""
    total = ENTRIES_PER_HOLE * ranges + ENTRIES_PER_HOLE
    g = np.arange(total, dtype=np.int64)
    src_ledgers, src_ids = _ledgers(total, SOURCE_LEDGER_ENTRIES, 1_000, 3)
    # Target: a marker after every MARKER_EVERY replicated entries.
    t = g + g // MARKER_EVERY
    t_total = int(t[-1]) + 2
    tgt_ledgers, tgt_ids = _ledgers(t_total, TARGET_LEDGER_ENTRIES, 70_000, 7)

    def src_pos(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return src_ids[x // SOURCE_LEDGER_ENTRIES], x % SOURCE_LEDGER_ENTRIES

    def tgt_pos(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return tgt_ids[x // TARGET_LEDGER_ENTRIES], x % TARGET_LEDGER_ENTRIES

    # Segments: runs where neither ledger changes and no marker intervenes.
    sl, se = src_pos(g)
    tl, te = tgt_pos(t)
    brk = np.flatnonzero(np.concatenate((
        [True], (sl[1:] != sl[:-1]) | (tl[1:] != tl[:-1]) | (te[1:] != te[:-1] + 1))))
    counts = np.diff(np.concatenate((brk, [total])))
    segments = SegmentSet(np.stack([sl[brk], se[brk], tl[brk], te[brk], counts], axis=1),
                          validate=False)
    markers = np.arange(MARKER_EVERY, t_total, MARKER_EVERY + 1, dtype=np.int64)
    ml, me = tgt_pos(markers)
    skippable = Runs(np.stack([ml, me, np.ones_like(ml)], axis=1))
    del g, t, sl, se, tl, te

    # Holes: entry 10k+9 unacked; acked ranges (hole_k .. hole_k + 9] between them.
    holes = ENTRIES_PER_HOLE * np.arange(ranges, dtype=np.int64) + ENTRIES_PER_HOLE - 1
    hi = np.minimum(holes + ENTRIES_PER_HOLE - 1, total - 1)
    lo_l, lo_e = src_pos(holes)
    hi_l, hi_e = src_pos(hi)
    keep = hi > holes
    bounds = np.stack([lo_l, lo_e, hi_l, hi_e], axis=1)[keep]
    md = Position(int(src_ids[0]), ENTRIES_PER_HOLE - 2)
    source = CursorState(md, RangeSet(bounds, _canonical=True), src_ledgers)
    target = CursorState(Position(int(tgt_ids[0]), -1), RangeSet(), tgt_ledgers)
    return TranslateInput(source, TopicMapping(segments, skippable), target, total)


def _time_translate(inp: TranslateInput, repeat: int = 3) -> float:
    """Best of ``repeat``. Each run gets the source cursor's ranges afresh, as a new poll
    does, so that keys a range set keeps from one run do not speed up the next."""
    best = float("inf")
    bounds = inp.source.individually_deleted.bounds
    for _ in range(repeat):
        source = replace(inp.source,
                         individually_deleted=RangeSet(bounds.copy(), _canonical=True))
        t0 = time.perf_counter()
        translate(source, inp.mapping, inp.target)
        best = min(best, time.perf_counter() - t0)
    return best


def bench_translate(ranges: int, *, oracle_entries: int = 200_000) -> dict[str, Any]:
    """Time the translator on ``ranges`` holes, and the oracle on a subset it can finish."""
    inp = build_translate_input(ranges)
    seconds = _time_translate(inp)
    tracemalloc.start()
    plan = translate(inp.source, inp.mapping, inp.target)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    sub_ranges = max(1, min(ranges, oracle_entries // ENTRIES_PER_HOLE))
    sub = build_translate_input(sub_ranges)
    sub_fast = _time_translate(sub)
    t0 = time.perf_counter()
    o = oracle_translate(sub.source.mark_delete, sub.source.individually_deleted,
                         sub.source.ledgers or Ledgers.of([]), sub.mapping,
                         sub.target.mark_delete, sub.target.individually_deleted,
                         sub.target.ledgers or Ledgers.of([]))
    oracle_seconds = time.perf_counter() - t0
    sub_plan = translate(sub.source, sub.mapping, sub.target)
    agree = (set(sub_plan.to_ack.iter_entries(sub.target.ledgers)) == set(o.to_ack)
             and sub_plan.mark_delete == o.mark_delete)
    oracle_per_entry = oracle_seconds / sub.entries
    return {
        "benchmark": "translate",
        "ranges": len(inp.source.individually_deleted),
        "entries": inp.entries,
        "segments": len(inp.mapping.segments),
        "skippable_runs": len(inp.mapping.skippable),
        "seconds": round(seconds, 4),
        "peak_memory_mb": round(peak / 2**20, 1),
        "target_ranges_out": len(plan.individually_deleted),
        "acks_planned_entries": plan.to_ack.count_entries(inp.target.ledgers),
        "oracle_subset_ranges": sub_ranges,
        "oracle_subset_entries": sub.entries,
        "oracle_seconds": round(oracle_seconds, 4),
        "translate_seconds_on_subset": round(sub_fast, 5),
        "speedup_on_subset": round(oracle_seconds / sub_fast, 1),
        "oracle_seconds_extrapolated_full": round(oracle_per_entry * inp.entries, 1),
        "speedup_extrapolated_full": round(oracle_per_entry * inp.entries / seconds, 1),
        "oracle_agrees_on_subset": agree,
    }


def _entry_rows(first: int, last: int, batched: np.ndarray) -> Any:
    """``pulsar-entries`` rows for entries ``first..last-1``: the target's copy of
    each (stamped unless batched), and the source's own for the batched ones."""
    import pyarrow as pa

    idx = np.arange(first, last)
    b = idx[batched[first:last]]
    digests = [i.to_bytes(16, "big") for i in b.tolist()]
    n_t, n_s = len(idx), len(b)
    stamps = [None if batched[i] else f"3:{i}" for i in idx.tolist()]
    ident = dict(zip(b.tolist(), digests, strict=True))
    return pa.table({
        "cluster": ["B"] * n_t + ["A"] * n_s,
        "topic": ["bench"] * (n_t + n_s),
        "partition": pa.array([0] * (n_t + n_s), pa.int32()),
        "ledger": pa.array([7] * n_t + [3] * n_s, pa.int64()),
        "entry": pa.array(np.concatenate((idx, b)), pa.int64()),
        "batch_index": pa.array([-1] * (n_t + n_s), pa.int32()),
        "source_position": pa.array(stamps + [None] * n_s, pa.string()),
        "entry_identity": pa.array([ident.get(i) for i in idx.tolist()] + digests, pa.binary()),
    })


def _joined(rows: np.ndarray) -> int:
    """Segments left when one evidence stands for every row, so evidence never breaks a run."""
    if len(rows) < 2:
        return len(rows)
    return len(SegmentSet(rows[:1]) | SegmentSet(rows[1:], validate=False))


def _segment_rows(store: Any) -> int:
    import pyarrow.compute as pc

    rows = store.read("mappings", columns=["kind"])
    return int(pc.sum(pc.equal(rows.column("kind"), "segment")).as_py() or 0)


def bench_mapping_rows(entries: int = 50_000, *, batched_share: float = 0.2,
                       batch_entries: int = 500, seed: int = 1) -> dict[str, Any]:
    """Segment rows per mapped entry for a steady stream (see the module docstring): as each
    batch writes them to a real ``mappings`` table (delta-rs, in a temporary directory), and
    after the table maintenance merges them."""
    import tempfile
    from datetime import UTC, datetime

    from cursorsync.tables import open_store
    from cursorsync.tables.mappings_table import merge_rows
    from cursorsync.tables.rows import mapping_rows

    rng = np.random.default_rng(seed)
    batched = rng.random(entries) < batched_share
    builder = MappingBuilder(BuilderSettings("A", "B"))
    written = joined_per_batch = 0
    with tempfile.TemporaryDirectory(prefix="cursorsync-bench-") as tmp:
        store = open_store("delta-rs", tmp)
        for batch, first in enumerate(range(0, entries, batch_entries)):
            out = builder.process(_entry_rows(first, min(entries, first + batch_entries),
                                              batched))
            for key, m in out.mappings.items():
                written += len(m.segments)
                joined_per_batch += _joined(m.segments.rows)
                store.append("mappings", mapping_rows(
                    key, m, source_cluster="A", target_cluster="B",
                    written_at=datetime.now(UTC)), app_id="bench", batch_id=batch)
        in_table = _segment_rows(store)
        t0 = time.perf_counter()
        merge_rows(store, before=datetime.now(UTC))
        merge_s = time.perf_counter() - t0
        merged = _segment_rows(store)
    known = next(iter(builder.known.values())).segments
    mapped = known.entry_count()
    joined = _joined(known.rows)
    return {
        "segment_rows_in_table": in_table, "segment_rows_after_merge": merged,
        "rows_per_entry_after_merge": merged / entries, "merge_seconds": round(merge_s, 3),
        "entries": entries, "batched_share": batched_share, "batch_entries": batch_entries,
        "mapped": mapped, "rows_written": written, "rows_per_entry": written / entries,
        "rows_joined_per_batch": joined_per_batch,
        "rows_joined_per_batch_per_entry": joined_per_batch / entries,
        "rows_joined_tail_carried": joined,
        "rows_joined_tail_carried_per_entry": joined / entries,
    }
