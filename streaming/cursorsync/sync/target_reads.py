"""Target cursors, many at a time, from the target's admin API.

A sync batch reads the target cursors of the cursors whose source moved, and of the idle
ones due for a check. Each read is a round trip to a broker, so a batch of thousands must
not make them one after another: the reads of a batch go out together, on up to the target
cluster's ``max_concurrency`` threads, and a topic partition is asked once
(``internalStats``) however many of its subscriptions are synced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import AdminUnavailableError, TopicNotFoundError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.stats import TopicInternalStats

#: Reads the target's cursor for (concrete topic, subscription): None when unknown.
TargetReader = Callable[[str, str], CursorState | None]
#: A target read's answer: the cursor, None when unknown, or why the admin API gave none.
Target = CursorState | None | AdminUnavailableError
#: Reads the target cursors of a batch's (concrete topic, subscription) pairs together.
TargetsReader = Callable[[Sequence[tuple[str, str]]], dict[tuple[str, str], Target]]


def serial_targets_reader(read: TargetReader) -> TargetsReader:
    """A batch's targets read with ``read``, one after another."""
    def many(pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Target]:
        out: dict[tuple[str, str], Target] = {}
        for pair in pairs:
            try:
                out[pair] = read(*pair)
            except AdminUnavailableError as err:
                out[pair] = err
        return out

    return many


def fresh_target(ledgers: Ledgers | None) -> CursorState:
    """A target cursor nobody has acked on: before its first ledger."""
    if ledgers is None or not len(ledgers.ids):
        return CursorState(Position(-1, -1), RangeSet(), ledgers)
    return CursorState(Position(int(ledgers.ids[0]), -1), RangeSet(), ledgers)


class AdminTargets:
    """Reads target cursors on the target's admin API: one at a time (a
    :data:`TargetReader`) or a batch's together (:meth:`many`)."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin
        #: internalStats requests made, for the step's metrics.
        self.requests = 0

    def __call__(self, topic: str, subscription: str) -> CursorState | None:
        answer = self.many([(topic, subscription)])[topic, subscription]
        if isinstance(answer, AdminUnavailableError):
            raise answer
        return answer

    def many(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Target]:
        """Each (concrete topic, subscription)'s target cursor: a missing subscription
        starts fresh, a missing topic is None, and a topic whose broker gave no usable
        answer gets its AdminUnavailableError (the others are still answered). Any other
        admin error (refused credentials, malformed stats) is raised: no batch can go on."""
        topics = sorted({t for t, _ in pairs})
        if not topics:
            return {}
        workers = min(self.admin.config.max_workers, len(topics))
        if workers == 1:
            stats = [self._stats(t) for t in topics]
        else:
            with ThreadPoolExecutor(max_workers=workers,
                                    thread_name_prefix="target-reads") as pool:
                stats = list(pool.map(self._stats, topics))
        self.requests += len(topics)
        by_topic = dict(zip(topics, stats, strict=True))
        return {(t, s): _cursor(by_topic[t], s) for t, s in pairs}

    def _stats(self, topic: str) -> TopicInternalStats | AdminUnavailableError | None:
        try:
            return self.admin.internal_stats(topic)
        except TopicNotFoundError:
            return None
        except AdminUnavailableError as err:
            return err


def _cursor(stats: TopicInternalStats | AdminUnavailableError | None,
            subscription: str) -> Target:
    if stats is None or isinstance(stats, AdminUnavailableError):
        return stats
    cur = stats.subscriptions.get(subscription)
    if cur is None:
        return fresh_target(stats.ledgers)
    return CursorState(cur.state.mark_delete, cur.state.individually_deleted, stats.ledgers)

