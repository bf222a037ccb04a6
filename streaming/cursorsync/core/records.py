"""What the job observes and records, as plain values: topic partitions, observed cursors,
sync outcomes. The tables store them (:mod:`cursorsync.tables.rows`); nothing here knows how."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cursorsync.core.cursor import AckPlan, CursorState


@dataclass(frozen=True, order=True, slots=True)
class PartitionKey:
    """One topic partition: the base topic name and its index (-1 when not partitioned)."""

    topic: str
    partition: int = -1

    def concrete_topic(self) -> str:
        """The topic a client or the admin API addresses: ``<topic>-partition-<i>`` for a
        partition, the topic itself when not partitioned."""
        return self.topic if self.partition < 0 else f"{self.topic}-partition-{self.partition}"


@dataclass(frozen=True, slots=True)
class ObservedCursor:
    """A source cursor state as observed: where, which subscription, when."""

    key: PartitionKey
    subscription: str
    state: CursorState
    observed_at: datetime


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """What one sync step did for one subscription: the plan and how it was emitted."""

    key: PartitionKey
    subscription: str
    plan: AckPlan
    acks_sent: int
    dry_run: bool
    source_observed_at: datetime
    emitted_at: datetime
