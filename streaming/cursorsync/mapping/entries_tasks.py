"""What a micro-batch of ``pulsar-entries`` reads: offsets, the (start, end] range of each
topic partition, ranges packed into Spark tasks, and the entry budget shared across
topics."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.errors import ConfigError
from cursorsync.mapping.entries_options import (
    COLUMNS,
    DEFAULT_KEPT_READERS,
    DEFAULT_RECEIVER_QUEUE,
    TAIL_CHECK_MS,
)
from cursorsync.pulsar.admin import AdminSettings
from cursorsync.pulsar.client import ClientSettings

OFFSET_VERSION = 1
#: "Before every entry" of a topic partition.
BEFORE_ALL = Position(-1, -1)


def entries_offset(positions: Mapping[str, Position]) -> dict[str, Any]:
    """A ``pulsar-entries`` offset (JSON value) of each topic partition's last position read:
    version first, topics sorted."""
    return {"version": OFFSET_VERSION,
            "positions": {k: str(positions[k]) for k in sorted(positions)}}


def entries_positions(offset: Mapping[str, Any]) -> dict[str, Position]:
    """A ``pulsar-entries`` offset (JSON) -> {topic: position}, what :func:`entries_offset`
    wrote; ConfigError for a version we do not know."""
    if isinstance(offset, str):
        offset = json.loads(offset)
    version = offset.get("version")
    if version != OFFSET_VERSION:
        raise ConfigError(
            f"pulsar-entries offset version {version!r} is not supported (expected "
            f"{OFFSET_VERSION}); the checkpoint was written by another cursorsync version"
        )
    return {k: Position.parse(v) for k, v in offset.get("positions", {}).items()}


@dataclass(frozen=True)
class EntriesPartition(InputPartition):
    """Read (start, end] of one topic partition. Plain data: it is pickled to executors."""

    cluster: str
    topic: str
    start: str
    end: str
    client: ClientSettings
    identity_fields: tuple[str, ...]
    identity: bool
    per_entry: bool
    source_position_property: str
    read_timeout_ms: int
    columns: tuple[str, ...] = COLUMNS
    receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE
    #: Readers the worker keeps open between ranges (cursorsync.mapping.kept_readers).
    kept_readers: int = DEFAULT_KEPT_READERS
    identity_batched_only: bool = False
    identity_rows_only: bool = False
    #: The stamp is evidence of its own (strategy position-property): a stamped target
    #: entry needs no digest. Off, every entry in the identity scope is digested.
    position_evidence: bool = True
    #: ``layout=arrow``: the task's record batches go to Spark packed, one per row.
    packed: bool = False
    #: The admin API, to look up ids the reader does not deliver (see the module doc).
    admin: AdminSettings | None = None
    tail_check_ms: int = TAIL_CHECK_MS
    #: Entries in (start, end] when the range spans ledgers, as the driver counted them
    #: from the ledger list (only a size hint for packing ranges into tasks).
    entries: int | None = None

    def entry_count(self) -> int | None:
        """Entries in (start, end]: exact within one ledger (ids are dense there), else the
        driver's count, None when it has none."""
        start, end = Position.parse(self.start), Position.parse(self.end)
        if start.ledger == end.ledger:
            return end.entry - start.entry
        return self.entries


@dataclass(frozen=True)
class EntriesTask(InputPartition):
    """The ranges one Spark task reads, one after the other, in order."""

    ranges: tuple[EntriesPartition, ...]


def pack_ranges(ranges: Sequence[EntriesPartition], entries_per_task: int,
                ranges_per_task: int) -> list[EntriesTask]:
    """Small ranges share a task; a range is never split.

    A task per topic partition would make a batch over 100,000 partitions with a few new
    entries each 100,000 Spark tasks (each a Python worker round trip and a reader opened).
    So ranges are packed in order, a task closed when the next range would take it past
    ``entries_per_task`` entries or it holds ``ranges_per_task`` ranges (each opens a
    reader, one after the other). A range of unknown size or of ``entries_per_task`` or
    more gets a task of its own.
    """
    tasks: list[EntriesTask] = []
    current: list[EntriesPartition] = []
    size = 0
    for r in ranges:
        n = r.entry_count()
        big = n is None or n >= entries_per_task
        if current and (big or size + (n or 0) > entries_per_task
                        or len(current) >= ranges_per_task):
            tasks.append(EntriesTask(tuple(current)))
            current, size = [], 0
        if big:
            tasks.append(EntriesTask((r,)))
            continue
        current.append(r)
        size += n or 0
    if current:
        tasks.append(EntriesTask(tuple(current)))
    return tasks


def first_entry_after(ledgers: Ledgers, position: Position) -> Position | None:
    """The first entry of the ledger list after ``position``, None if there is none."""
    for lid, n in zip(ledgers.ids.tolist(), ledgers.entries.tolist(), strict=True):
        if lid == position.ledger and position.entry + 1 < n:
            return Position(lid, position.entry + 1)
        if lid > position.ledger and n > 0:
            return Position(lid, 0)
    return None


def nth_entry_after(ledgers: Ledgers, position: Position, k: int) -> Position | None:
    """The ``k``-th entry (k >= 1) of the ledger list after ``position``, None past its end."""
    for lid, n in zip(ledgers.ids.tolist(), ledgers.entries.tolist(), strict=True):
        if lid < position.ledger:
            continue
        first = position.entry + 1 if lid == position.ledger else 0
        here = max(0, n - first)
        if k <= here:
            return Position(lid, first + k - 1)
        k -= here
    return None


def allocate(available: Mapping[str, int | None], budget: int) -> dict[str, int]:
    """Share ``budget`` entries fairly over topics (None = unknown, unbounded).

    Water-filling in name order: each round gives every topic still wanting
    an equal share (at least 1), so small topics finish and leave the rest to
    the others. Deterministic for the same inputs.
    """
    alloc = {t: 0 for t in available}
    pending = sorted(t for t, a in available.items() if a is None or a > 0)
    remaining = budget
    while pending and remaining > 0:
        share = max(1, remaining // len(pending))
        still: list[str] = []
        for t in pending:
            if remaining == 0:
                break
            cap = available[t]
            want = share if cap is None else min(share, cap - alloc[t])
            give = min(want, remaining)
            alloc[t] += give
            remaining -= give
            if cap is None or alloc[t] < cap:
                still.append(t)
        pending = still
    return alloc
