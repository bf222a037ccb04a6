"""Which entries of a topic partition are markers, asked of a cluster's admin API."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from cursorsync.core.positions import Position
from cursorsync.pulsar.admin import AdminClient


class AdminMarkerLookup:
    """Which of some entries of a topic partition are markers, asked of a cluster's admin
    API in parallel (the sync step's :data:`~cursorsync.sync.step.MarkerLookup`, on the source).
    An entry the API does not have is not a marker."""

    def __init__(self, admin: AdminClient, max_workers: int = 8) -> None:
        self.admin = admin
        self.max_workers = max(1, max_workers)
        self.requests = 0

    def __call__(self, topic: str, positions: list[Position]) -> list[Position]:
        if not positions:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(positions)),
                                thread_name_prefix="marker-lookup") as pool:
            found = list(pool.map(
                lambda p: self.admin.raw_entry(topic, p.ledger, p.entry), positions))
        self.requests += len(positions)
        return [p for p, raw in zip(positions, found, strict=True)
                if raw is not None and raw.is_marker]


__all__ = ["AdminMarkerLookup"]
