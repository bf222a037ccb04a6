"""Which entry ids a target reader skipped are broker markers: asked of the target's admin API.

A reader skips two kinds of stored entries. Broker markers are never dispatched,
so acking them is safe, and it lets the target's markDeletePosition pass them.
The chunks of a chunked message before its last one are assembled by the client;
acking one on the target loses the message after a failover. What a reader
returns cannot tell them apart in time: a chunked message's first-chunk id
arrives with its last chunk, possibly batches after its first chunks were
skipped. The raw-entry endpoint can: a marker carries ``X-Pulsar-marker-type``.

Only the leading markers of each run are kept. The sync acks a skippable run
only once the entry before it is acked, and it never acks a skipped entry that
is not a marker, so whatever follows one in its run could not be acked anyway.
Checking therefore stops at a run's first non-marker: a run that starts with a
chunk costs one request, a run of k markers k requests.

The markers read on the way are kept where they say something: a
REPLICATED_SUBSCRIPTION_UPDATE is Pulsar's own replicated subscription moving a
subscription on the target (:meth:`AdminHoleCheck.drain_updates`), shown beside
cursorsync's position by ``cursorsync status``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from cursorsync.core.positions import Position
from cursorsync.core.records import BuiltinUpdate, PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.builder import HoleCheck
from cursorsync.pulsar.admin import AdminClient, RawEntry
from cursorsync.pulsar.markers import MarkerParseError, SubscriptionUpdate, parse_marker

log = logging.getLogger(__name__)

#: MessageMetadata.marker_type of REPLICATED_SUBSCRIPTION_UPDATE.
UPDATE = 13

__all__ = ["AdminHoleCheck", "HoleCheck", "HoleCheckStats",
           "leading_markers"]


def leading_markers(look_up: Callable[[int], RawEntry | None],
                    count: int) -> tuple[int, RawEntry | None]:
    """How many entries from a run's start are markers, and what the first other one is
    (None: absent, or none); ``look_up(i)`` reads entry i."""
    for i in range(count):
        raw = look_up(i)
        if raw is None or not raw.is_marker:
            return i, raw
    return count, None


@dataclass
class HoleCheckStats:
    """Totals since start, for logs and metrics."""

    markers: int = 0
    not_markers: int = 0  # runs cut short: a chunk, an aborted-transaction entry, a trimmed id
    malformed: int = 0  # markers whose body could not be parsed

    @property
    def requests(self) -> int:
        """One per marker, one per run cut short."""
        return self.markers + self.not_markers


class AdminHoleCheck:
    """A :data:`HoleCheck` that asks the target cluster's admin API, runs in parallel."""

    def __init__(self, admin: AdminClient, max_workers: int = 8,
                 target_cluster: str | None = None) -> None:
        """``target_cluster``: the cluster ``admin`` answers for; with it, UPDATE markers
        are kept for :meth:`drain_updates`."""
        self.admin = admin
        self.max_workers = max(1, max_workers)
        self.target_cluster = target_cluster
        self.stats = HoleCheckStats()
        self._lock = threading.Lock()
        self._updates: list[BuiltinUpdate] = []

    def requests_by_kind(self) -> dict[str, int]:
        """Admin requests made since start, by kind."""
        return {"raw-entry": self.stats.requests}

    def drain_updates(self) -> list[BuiltinUpdate]:
        """The UPDATE markers read since the last call, in no particular order."""
        with self._lock:
            out, self._updates = self._updates, []
        return out

    def __call__(self, candidates: Mapping[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        jobs = [(key, int(ledger), int(entry), int(count))
                for key, runs in candidates.items()
                for ledger, entry, count in runs.rows.tolist()]
        if not jobs:
            return {}
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs)),
                                thread_name_prefix="hole-check") as pool:
            kept = list(pool.map(self._check_run, jobs))
        out: dict[PartitionKey, list[tuple[int, int, int]]] = {}
        for (key, ledger, entry, _), markers in zip(jobs, kept, strict=True):
            if markers:
                out.setdefault(key, []).append((ledger, entry, markers))
        return {key: Runs(np.array(rows, dtype=np.int64)) for key, rows in out.items()}

    def _check_run(self, job: tuple[PartitionKey, int, int, int]) -> int:
        """How many ids from the run's start are markers (the UPDATE ones kept)."""
        key, ledger, entry, count = job
        topic = key.concrete_topic()
        updates: list[BuiltinUpdate] = []
        malformed = 0

        def look_up(i: int) -> RawEntry | None:
            nonlocal malformed
            # Past a ledger's end (a probe past the last entry a reader returned there):
            # no such entry, so not a marker.
            found = self.admin.raw_entry(topic, ledger, entry + i, past_end_ok=True)
            if (self.target_cluster is not None and found is not None and found.is_marker
                    and found.marker_type == UPDATE):
                at = Position(ledger, entry + i)
                try:
                    marker = parse_marker(UPDATE, found.body or b"",
                                          where=f"entry {at} of {topic} on the target")
                except MarkerParseError as err:
                    malformed += 1
                    log.error("%s; the built-in's move it records is not shown", err)
                    return found
                if isinstance(marker, SubscriptionUpdate):
                    to = dict(marker.clusters).get(self.target_cluster)
                    if to is not None:
                        updates.append(BuiltinUpdate(key, marker.subscription, to, at))
            return found

        markers, other = leading_markers(look_up, count)
        with self._lock:
            self.stats.markers += markers
            self.stats.not_markers += markers < count
            self.stats.malformed += malformed
            self._updates += updates
        if markers < count and other is not None:
            what = (f"chunk {other.chunk_id} of {other.num_chunks}" if other.chunk_id is not None
                    else "not a marker")
            log.info("%s: skipped id %d:%d is %s, so it and the %d skipped ids after it are "
                     "not acked on the target", topic, ledger, entry + markers, what,
                     count - markers - 1)
        return markers

