"""The sync step: observed source cursors -> guarded ack plans -> the emitter -> records.

A readable filter chain, per (topic partition, subscription), each skip
logged with its reason and the others going on:

1. translate the source cursor through the partition's mapping, against the
   target cursor as the target's admin API reports it (actual, not assumed);
2. a source that moved backwards: ``halt`` emits nothing for it, ``report``
   goes on (acks already sent cannot be taken back either way);
3. :func:`cursorsync.translate.guard`: the safety rule, or nothing is sent;
4. emit (unless dry-run), and record what was planned and sent.

Re-running a step for the same observations re-sends only acks that the
target does not show yet; acks are idempotent on the broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from cursorsync.errors import CursorSyncError
from cursorsync.mapping import TopicMapping
from cursorsync.positions import Position
from cursorsync.ranges import Ledgers, RangeSet
from cursorsync.tables.rows import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.translate import CursorState, SafePlan, UnsafePlanError, guard, translate

log = logging.getLogger(__name__)

RewindPolicy = Literal["halt", "report"]


class EmitterLike(Protocol):
    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None) -> object: ...


#: Reads the target's cursor for (concrete topic, subscription): None when unknown.
TargetReader = Callable[[str, str], CursorState | None]


@dataclass(frozen=True)
class SyncConfig:
    cumulative: bool = False
    dry_run: bool = False
    rewind_policy: RewindPolicy = "halt"


@dataclass
class StepResult:
    records: list[SyncRecord]
    acks_sent: int
    refused: int
    halted: int
    translate_seconds: float


class SyncStep:
    """Holds what the loop must remember between batches: the previous source states."""

    def __init__(self, config: SyncConfig, emitter: EmitterLike | None,
                 read_target: TargetReader) -> None:
        self.config = config
        self.emitter = emitter
        self.read_target = read_target
        self.previous: dict[tuple[PartitionKey, str], CursorState] = {}

    def run(self, observed: Iterable[ObservedCursor],
            mappings: dict[PartitionKey, TopicMapping]) -> StepResult:
        records: list[SyncRecord] = []
        sent = refused = halted = 0
        t_translate = 0.0
        for obs in _latest(observed):
            k = (obs.key, obs.subscription)
            topic = obs.key.concrete_topic()
            mapping = mappings.get(obs.key, TopicMapping())
            target = self.read_target(topic, obs.subscription)
            if target is None:
                log.info("skip %s/%s: the target has no such subscription yet",
                         topic, obs.subscription)
                continue
            t0 = time.perf_counter()
            plan = translate(obs.state, mapping, target, previous_source=self.previous.get(k))
            t_translate += time.perf_counter() - t0
            self.previous[k] = obs.state
            acks = 0
            if plan.rewound_entries and self.config.rewind_policy == "halt":
                halted += 1
                log.error("skip %s/%s: the source cursor moved back over %d entries; "
                          "rewind_policy=halt emits nothing until an operator resets the "
                          "target cursor too", topic, obs.subscription, plan.rewound_entries)
            else:
                try:
                    safe = guard(plan, obs.state, mapping, target)
                except UnsafePlanError as err:
                    refused += 1
                    log.error("skip %s/%s: %s", topic, obs.subscription, err)
                    continue
                if plan.to_ack and not self.config.dry_run and self.emitter is not None:
                    try:
                        result = self.emitter.apply(topic, obs.subscription, safe,
                                                    cumulative=self.config.cumulative,
                                                    ledgers=target.ledgers)
                    except CursorSyncError as err:
                        log.error("skip %s/%s: emission failed: %s", topic, obs.subscription,
                                  err)
                        continue
                    acks = int(getattr(result, "acks_sent", 0))
            sent += acks
            records.append(SyncRecord(obs.key, obs.subscription, plan, acks, self.config.dry_run,
                                      obs.observed_at, datetime.now(UTC)))
        return StepResult(records, sent, refused, halted, t_translate)


def _latest(observed: Iterable[ObservedCursor]) -> list[ObservedCursor]:
    """The newest observation per (partition, subscription): older ones are superseded."""
    best: dict[tuple[PartitionKey, str], ObservedCursor] = {}
    for o in observed:
        k = (o.key, o.subscription)
        if k not in best or o.observed_at >= best[k].observed_at:
            best[k] = o
    return [best[k] for k in sorted(best)]


def fresh_target(ledgers: Ledgers | None) -> CursorState:
    """A target cursor nobody has acked on: before its first ledger."""
    if ledgers is None or not len(ledgers.ids):
        return CursorState(Position(-1, -1), RangeSet(), ledgers)
    return CursorState(Position(int(ledgers.ids[0]), -1), RangeSet(), ledgers)
