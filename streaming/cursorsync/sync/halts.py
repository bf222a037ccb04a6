"""Halts that last: a subscription halted after a source rewind stays halted, in the
``halts`` table, across batches, restarts and both emission modes, until an operator
resumes it (``cursorsync resume``).

Why an operator: acks already sent to the target cannot be taken back, so after the
source moved back the target is ahead of it; only someone who has reset the target
cursor too (or accepts the difference) can say the sync may go on.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.records import HaltRecord, PartitionKey, Result
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.topics import TopicName
from cursorsync.tables.rows import halt_rows, latest_halts
from cursorsync.tables.store import RowFilter, TableStore

#: The writer id of `cursorsync resume` in the halts table's transaction log.
RESUME_APP = "cursorsync-resume"

#: Cursors, (topic partition, subscription) pairs, halted now.
HaltedKeys = set[tuple[PartitionKey, str]]


def read_halts(store: TableStore, *, source_cluster: str, target_cluster: str
               ) -> HaltedKeys:
    """The (topic partition, subscription) pairs halted now."""
    if not store.exists("halts"):
        return set()
    rows = store.read("halts", RowFilter.of(source_cluster=source_cluster,
                                            target_cluster=target_cluster))
    return {k for k, r in latest_halts(rows).items() if r.halted}


def new_halts(progress: pa.Table, known: HaltedKeys) -> list[HaltRecord]:
    """Halts a batch's ``sync_progress`` rows show that ``known`` does not have yet."""
    out = []
    # A row per cursor, 100,000 at scale: the halted ones are picked out first.
    for r in progress.filter(pc.equal(progress.column("outcome"), Result.HALTED.value)).to_pylist():
        key = (PartitionKey(r["topic"], r["partition"]), r["subscription"])
        if key not in known:
            out.append(HaltRecord(
                key[0], key[1], True,
                f"the source cursor moved back over or lost {r['rewound_entries']} entries "
                "(a rewind, or ledgers gone that the source topic cannot show were its own: "
                "deleted and created again?)",
                r["rewound_entries"], r["emitted_at"]))
    return out


def record_halts(store: TableStore, halts: list[HaltRecord], *, source_cluster: str,
                 target_cluster: str, app_id: str, batch_id: int) -> None:
    """Append halt rows as batch ``batch_id`` of ``app_id`` (idempotent on a replay)."""
    store.append("halts", halt_rows(halts, source_cluster=source_cluster,
                                    target_cluster=target_cluster),
                 app_id=app_id, batch_id=batch_id)


class NothingHaltedError(CursorSyncError):
    """``cursorsync resume`` found no halt to clear for what it was given."""


def resume(store: TableStore, *, source_cluster: str, target_cluster: str, topic: str,
           subscription: str, operator: str = "an operator") -> list[HaltRecord]:
    """Clear the halts of ``subscription`` on ``topic`` (every partition, or the one a
    ``-partition-N`` suffix names); returns what was resumed."""
    name = TopicName.parse(topic)
    base = str(name.base)
    partition = name.partition if name.partition >= 0 else None
    now = read_halts(store, source_cluster=source_cluster, target_cluster=target_cluster)
    keys = sorted(k for k in now if k[1] == subscription and k[0].topic == base
                  and (partition is None or k[0].partition == partition))
    if not keys:
        raise NothingHaltedError(
            f"nothing is halted for subscription {subscription!r} on {topic} "
            f"({source_cluster} -> {target_cluster}); `cursorsync status` shows each "
            "partition's last outcome")
    at = datetime.now(UTC)
    resumed = [HaltRecord(k, s, False, f"resumed by {operator}", 0, at) for k, s in keys]
    last = store.table_batch("halts", RESUME_APP)
    record_halts(store, resumed, source_cluster=source_cluster, target_cluster=target_cluster,
                 app_id=RESUME_APP, batch_id=(last + 1) if last is not None else 0)
    return resumed
