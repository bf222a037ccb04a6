"""What the sync step reads of the source cursors: observed by ``pulsar-cursors``, and
their last states before a batch from ``cursor_states``."""

from __future__ import annotations

from datetime import UTC

import pyarrow as pa

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.tables.rows import cursor_states
from cursorsync.tables.store import RowFilter, TableStore


def observations(table: pa.Table) -> list[ObservedCursor]:
    """``pulsar-cursors`` rows -> observed cursor states."""
    out = []
    for r in table.to_pylist():
        ledgers = (None if r["ledgers"] is None
                   else Ledgers.of((x["ledger_id"], x["entries"]) for x in r["ledgers"]))
        state = CursorState(Position.parse(r["mark_delete"]),
                            RangeSet.parse(r["individually_deleted"]), ledgers)
        observed = r["observed_at"]
        if observed.tzinfo is None:
            observed = observed.replace(tzinfo=UTC)
        out.append(ObservedCursor(PartitionKey(r["topic"], int(r["partition"])),
                                  r["subscription"], state, observed))
    return out


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
