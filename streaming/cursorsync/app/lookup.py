"""One source position -> its target position through the ``mappings`` table.

Distinct outcomes (``exact``, ``unmapped``, ``unknown-topic``) and, when unmapped, the
nearest mapped source positions on either side. Like the translator, it never
extrapolates. Nothing here needs Spark or a broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from cursorsync.app.status import TablesNotFoundError, partition_key, pos_text
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Segment, TopicMapping
from cursorsync.tables import TableStore
from cursorsync.tables.mappings_table import load_mappings

LookupOutcome = Literal["exact", "unmapped", "unknown-topic"]
LOOKUP_OUTCOMES: tuple[LookupOutcome, ...] = get_args(LookupOutcome)


@dataclass(frozen=True)
class LookupResult:
    """What the mappings table says about one source position.

    ``exact``: ``target`` (the first copy), ``evidence`` and the covering ``segment``
    are set, and ``copies`` holds every target copy (more than one where the
    replicator sent the entry again).
    ``unmapped``: ``mapped_before`` / ``mapped_after`` are the nearest mapped
    source positions on either side (None when there is none), ``reason`` says
    whether it may still be mapped. ``unknown-topic``: no mapping rows for the
    partition at all; ``known_partitions`` lists the topic's partitions that
    have rows.
    """

    topic: str
    partition: int
    source: Position
    outcome: LookupOutcome
    target: Position | None = None
    evidence: str | None = None
    segment: Segment | None = None
    mapped_before: Position | None = None
    mapped_after: Position | None = None
    reason: str = ""
    known_partitions: tuple[int, ...] = field(default_factory=tuple)
    copies: tuple[Position, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "partition_topic": PartitionKey(self.topic, self.partition).concrete_topic(),
            "source": str(self.source),
            "outcome": self.outcome,
            "target": pos_text(self.target),
            "copies": [str(c) for c in self.copies],
            "evidence": self.evidence,
            "segment": None if self.segment is None else {
                "source": f"{self.segment.source_ledger}:{self.segment.source_entry}",
                "target": f"{self.segment.target_ledger}:{self.segment.target_entry}",
                "count": self.segment.count,
                "evidence": self.segment.evidence,
            },
            "mapped_before": pos_text(self.mapped_before),
            "mapped_after": pos_text(self.mapped_after),
            "reason": self.reason,
            "known_partitions": list(self.known_partitions),
        }


def lookup(
    store: TableStore,
    topic: str,
    position: Position,
    *,
    partition: int | None = None,
    source_cluster: str | None = None,
    target_cluster: str | None = None,
) -> LookupResult:
    """Source ``position`` on ``topic`` -> target position, from the ``mappings`` table.

    ``topic`` may carry a ``-partition-i`` suffix or the index may come as
    ``partition``. Raises :class:`TablesNotFoundError` when there is no
    ``mappings`` table under the store's root.
    """
    key = partition_key(topic, partition)
    if not store.exists("mappings"):
        raise TablesNotFoundError(
            f"no mappings table under {store.root}; check tables.path, or let "
            "`cursorsync run` write a batch first"
        )
    mappings, _ = load_mappings(store, source_cluster=source_cluster,
                                target_cluster=target_cluster, topics=[key.topic])
    present = sorted(k.partition for k in mappings)
    if key not in mappings:
        return LookupResult(
            key.topic, key.partition, position, "unknown-topic",
            reason=_unknown_reason(key, present), known_partitions=tuple(present),
        )
    return _lookup_in(key, mappings[key], position, tuple(present))


def _unknown_reason(key: PartitionKey, present: Sequence[int]) -> str:
    where = f"no mappings recorded for {key.concrete_topic()}"
    if not present:
        return f"{where} (no partition of it has any); check the topic name and the clusters"
    if key.partition < 0:
        listed = ", ".join(str(p) for p in present)
        return (f"{where}: it is partitioned; mappings exist for partitions {listed}. "
                f"Name one as {key.topic}-partition-N")
    if present == [-1]:
        return f"{where}: the topic is not partitioned; give it without -partition-N"
    return f"{where}; mappings exist for partitions {', '.join(str(p) for p in present)}"


def _lookup_in(
    key: PartitionKey, mapping: TopicMapping, position: Position, present: tuple[int, ...]
) -> LookupResult:
    segs = mapping.segments
    found = segs.covering(position)
    if found:
        seg = segs[found[0]]
        copies = tuple(t for i in found if (t := segs[i].lookup(position)) is not None)
        return LookupResult(key.topic, key.partition, position, "exact", target=copies[0],
                            evidence=seg.evidence, segment=seg, known_partitions=present,
                            copies=copies)
    rows = segs.rows
    sl, se, last = rows[:, 0], rows[:, 1], rows[:, 1] + rows[:, 4] - 1
    ends_before = (sl < position.ledger) | ((sl == position.ledger) & (last < position.entry))
    starts_after = ~ends_before  # not covering it, so starting after it
    mapped_before = mapped_after = None
    if ends_before.any():
        i = np.flatnonzero(ends_before)[np.lexsort((last[ends_before], sl[ends_before]))[-1]]
        mapped_before = Position(int(sl[i]), int(last[i]))
    if starts_after.any():
        i = np.flatnonzero(starts_after)[np.lexsort((se[starts_after], sl[starts_after]))[0]]
        mapped_after = Position(int(sl[i]), int(se[i]))
    if position in mapping.unreplicated.ranges():
        reason = ("the source entry is recorded as never replicated (marker, or not sent to "
                  "this cluster): it is never mapped, and never acked on the target")
    elif len(rows) == 0:
        reason = "no segments recorded for this partition yet"
    elif mapped_after is None:
        reason = (f"after the last mapped source position {mapped_before}: not mapped yet "
                  "(not replicated yet, or the mapping query is behind)")
    elif mapped_before is None:
        reason = f"before the first mapped source position {mapped_after}: no evidence for it"
    else:
        reason = (f"between mapped source positions {mapped_before} and {mapped_after}: "
                  "no evidence for it (yet)")
    return LookupResult(key.topic, key.partition, position, "unmapped",
                        mapped_before=mapped_before, mapped_after=mapped_after, reason=reason,
                        known_partitions=present)


__all__ = ["LOOKUP_OUTCOMES", "LookupOutcome", "LookupResult", "lookup"]
