"""Where cursorsync's sync lag goes, per entry, from its own tables and b's polled cursor.

For an entry acked on a at ``acked``, the times the job left behind say when each step
was done with it:

* ``observed``: the first ``cursor_states`` row whose source cursor covers the entry (the
  source poll that saw the ack);
* ``mapped``: the first ``mappings`` segment row covering its source position (the
  mapping batch that paired it);
* ``emitted``: the first ``sync_progress`` row whose target markDeletePosition or acked
  ranges cover its counterpart on b (the sync batch that acked it);
* ``covered``: the first poll of b's cursor that covers the counterpart.

The lag splits into four stages that add up to it: **source poll** (acked -> observed),
**mapping** (observed -> mapped, none if mapped first), **sync** (the later of the two ->
emitted: waiting for a sync batch and running it) and **target** (emitted -> covered on
b: the broker's answer and the poll's resolution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.positions import Position
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed.lag import CursorChange, ack_windows, first_covered
from cursorsync_devtools.testbed.produce import entries_of
from cursorsync_devtools.testbed.workload import WorkloadResult

STAGES = ("source poll", "mapping", "sync", "target")


@dataclass(frozen=True)
class EntryTimes:
    """Per entry acked on a (NaN: the step never covered it), epoch seconds."""

    acked: np.ndarray
    observed: np.ndarray
    mapped: np.ndarray
    emitted: np.ndarray
    covered: np.ndarray


def stages(t: EntryTimes) -> dict[str, np.ndarray]:
    """Seconds per stage for the entries every step covered; the stages add up to the lag."""
    whole = ~np.isnan(np.stack([t.acked, t.observed, t.mapped, t.emitted, t.covered])).any(0)
    acked, observed, mapped = t.acked[whole], t.observed[whole], t.mapped[whole]
    emitted, covered = t.emitted[whole], t.covered[whole]
    ready = np.maximum(observed, mapped)
    return {"source poll": observed - acked, "mapping": ready - observed,
            "sync": emitted - ready, "target": covered - emitted}


def figures(t: EntryTimes) -> dict[str, Any]:
    """p50 / p99 of each stage and of their sum, and how many entries had every time."""
    per = stages(t)
    n = len(per["sync"])
    out: dict[str, Any] = {"entries": len(t.acked), "with_every_time": n}
    for name, s in {**per, "lag": sum(per.values(), np.zeros(n))}.items():
        out[name] = ({"p50_s": round(float(np.percentile(s, 50)), 3),
                      "p99_s": round(float(np.percentile(s, 99)), 3)} if n else None)
    return out


def figures_by_window(t: EntryTimes, started_at: float, split_s: float
                      ) -> dict[str, dict[str, Any]]:
    """:func:`figures` of the entries acked in the workload's first ``split_s`` seconds (it
    started at ``started_at``, epoch seconds) and of those acked after: where a new topic's
    first seconds spend their longer lag."""
    out: dict[str, dict[str, Any]] = {}
    for label, pick in ack_windows(t.acked, started_at, split_s):
        out[label] = figures(EntryTimes(t.acked[pick], t.observed[pick], t.mapped[pick],
                                        t.emitted[pick], t.covered[pick]))
    return out


def entry_times(result: WorkloadResult, subscription: str, on_target: Mapping[str, Position],
                changes: Mapping[tuple[str, str], Sequence[CursorChange]],
                cursor_states: pa.Table, mappings: pa.Table, progress: pa.Table
                ) -> EntryTimes:
    """The times of every entry ``subscription`` acked on a (see the module's docstring):
    ``changes`` b's polled cursors; the three tables the job's rows of the live topic."""
    acked = result.acked.get(subscription, {})
    rows: dict[str, list[tuple[float, Position, Position]]] = {}
    for (topic, pos), messages in entries_of(result.messages).items():
        if all(m.key in acked for m in messages):
            rows.setdefault(topic, []).append(
                (max(acked[m.key] for m in messages), pos, on_target[messages[0].key]))
    observed_by = _changes(cursor_states, subscription, "observed_at", "mark_delete",
                           "individually_deleted")
    emitted_by = _changes(progress.filter(pc.invert(progress["dry_run"])),
                          subscription, "emitted_at", "target_mark_delete", "acked_ranges")
    segments = _segments(mappings)
    parts: list[list[np.ndarray]] = [[] for _ in range(5)]
    for topic, entries in rows.items():
        source = [p for _, p, _ in entries]
        target = [p for _, _, p in entries]
        for i, times in enumerate((
                np.array([a for a, _, _ in entries]),
                first_covered(observed_by.get(topic, []), source, individual=True),
                _first_mapped(segments.get(topic), source),
                first_covered(emitted_by.get(topic, []), target, individual=True),
                first_covered(changes.get((topic, subscription), []), target,
                              individual=True))):
            parts[i].append(times)
    joined = [np.concatenate(p) if p else np.zeros(0) for p in parts]
    return EntryTimes(*joined)


def _partition_topic(topic: str, partition: int) -> str:
    name = TopicName.parse(topic)
    return str(name.with_partition(partition)) if partition >= 0 else str(name)


def _epoch(at: datetime) -> float:
    """Epoch seconds of a table's timestamp (UTC, whether or not it says so)."""
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _changes(table: pa.Table, subscription: str, at: str, mark_delete: str, ranges: str
             ) -> dict[str, list[CursorChange]]:
    """A table's rows of ``subscription`` as cursor changes per topic partition, in time
    order."""
    out: dict[str, list[tuple[float, str, str]]] = {}
    for r in table.to_pylist():
        if r["subscription"] != subscription or r[f"{mark_delete}_ledger"] is None:
            continue
        out.setdefault(_partition_topic(r["topic"], r["partition"]), []).append(
            (_epoch(r[at]), f"{r[f'{mark_delete}_ledger']}:{r[f'{mark_delete}_entry']}",
             r[ranges] or "[]"))
    return {k: sorted(v) for k, v in out.items()}


def _segments(table: pa.Table) -> dict[str, np.ndarray]:
    """Segment rows per topic partition: (source ledger, first entry, count, written at)."""
    out: dict[str, list[tuple[int, int, int, float]]] = {}
    for r in table.to_pylist():
        if r["kind"] == "segment":
            out.setdefault(_partition_topic(r["topic"], r["partition"]), []).append(
                (r["source_ledger"], r["source_entry"], r["count"], _epoch(r["written_at"])))
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}


def _first_mapped(segments: np.ndarray | None, positions: Sequence[Position]) -> np.ndarray:
    """Per source position, when the first segment covering it was written (NaN: none)."""
    first = np.full(len(positions), np.nan)
    if segments is None or not len(positions):
        return first
    ledgers = np.array([p.ledger for p in positions], dtype=np.float64)
    entries = np.array([p.entry for p in positions], dtype=np.float64)
    for ledger, start, count, written in segments[np.argsort(segments[:, 3])]:
        hit = ((ledgers == ledger) & (entries >= start) & (entries < start + count)
               & np.isnan(first))
        first[hit] = written
    return first


__all__ = ["STAGES", "EntryTimes", "entry_times", "figures", "stages"]
