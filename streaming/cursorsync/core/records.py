"""What the job observes and records, as plain values: topic partitions, observed cursors,
sync outcomes. The tables store them (:mod:`cursorsync.tables.rows`); nothing here knows how."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.positions import Position


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
    """A source cursor state as observed: where, which subscription, when.

    ``observed_at`` is when the state was read, the only evidence of it; ``checked_at``
    when it was last confirmed unchanged since (None: not since the read).
    """

    key: PartitionKey
    subscription: str
    state: CursorState
    observed_at: datetime
    checked_at: datetime | None = None

    @property
    def confirmed_at(self) -> datetime:
        """When the state was last known current: how old the source view is."""
        return self.observed_at if self.checked_at is None else self.checked_at


#: What the sync does when a source cursor moves back: ``halt`` sends nothing more for that
#: subscription until an operator resumes it; ``report`` records it and goes on.
RewindPolicy = Literal["halt", "report"]

@dataclass(frozen=True)
class BuiltinUpdate:
    """A REPLICATED_SUBSCRIPTION_UPDATE marker read on the target: Pulsar's own replicated
    subscriptions move ``subscription``'s markDeletePosition there to ``target``."""

    key: PartitionKey
    subscription: str
    target: Position
    marker: Position


class Result(StrEnum):
    """What the sync step did with a plan: sent it (or would have, on a dry run), held it
    back because the source rewound (rewind_policy halt), refused it at the guard, or
    failed to send it. The values are what ``sync_progress.outcome`` holds for a plan not
    emitted."""

    EMITTED = "emitted"
    HALTED = "halted"
    REFUSED = "refused"
    FAILED = "failed"


RESULTS: tuple[Result, ...] = tuple(Result)


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """What one sync step did for one subscription: the plan and how it was emitted.

    For a plan not emitted (``result`` other than ``emitted``) the plan says where the
    target stays: its markDeletePosition as before and nothing to ack.
    """

    key: PartitionKey
    subscription: str
    plan: AckPlan
    acks_sent: int
    dry_run: bool
    #: When the source state planned from was last known current
    #: (:attr:`ObservedCursor.confirmed_at`).
    source_observed_at: datetime
    emitted_at: datetime
    result: Result = Result.EMITTED
    #: The record repeats the previous batch's: an idle cursor, nothing changed since.
    repeated: bool = False

    @property
    def lag_ms(self) -> int:
        """How old the source view the plan reflects was when it was emitted."""
        return int((self.emitted_at - self.source_observed_at).total_seconds() * 1000)

    @property
    def outcome(self) -> str:
        """The ``sync_progress.outcome`` value: the plan's coverage (exact, partial,
        unknown) when emitted, else the result (halted, refused, failed)."""
        return self.plan.outcome if self.result == Result.EMITTED else self.result


@dataclass(frozen=True, slots=True)
class HaltRecord:
    """A subscription's sync on one partition halted (a source rewind under rewind_policy
    halt) or resumed by an operator; the newest record per key is its state."""

    key: PartitionKey
    subscription: str
    halted: bool
    reason: str
    rewound_entries: int
    at: datetime
