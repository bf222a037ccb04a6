"""What the sync step reads of the source cursors: observed by ``pulsar-cursors``, and
their last states before a batch from ``cursor_states``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.tables.rows import cursor_states
from cursorsync.tables.store import RowFilter, TableStore


def observations(table: pa.Table) -> list[ObservedCursor]:
    """``pulsar-cursors`` rows -> observed cursor states (each value parsed anew)."""
    return Observations()(table)


class Observations:
    """``pulsar-cursors`` rows -> observed cursor states, for a sink that reads one batch
    after another: a partition nothing happened on repeats its values batch after batch,
    so the positions, ranges and ledger lists the last batch parsed are taken again, not
    parsed again (they are values: nothing changes them in place)."""

    def __init__(self) -> None:
        self._positions: dict[str, Position] = {}
        self._ranges: dict[str, RangeSet] = {}
        self._ledgers: dict[tuple[tuple[int, ...], tuple[int, ...]], Ledgers] = {}

    def __call__(self, table: pa.Table) -> list[ObservedCursor]:
        cols = {name: table.column(name).to_pylist() for name in (
            "topic", "partition", "subscription", "mark_delete", "individually_deleted")}
        observed = _times(table.column("observed_at"))
        checked: Sequence[datetime | None] = (
            _times(table.column("checked_at")) if "checked_at" in table.column_names
            else [None] * table.num_rows)
        lists = table.column("ledgers")
        lists = lists.combine_chunks() if lists.num_chunks != 1 else lists.chunk(0)
        flat = lists.flatten()
        ids = flat.field("ledger_id").to_numpy(zero_copy_only=False).tolist()
        counts = flat.field("entries").to_numpy(zero_copy_only=False).tolist()
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        ends = np.cumsum(lengths).tolist()
        missing = lists.is_null().to_numpy(zero_copy_only=False).tolist()
        positions: dict[str, Position] = {}
        ranges: dict[str, RangeSet] = {}
        ledgers: dict[tuple[tuple[int, ...], tuple[int, ...]], Ledgers] = {}
        out = []
        start = 0
        for i, (topic, partition, sub, md, idm) in enumerate(zip(
                cols["topic"], cols["partition"], cols["subscription"], cols["mark_delete"],
                cols["individually_deleted"], strict=True)):
            position = positions.get(md)
            if position is None:
                position = self._positions.get(md)
                positions[md] = position = Position.parse(md) if position is None else position
            acked = ranges.get(idm)
            if acked is None:
                acked = self._ranges.get(idm)
                ranges[idm] = acked = RangeSet.parse(idm) if acked is None else acked
            end = ends[i]
            lg: Ledgers | None = None
            if not missing[i]:
                key = (tuple(ids[start:end]), tuple(counts[start:end]))
                lg = ledgers.get(key)
                if lg is None:
                    lg = self._ledgers.get(key)
                    ledgers[key] = lg = (Ledgers.of(zip(*key, strict=True))
                                         if lg is None else lg)
            start = end
            at = observed[i]
            out.append(ObservedCursor(PartitionKey(topic, partition), sub,
                                      CursorState(position, acked, lg), at,
                                      None if checked[i] == at else checked[i]))
        # What this batch saw, for the next: the cache holds one batch's distinct values.
        self._positions, self._ranges, self._ledgers = positions, ranges, ledgers
        return out


def _times(column: pa.ChunkedArray) -> list[datetime]:
    """A timestamp column (never null: the source stamps every row) as UTC datetimes; a
    poll's rows share a few times, each converted once."""
    distinct = pc.unique(column)
    when = [t if t.tzinfo is not None else t.replace(tzinfo=UTC)
            for t in distinct.to_pylist()]
    which = pc.index_in(column, value_set=distinct).to_numpy(zero_copy_only=False).tolist()
    return [when[w] for w in which]


#: Every poll observes every cursor, so a cursor's last state is nearly always in the last
#: few batches: those are read first, and the whole history only for a cursor not in them.
RECENT_BATCHES = 50


def previous_states(store: TableStore, obs: list[ObservedCursor], batch_id: int, *,
                    source_cluster: str, target_cluster: str,
                    ) -> dict[tuple[PartitionKey, str], ObservedCursor]:
    """The last observation of each observed (partition, subscription) before this batch,
    from ``cursor_states``: what a rewind is measured against after a restart. Reads the
    last :data:`RECENT_BATCHES` batches, and all of a topic's rows only when one of its
    cursors is not in them, so the cost does not grow with the table."""
    prev: dict[tuple[PartitionKey, str], ObservedCursor] = {}
    if batch_id == 0 or not store.exists("cursor_states"):
        return {}
    for topic in sorted({o.key.topic for o in obs}):
        wanted = {(o.key, o.subscription) for o in obs if o.key.topic == topic}
        for since in (max(0, batch_id - RECENT_BATCHES), None):
            rows = store.read("cursor_states", RowFilter.of(
                topic=topic, source_cluster=source_cluster, target_cluster=target_cluster,
                min_batch_id=since, max_batch_id=batch_id - 1))
            for seen in cursor_states(rows):
                k = (seen.key, seen.subscription)
                if k not in prev or seen.observed_at >= prev[k].observed_at:
                    prev[k] = seen
            if since == 0 or wanted <= prev.keys():
                break
    return prev
