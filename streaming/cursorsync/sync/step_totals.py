"""What a sync step's batch did: its records and counts (:class:`StepResult`), added up
cursor by cursor as the step sends their plans (:class:`Totals`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from cursorsync.core.records import Result, SyncRecord


@dataclass
class StepResult:
    records: list[SyncRecord]
    acks_sent: int
    refused: int
    halted_count: int
    translate_seconds: float
    #: Subscriptions skipped because the target's admin API gave no usable answer.
    unavailable: int = 0
    #: Plans refused because the mapping contradicts the source's snapshot anchors.
    anchor_conflicts: int = 0
    #: Cursors not planned yet, left for the next batches (first_plans_per_batch).
    deferred: int = 0
    #: Seconds reading the batch's target cursors, and handing plans to the emitter.
    target_read_seconds: float = 0.0
    emit_seconds: float = 0.0
    #: Of the seconds reading targets, translating and emitting, those the step's thread
    #: spent on a core (the rest it waited: brokers, threads, a core, the interpreter).
    cpu_seconds: dict[str, float] = field(default_factory=dict)


class Emitted(NamedTuple):
    """What became of a plan at :meth:`cursorsync.sync.step.SyncStep._emit`, and the acks sent."""

    result: Result
    acks: int = 0
    #: Refused for contradicting the source's snapshot anchors.
    anchor_conflict: bool = False


#: The parts of a step whose time is counted.
PARTS: tuple[str, ...] = ("targets", "translate", "emit")


@dataclass(slots=True)
class Totals:
    """A batch's counts, as its cursors go through the step."""

    acks_sent: int = 0
    refused: int = 0
    halted_count: int = 0
    #: Per part of the step (``targets``, ``translate``, ``emit``): its seconds, and of
    #: them those the step's thread spent on a core.
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    unavailable: int = 0
    anchor_conflicts: int = 0
    #: Plans that went idle in the batch.
    went_idle: int = 0

    def add(self, emitted: Emitted) -> None:
        self.acks_sent += emitted.acks
        self.refused += emitted.result is Result.REFUSED
        self.halted_count += emitted.result is Result.HALTED
        self.anchor_conflicts += emitted.anchor_conflict

    def spent(self, part: str, since: tuple[float, float]) -> None:
        """Adds the time since ``since`` (a :func:`mark`) to ``part``."""
        now, cpu = mark()
        self.seconds[part] += now - since[0]
        self.cpu[part] += cpu - since[1]

    def result(self, records: list[SyncRecord], deferred: int) -> StepResult:
        return StepResult(records, self.acks_sent, self.refused, self.halted_count,
                          self.seconds["translate"], self.unavailable, self.anchor_conflicts,
                          deferred, self.seconds["targets"], self.seconds["emit"],
                          dict(self.cpu))


def mark() -> tuple[float, float]:
    """Now on the wall clock and on the calling thread's CPU clock."""
    return time.perf_counter(), time.thread_time()
