"""Which entry ids a target reader skipped are broker markers: asked of the target's admin API.

A reader skips two kinds of stored entries. Broker markers are never dispatched,
so acking them is safe, and it lets the target's markDeletePosition pass them.
The chunks of a chunked message before its last one are assembled by the client;
acking one on the target loses the message after a failover. What a reader
returns cannot tell them apart in time: a chunked message's first-chunk id
arrives with its last chunk, possibly batches after its first chunks were
skipped. The raw-entry endpoint can: a marker carries ``X-Pulsar-marker-type``.

A chunk carries the source-position stamp the replicator writes on every entry it
copies, so where that stamp is trusted (``position-property`` evidence, on two clusters)
a skipped chunk maps to the source entry holding the same chunk, and is acked on the
target exactly when that one is acked on the source (:meth:`AdminHoleCheck.drain_chunks`).

A run is read from its start up to its first id that is neither a marker nor such a
chunk (an unstamped chunk, an aborted transaction's message, an id past its ledger's
end). The sync acks a skippable run only once the entry before it is acked, and never
acks a skipped id it knows nothing of, so whatever follows that id in its run could not
be acked anyway: a run of k markers and chunks costs k requests, and one more where
it is cut short.

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

from cursorsync.core.identity import REPL_SOURCE_POSITION_PROPERTY
from cursorsync.core.positions import Position
from cursorsync.core.records import BuiltinUpdate, PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.pairs import Pairs
from cursorsync.mapping.skipped_ids import HoleCheck
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.cursor_digests import PluginCursorStats
from cursorsync.pulsar.markers import MarkerParseError, SubscriptionUpdate, parse_marker
from cursorsync.pulsar.raw_entry import RawEntry
from cursorsync.pulsar.stats import TopicInternalStats

log = logging.getLogger(__name__)

#: MessageMetadata.marker_type of REPLICATED_SUBSCRIPTION_UPDATE.
UPDATE = 13


__all__ = ["AdminHoleCheck", "HoleCheck", "HoleCheckStats", "RunFindings", "read_run",
           "stamped_chunk"]


@dataclass(frozen=True)
class RunFindings:
    """What reading a run of skipped ids from its start found, as offsets into the run."""

    #: (offset, length) of each stretch of markers.
    markers: list[tuple[int, int]]
    #: (offset, the source entry holding the same chunk) of each mapped chunk.
    chunks: list[tuple[int, Position]]
    #: Where reading stopped: the first id neither a marker nor a mapped chunk (the run's
    #: length when there is none), and what that id is (None: absent, or none).
    stop: int
    other: RawEntry | None


def read_run(look_up: Callable[[int], RawEntry | None], count: int,
             source_of: Callable[[RawEntry], Position | None]) -> RunFindings:
    """Read a run of ``count`` skipped ids (``look_up(i)`` reads id i) up to its first id
    that is neither a marker nor a chunk ``source_of`` maps to a source entry."""
    markers: list[tuple[int, int]] = []
    chunks: list[tuple[int, Position]] = []
    begun: int | None = None  # the offset where the current stretch of markers began
    for i in range(count):
        raw = look_up(i)
        if raw is not None and raw.is_marker:
            begun = i if begun is None else begun
            continue
        if begun is not None:
            markers.append((begun, i - begun))
            begun = None
        source = source_of(raw) if raw is not None else None
        if source is None:
            return RunFindings(markers, chunks, i, raw)
        chunks.append((i, source))
    if begun is not None:
        markers.append((begun, count - begun))
    return RunFindings(markers, chunks, count, None)


def stamped_chunk(source_cluster: str) -> Callable[[RawEntry], Position | None]:
    """A ``source_of`` for :func:`read_run`: a chunk replicated from ``source_cluster`` maps
    to the source entry its stamp names; anything else to nothing."""
    def source_of(raw: RawEntry) -> Position | None:
        if raw.chunk_id is None or raw.replicated_from != source_cluster:
            return None
        stamp = raw.properties.get(REPL_SOURCE_POSITION_PROPERTY)
        if stamp is None:
            return None
        try:
            at = Position.parse(stamp)
        except ValueError:
            return None  # a stamp in no known spelling says nothing
        return at if at.entry >= 0 else None
    return source_of


def _no_chunks(raw: RawEntry) -> Position | None:
    return None


@dataclass
class HoleCheckStats:
    """Totals since start, for logs and metrics."""

    markers: int = 0
    chunks: int = 0  # chunks mapped by their stamp
    # runs cut short: an unstamped chunk, an aborted-transaction entry, a trimmed id
    not_markers: int = 0
    malformed: int = 0  # markers whose body could not be parsed
    #: internalStats requests read for a partition's ledger list.
    ledger_reads: int = 0

    @property
    def requests(self) -> int:
        """One per marker, one per chunk mapped, one per run cut short."""
        return self.markers + self.chunks + self.not_markers


class AdminHoleCheck:
    """A :data:`HoleCheck` that asks the target cluster's admin API, runs in parallel."""

    def __init__(self, admin: AdminClient, max_workers: int = 8,
                 target_cluster: str | None = None, source_cluster: str | None = None,
                 *, plugin: bool = False) -> None:
        """``target_cluster``: the cluster ``admin`` answers for; with it, UPDATE markers
        are kept for :meth:`drain_updates`. ``source_cluster``: with it, chunks replicated
        from there are mapped by their stamps (:meth:`drain_chunks`); give it only where
        the stamps are trusted (``position-property`` evidence). ``plugin``: the ledger
        lists of many partitions are asked of the brokers' plugin at once."""
        self.admin = admin
        self.plugin = PluginCursorStats(admin, "the ledger lists", enabled=plugin)
        self.max_workers = max(1, max_workers)
        self.target_cluster = target_cluster
        self.source_of = _no_chunks if source_cluster is None else stamped_chunk(source_cluster)
        self.stats = HoleCheckStats()
        self._lock = threading.Lock()
        self._updates: list[BuiltinUpdate] = []
        self._chunks: dict[PartitionKey, list[tuple[int, int, int, int]]] = {}
        self._ledgers: dict[PartitionKey, list[int]] = {}

    def ledgers_between(self, key: PartitionKey, after: int, before: int) -> list[int]:
        """The partition's ledgers strictly between two, from its internalStats (read again
        when ``before`` is not in the list read last)."""
        known = self._ledgers.get(key)
        if known is None or before not in known:
            known = self._ledgers[key] = _ledger_ids(self._internal_stats(key))
        return [ledger for ledger in known if after < ledger < before]

    def learn_ledgers(self, wanted: Mapping[PartitionKey, int]) -> None:
        """Reads the ledger list of each partition of ``wanted`` whose list does not name
        the ledger given: from the plugin when on (a request per broker and namespace),
        the rest one internalStats request each."""
        stale = [key for key, before in wanted.items()
                 if before not in self._ledgers.get(key, ())]
        if not stale:
            return
        # Any subscription will do: the ledgers are the topic's.
        listed = self.plugin.read({key.concrete_topic(): () for key in stale})
        left = []
        for key in stale:
            stats = listed.get(key.concrete_topic())
            if stats is None:
                left.append(key)
            else:
                self._ledgers[key] = _ledger_ids(stats)
        if not left:
            return
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(left)),
                                thread_name_prefix="ledger-lists") as pool:
            found = list(pool.map(self._internal_stats, left))
        for key, stats in zip(left, found, strict=True):
            self._ledgers[key] = _ledger_ids(stats)

    def _internal_stats(self, key: PartitionKey) -> TopicInternalStats:
        stats = self.admin.internal_stats(key.concrete_topic())
        with self._lock:
            self.stats.ledger_reads += 1
        return stats

    def requests_by_kind(self) -> dict[str, int]:
        """Admin requests made since start, by kind."""
        return {"raw-entry": self.stats.requests, "ledger-list": self.stats.ledger_reads,
                "plugin-ledger-list": self.plugin.reads}

    def drain_updates(self) -> list[BuiltinUpdate]:
        """The UPDATE markers read since the last call, in no particular order."""
        with self._lock:
            out, self._updates = self._updates, []
        return out

    def drain_chunks(self) -> dict[PartitionKey, Pairs]:
        """The chunks mapped since the last call: each skipped target id with the source
        entry its stamp names."""
        with self._lock:
            found, self._chunks = self._chunks, {}
        out = {}
        for key, rows in found.items():
            a = np.array(rows, np.int64)
            out[key] = Pairs.of(a[:, 0], a[:, 1], a[:, 2], a[:, 3], "position-property")
        return out

    def __call__(self, candidates: Mapping[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        jobs = [(key, int(ledger), int(entry), int(count))
                for key, runs in candidates.items()
                for ledger, entry, count in runs.rows.tolist()]
        if not jobs:
            return {}
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs)),
                                thread_name_prefix="hole-check") as pool:
            found = list(pool.map(self._check_run, jobs))
        out: dict[PartitionKey, list[tuple[int, int, int]]] = {}
        chunks: dict[PartitionKey, list[tuple[int, int, int, int]]] = {}
        for (key, ledger, entry, _), run in zip(jobs, found, strict=True):
            out.setdefault(key, []).extend((ledger, entry + at, n) for at, n in run.markers)
            chunks.setdefault(key, []).extend((source.ledger, source.entry, ledger, entry + at)
                                              for at, source in run.chunks)
        with self._lock:
            for key, rows in chunks.items():
                if rows:
                    self._chunks.setdefault(key, []).extend(rows)
        return {key: Runs(np.array(rows, dtype=np.int64)) for key, rows in out.items() if rows}

    def _check_run(self, job: tuple[PartitionKey, int, int, int]) -> RunFindings:
        """The run read from its start (the UPDATE markers kept)."""
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

        run = read_run(look_up, count, self.source_of)
        with self._lock:
            self.stats.markers += sum(n for _, n in run.markers)
            self.stats.chunks += len(run.chunks)
            self.stats.not_markers += run.stop < count
            self.stats.malformed += malformed
            self._updates += updates
        if run.stop < count and run.other is not None:
            other = run.other
            what = (f"chunk {other.chunk_id} of {other.num_chunks} with no source-position "
                    "stamp from the source" if other.chunk_id is not None else "not a marker")
            log.info("%s: skipped id %d:%d is %s, so it and the %d skipped ids after it are "
                     "not acked on the target", topic, ledger, entry + run.stop, what,
                     count - run.stop - 1)
        return run


def _ledger_ids(stats: TopicInternalStats) -> list[int]:
    return [int(i) for i in stats.ledgers.ids.tolist()]
