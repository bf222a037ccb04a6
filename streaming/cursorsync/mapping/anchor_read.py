"""The source's snapshot markers, read through its admin API: the builder's :data:`AnchorRead`.

Readers never receive markers, so a marker is an id the source reader skipped, or an id past
the last entry it returned (the snapshot that covers a topic's last message is written after
it). The raw-entry endpoint returns either with ``X-Pulsar-marker-type`` and the marker's
protobuf as its body. Only SNAPSHOT markers that name the target cluster make anchors: the
source position of the target's answer (``local_message_id``) and the target's position.

A marker that cannot be parsed, or an id the admin API does not answer for, is logged and
counted, never guessed at: the anchor it held is missing, which costs progress under
``snapshot`` evidence and never safety.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cursorsync.core.anchors import Anchors
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.errors import CursorSyncError
from cursorsync.mapping.builder import AnchorFindings
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.markers import MarkerParseError, Snapshot, parse_marker

log = logging.getLogger(__name__)

#: Ids of one skipped run looked at, at most: runs of markers are short (a request, the
#: answers, a snapshot); a long run is a chunked message's first chunks.
RUN_LIMIT = 16
#: Ids past a tail looked at per batch, at most.
TAIL_LIMIT = 32


@dataclass
class AnchorReadStats:
    """Totals since start, for logs and metrics."""

    requests: int = 0
    markers: int = 0
    anchors: int = 0
    malformed: int = 0
    failed: int = 0  # ids the admin API gave no answer for


class AdminAnchorRead:
    """An :data:`~cursorsync.mapping.builder.AnchorRead` on the source cluster's admin API."""

    def __init__(self, admin: AdminClient, target_cluster: str, max_workers: int = 8) -> None:
        self.admin = admin
        self.target_cluster = target_cluster
        self.max_workers = max(1, max_workers)
        self.stats = AnchorReadStats()
        self._lock = threading.Lock()

    def __call__(self, holes: Mapping[PartitionKey, Runs],
                 tails: Mapping[PartitionKey, Position]) -> AnchorFindings:
        jobs: list[tuple[PartitionKey, Position, int, bool]] = [
            (key, Position(int(lg), int(e)), min(int(n), RUN_LIMIT), False)
            for key, runs in holes.items() for lg, e, n in runs.rows.tolist()]
        jobs += [(key, Position(p.ledger, p.entry + 1), TAIL_LIMIT, True)
                 for key, p in tails.items()]
        if not jobs:
            return AnchorFindings()
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs)),
                                thread_name_prefix="anchor-read") as pool:
            results = list(pool.map(lambda j: self._read(*j), jobs))
        anchors: dict[PartitionKey, list[tuple[Position, Position]]] = {}
        ends: dict[PartitionKey, Position] = {}
        for (key, _, _, tail), (found, last) in zip(jobs, results, strict=True):
            if found:
                anchors.setdefault(key, []).extend(found)
            if tail and last is not None:
                ends[key] = last
        with self._lock:
            self.stats.anchors += sum(len(v) for v in anchors.values())
        return AnchorFindings({k: Anchors.of(*v) for k, v in anchors.items()}, ends)

    def _read(self, key: PartitionKey, start: Position, count: int, tail: bool
              ) -> tuple[list[tuple[Position, Position]], Position | None]:
        """Look at ``count`` ids from ``start``: the anchors among them, and the last marker
        of the unbroken run of markers from ``start`` (a tail stops at its first non-marker:
        the reader returns that one later)."""
        topic = key.concrete_topic()
        found: list[tuple[Position, Position]] = []
        last: Position | None = None
        requests = markers = malformed = 0
        for i in range(count):
            pos = Position(start.ledger, start.entry + i)
            try:
                raw = self.admin.raw_entry(topic, pos.ledger, pos.entry, past_end_ok=tail)
            except CursorSyncError as err:
                log.warning("%s: cannot read id %s for snapshot markers (%s); the rest of "
                            "its run is not looked at", topic, pos, err)
                with self._lock:
                    self.stats.failed += 1
                break
            requests += 1
            if raw is None or not raw.is_marker:
                if tail:
                    break
                continue
            markers += 1
            last = pos
            where = f"entry {pos} of {topic} on the source"
            try:
                marker = parse_marker(int(raw.marker_type or 0), raw.body or b"", where=where)
            except MarkerParseError as err:
                malformed += 1
                log.error("%s; its snapshot anchor, if it held one, is not used", err)
                continue
            if isinstance(marker, Snapshot):
                clusters = dict(marker.clusters)
                at = clusters.get(self.target_cluster)
                if at is not None:
                    found.append((marker.local, at))
        with self._lock:
            self.stats.requests += requests
            self.stats.markers += markers
            self.stats.malformed += malformed
        return found, last


__all__ = ["AdminAnchorRead", "AnchorReadStats"]
