"""Which source cursors' partly acked batches changed since the last sync batch, as the
source brokers' cursorsync plugin says (its cursor digests,
:mod:`cursorsync.pulsar.cursor_digests`), for ``emission.batch_index_acks``.

A consumer that acks part of a batch and nothing else changes no field of the cursor's
``internalStats``: to the sync such a cursor looks as it was, and an idle one would stay
idle, its new batch indexes not carried until the cursor moves. The plugin's ``batches``
digest of each cursor changes with them: a cursor whose digest differs from the one seen
at the last batch is planned again (its batches read and carried). One request per broker
and namespace a batch. A digest not seen before counts as unchanged: a cursor first seen
is planned in full anyway; a cursor missing from an answer (a broker that cannot be
asked, a topic between brokers) keeps its last digest, so a change while it was missing
shows when it is listed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from cursorsync.core.records import PartitionKey
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.cursor_digests import TopicDigest
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)

#: Every topic partition the source brokers serve in the synced namespaces, by full name.
SourceDigests = Callable[[], Mapping[str, TopicDigest]]
Key = tuple[PartitionKey, str]


class BatchMoves:
    """The batches digests seen at the last sync batch, per (topic partition, subscription)."""

    def __init__(self, digests: SourceDigests) -> None:
        self.digests = digests
        self._seen: dict[tuple[str, str], str] = {}
        self._failing = False

    def next_batch(self) -> frozenset[Key]:
        """Asks the source's brokers; the cursors whose batches digest moved since the last
        answer (none when they cannot be asked: logged once until they can again)."""
        try:
            now = self.digests()
        except CursorSyncError as err:
            if not self._failing:
                log.warning("the source brokers' cursor digests cannot be read (%s): a cursor "
                            "whose only change is a partly acked batch waits until its "
                            "cursor moves", err)
            self._failing = True
            return frozenset()
        self._failing = False
        current = {(t, s): c.batches for t, d in now.items() for s, c in d.cursors.items()}
        moved = frozenset(_key(t, s) for (t, s), b in current.items()
                          if self._seen.get((t, s), b) != b)
        self._seen.update(current)
        return moved


def _key(topic: str, subscription: str) -> Key:
    name = TopicName.parse(topic)
    return PartitionKey(str(name.base), name.partition), subscription
