"""Target cursors, many at a time, from the target's admin API.

A sync batch reads the target cursors of the cursors whose source moved, and of the idle
ones due for a check. Each read is a round trip to a broker, so a batch of thousands must
not make them one after another: the reads of a batch go out together, on up to the target
cluster's ``max_concurrency`` threads, and a topic partition is asked once
(``internalStats``) however many of its subscriptions are synced. With cursorsync's broker
plugin on the target's brokers (``spark.cursor_digests``), a batch's cursors are read from
it first: a request per broker and namespace returns what those internalStats requests
would of the ledgers and the synced subscriptions' cursors
(:class:`cursorsync.pulsar.cursor_digests.PluginCursorStats`); a partition it does not
answer for, or that lacks one of those subscriptions, is read on its own.
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
from cursorsync.pulsar.cursor_digests import PluginCursorStats
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

    def __init__(self, admin: AdminClient, *, plugin: bool = False) -> None:
        self.admin = admin
        #: internalStats requests made, for the step's metrics.
        self.requests = 0
        self.plugin = PluginCursorStats(admin, "the target cursors", enabled=plugin)

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
        wanted: dict[str, set[str]] = {}
        for t, s in pairs:
            wanted.setdefault(t, set()).add(s)
        by_topic: dict[str, TopicInternalStats | AdminUnavailableError | None] = dict(
            self.plugin.read(wanted))
        rest = [t for t in topics if t not in by_topic]
        workers = min(self.admin.config.max_workers, len(rest))
        if workers == 1:
            by_topic.update((t, self._stats(t)) for t in rest)
        elif rest:
            with ThreadPoolExecutor(max_workers=workers,
                                    thread_name_prefix="target-reads") as pool:
                by_topic.update(zip(rest, pool.map(self._stats, rest), strict=True))
        self.requests += len(rest)
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

