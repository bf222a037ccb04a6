"""The replication topology of the topics in play, as both clusters' admin APIs say it.

A topic's clusters are the union of what the source and the target apply (the topic's
own replication policy, else its namespace's). Read once per topic and again after
``interval_s``, so that a topic whose replication changes while the job runs is seen
within that time. :mod:`cursorsync.core.topology` says what holds on what it finds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from cursorsync.core.topology import Topology, refusals
from cursorsync.errors import AdminError, ConfigError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)

#: How long a topic's topology is trusted before it is read again.
DEFAULT_INTERVAL_S = 60.0


class TopologyError(ConfigError):
    """A configured evidence strategy does not hold on a topic's replication topology."""


class TopologyWatch:
    """Each topic's :class:`Topology`, read when first asked for and again once stale.

    Thread-safe: both queries' sinks ask it."""

    def __init__(self, source_admin: AdminClient, target_admin: AdminClient, source: str,
                 target: str, strategies: Sequence[str], *,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source_admin, self.target_admin = source_admin, target_admin
        self.source, self.target = source, target
        self.strategies = tuple(strategies)
        self.interval_s = interval_s
        self.clock = clock
        self._known: dict[str, tuple[Topology, float]] = {}
        self._lock = threading.Lock()

    def topology(self, topic: str) -> Topology:
        """The topic's topology (a partition's is its partitioned topic's). A failed read
        keeps the last one known; with none known, the admin error is raised."""
        base = str(TopicName.parse(topic).base)
        with self._lock:
            known = self._known.get(base)
        now = self.clock()
        if known is not None and now - known[1] < self.interval_s:
            return known[0]
        try:
            clusters = (self.source_admin.replication_clusters(base)
                        | self.target_admin.replication_clusters(base))
        except AdminError as err:
            if known is None:
                raise
            log.warning("the replication clusters of %s cannot be read now (%s); the ones "
                        "read %.0f s ago stand", base, err, now - known[1])
            return known[0]
        found = Topology(base, self.source, self.target, clusters)
        with self._lock:
            self._known[base] = (found, now)
        if known is not None and known[0].clusters != clusters:
            log.warning("the replication of %s changed from %s to %s", base,
                        ", ".join(sorted(known[0].clusters)), ", ".join(sorted(clusters)))
        return found

    def current(self, topic: str) -> Topology | None:
        """:meth:`topology`, or None when it cannot be read and none is known."""
        try:
            return self.topology(topic)
        except AdminError as err:
            log.warning("the replication clusters of %s cannot be read (%s): only evidence "
                        "that holds on any topology is used for it", topic, err)
            return None

    def check(self, topics: Iterable[str]) -> list[Topology]:
        """The topics' topologies; TopologyError when the configured evidence does not hold
        on one of them (the first refusal's line, and how many more there are)."""
        found = [self.topology(t) for t in sorted({str(TopicName.parse(t).base)
                                                   for t in topics})]
        raise_refusals(refusals(found, self.strategies))
        return found


def raise_refusals(lines: Sequence[str]) -> None:
    """TopologyError with the first line (and a count of the others), when there are any."""
    if lines:
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        raise TopologyError(lines[0] + more)


__all__ = ["DEFAULT_INTERVAL_S", "TopologyError", "TopologyWatch", "raise_refusals"]
