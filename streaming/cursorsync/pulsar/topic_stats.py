"""What a topic's ``stats`` say about whether its cursors moved.

``internalStats`` is what a cursor's state is read from, and a broker pays for it: it
formats every cursor's acknowledgement ranges and the ledger list (about 1.6 ms of broker
CPU per partition on the test bed). The topic ``stats`` cost a fifteenth of that and carry
counters that move whenever a subscription's cursor does: the backlog (every ack, single or
cumulative, and every reset or skip changes it), the last ack and mark-delete times, the
number of ack holes, the expired count, and the topic's message and storage counters (a new
entry, a trimmed ledger). A partition whose fingerprint of those is what it was when its
``internalStats`` were last read has the cursors it had then.

A fingerprint is None when the stats lack the counters it needs: such a partition is read
every time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cursorsync.errors import MalformedAdminOutputError

#: Topic counters: a message added, a ledger trimmed.
TOPIC_FIELDS = ("msgInCounter", "storageSize")
#: Subscription counters that move with its cursor.
SUBSCRIPTION_FIELDS = ("msgBacklog", "lastAckedTimestamp", "lastMarkDeleteAdvancedTimestamp",
                       "nonContiguousDeletedMessagesRanges", "totalMsgExpired")

Fingerprint = tuple[tuple[Any, ...], tuple[tuple[str, tuple[Any, ...]], ...]]


def fingerprint(topic: str, doc: Any, subscriptions: Sequence[str] | None,
                ) -> Fingerprint | None:
    """The counters of ``doc`` (one partition's ``stats``) for the wanted subscriptions
    (None: every one), or None when a counter is missing."""
    if not isinstance(doc, Mapping):
        raise MalformedAdminOutputError(f"stats of {topic}: not a JSON object")
    subs = doc.get("subscriptions")
    if not isinstance(subs, Mapping):
        raise MalformedAdminOutputError(f"stats of {topic}: no subscriptions object")
    wanted = sorted(n for n in subs if subscriptions is None or n in subscriptions)
    if any(f not in doc for f in TOPIC_FIELDS) or any(
            not isinstance(subs[n], Mapping) or any(f not in subs[n] for f in SUBSCRIPTION_FIELDS)
            for n in wanted):
        return None
    return (tuple(doc[f] for f in TOPIC_FIELDS),
            tuple((n, tuple(subs[n][f] for f in SUBSCRIPTION_FIELDS)) for n in wanted))


def partition_docs(topic: str, doc: Any) -> dict[str, Any]:
    """``partitioned-stats?perPartition=true``: each partition's stats by its full name."""
    parts = doc.get("partitions") if isinstance(doc, Mapping) else None
    if not isinstance(parts, Mapping):
        raise MalformedAdminOutputError(f"partitioned-stats of {topic}: no partitions object")
    return {str(k): v for k, v in parts.items()}
