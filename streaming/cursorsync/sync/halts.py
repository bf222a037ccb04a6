"""Halts that last: a subscription halted after a source rewind stays halted, in the
``halts`` table, across batches, restarts and both emission modes, until an operator
resumes it (``cursorsync resume``).

Why an operator: acks already sent to the target cannot be taken back, so after the
source moved back the target is ahead of it; only someone who has reset the target
cursor too (or accepts the difference) can say the sync may go on.

Each halt names its cause (:class:`HaltCause`), judged when it is found from the source
cursor then and the one observed before it, and kept as the first word of the row's
``reason``, so the halt's cause outlives a restart: some call for someone at once (the
source moved back, the target is now ahead of it), others follow an operator's own
change (the target cursor reset back).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.continuity import vanished_unacked
from cursorsync.core.cursor import CursorState
from cursorsync.core.records import HaltRecord, PartitionKey, Result
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.topics import TopicName
from cursorsync.tables.rows import halt_rows, latest_halts
from cursorsync.tables.store import RowFilter, TableStore

#: The writer id of `cursorsync resume` in the halts table's transaction log.
RESUME_APP = "cursorsync-resume"

#: A cursor: a (topic partition, subscription) pair.
HaltKey = tuple[PartitionKey, str]
#: Cursors halted now.
HaltedKeys = set[HaltKey]


class HaltCause(StrEnum):
    """Why a cursor's sync halted, as told by its source cursor and the one observed before.

    The sync step halts a cursor whose source un-acked entries (rewind_policy halt), or
    which covers entries only because their ledgers are gone and unknown to be its topic's
    (:mod:`cursorsync.core.continuity`); which of these it was shows in the observations.
    """

    #: Entries acked on the source are unacked now in ledgers it still lists: a resetcursor
    #: or seek on the source, or acks its broker lost. The target is ahead of the source.
    SOURCE_REWIND = "source_rewind"
    #: Entries the source cursor showed unacked are in ledgers it no longer lists: the topic
    #: deleted and created again, or its ledgers trimmed around an unload.
    TOPIC_RECREATED = "topic_recreated"
    #: Neither, with the source as it was: the target holds unacked copies of entries older
    #: than any ledger the source topic lists, which it did not before: its cursor reset
    #: back (an operator's resetcursor on the target), or the mapping of older ledgers came.
    TARGET_RESET = "target_reset"
    #: Observed for the first time with target copies older than any ledger the source
    #: lists: a target that keeps more than the source, or a topic created again before.
    FIRST_SYNC = "first_sync"
    #: A halt recorded without a cause (by an older version), or whose cursor is not seen.
    UNKNOWN = "unknown"


_WHY = {
    HaltCause.SOURCE_REWIND: "the source cursor moved back over {n} entries (a resetcursor "
                             "or seek on the source, or acks its broker lost)",
    HaltCause.TOPIC_RECREATED: "{n} entries the source cursor showed unacked are in ledgers "
                               "the source no longer lists and cannot show were its own "
                               "(deleted and created again?)",
    HaltCause.TARGET_RESET: "the target holds unacked copies of {n} entries older than any "
                            "ledger the source lists, which it did not at the last sync (its "
                            "cursor reset back?)",
    HaltCause.FIRST_SYNC: "observed for the first time, the target holds unacked copies of "
                          "{n} entries older than any ledger the source lists (a target "
                          "that keeps more than the source, or a topic created again?)",
    HaltCause.UNKNOWN: "the source cursor moved back over or lost {n} entries",
}


def halt_cause(current: CursorState | None, previous: CursorState | None, *,
               rewind_halts: bool) -> HaltCause:
    """The cause of a halt found with the source cursor at ``current``, observed at
    ``previous`` before (None: never); ``rewind_halts``: rewind_policy is halt."""
    if current is None:
        return HaltCause.UNKNOWN
    if previous is None:
        return HaltCause.FIRST_SYNC
    if rewind_halts and (previous.acked() - current.acked()).count_entries(current.ledgers):
        return HaltCause.SOURCE_REWIND
    if vanished_unacked(previous, current):
        return HaltCause.TOPIC_RECREATED
    return HaltCause.TARGET_RESET


def cause_of(reason: str) -> HaltCause:
    """The cause a halt row's ``reason`` starts with (UNKNOWN when it names none)."""
    head, sep, _ = reason.partition(": ")
    try:
        return HaltCause(head) if sep else HaltCause.UNKNOWN
    except ValueError:
        return HaltCause.UNKNOWN


def read_halt_causes(store: TableStore, *, source_cluster: str, target_cluster: str
                     ) -> dict[HaltKey, HaltCause]:
    """The cursors halted now, with the cause of each halt."""
    if not store.exists("halts"):
        return {}
    rows = store.read("halts", RowFilter.of(source_cluster=source_cluster,
                                            target_cluster=target_cluster))
    return {k: cause_of(r.reason) for k, r in latest_halts(rows).items() if r.halted}


def read_halts(store: TableStore, *, source_cluster: str, target_cluster: str
               ) -> HaltedKeys:
    """The (topic partition, subscription) pairs halted now."""
    return set(read_halt_causes(store, source_cluster=source_cluster,
                                target_cluster=target_cluster))


def halted_counts(causes: Mapping[HaltKey, HaltCause]) -> dict[tuple[str, str], int]:
    """Halted partitions per (subscription, cause): what the metrics show."""
    return dict(Counter((sub, str(cause)) for (_, sub), cause in causes.items()))


#: The causes of a batch's new halts, given their cursors.
Classify = Callable[[set[HaltKey]], Mapping[HaltKey, HaltCause]]


def new_halts(progress: pa.Table, known: Collection[HaltKey],
              classify: Classify | None = None) -> list[HaltRecord]:
    """Halts a batch's ``sync_progress`` rows show that ``known`` does not have yet, each
    with the cause ``classify`` gives (UNKNOWN without it)."""
    # A row per cursor, 100,000 at scale: the halted ones are picked out first.
    halted = progress.filter(pc.equal(progress.column("outcome"), Result.HALTED.value))
    rows = [r for r in halted.to_pylist()
            if (PartitionKey(r["topic"], r["partition"]), r["subscription"]) not in known]
    keys = {(PartitionKey(r["topic"], r["partition"]), r["subscription"]) for r in rows}
    causes = classify(keys) if classify is not None and keys else {}
    out = []
    for r in rows:
        key = (PartitionKey(r["topic"], r["partition"]), r["subscription"])
        cause = causes.get(key, HaltCause.UNKNOWN)
        why = _WHY[cause].format(n=r["rewound_entries"])
        out.append(HaltRecord(key[0], key[1], True, f"{cause}: {why}", r["rewound_entries"],
                              r["emitted_at"]))
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
