"""The sync step: observed source cursors -> guarded ack plans -> the emitter -> records.

A readable filter chain, per (topic partition, subscription), each skip
logged with its reason and the others going on:

1. translate the source cursor through the partition's mapping, against the
   target cursor as the target's admin API reports it (actual, not assumed);
   Source entries the plan counts as unmapped are looked up on the source's
   admin API, once each (a few per sync at most): a marker never has a data
   counterpart (snapshot markers at a ledger's end or after the last message,
   where no segment on either side vouches for them), so it is not "waiting
   for evidence", and the plan can become exact. Entries past the last mapped
   one are only looked up once the mapping has not moved for a while: under
   traffic they are simply not mapped yet;
2. a source that moved backwards: ``halt`` emits nothing for it from then on, until an
   operator resumes it (:mod:`cursorsync.sync.halts`); ``report`` goes on (acks
   already sent cannot be taken back either way). A source cursor that covers entries
   it showed unacked only because their ledgers are gone is asked about: if the
   source topic was created after the last observation (deleted and created again),
   those entries were never acked, and the subscription halts whatever the policy;
   if the source cannot say, nothing is sent this batch;
3. :func:`cursorsync.core.guard.guard`: the safety rule, or nothing is sent;
4. emit (unless dry-run);
5. record every outcome: emitted, halted, refused or failed (:class:`SyncRecord`), so the
   tables and metrics never keep showing an older, better state.

An idle cursor (its last plan passed the guard and needed nothing sent, and its source
state, mapping and target are what they were) records that plan again without the chain:
the same inputs give the same answer. Its target is read again every
IDLE_TARGET_READ_EVERY batches, and it is kept packed (:mod:`cursorsync.sync.plans`)
until something changes.

Re-running a step for the same observations re-sends only acks that the
target does not show yet; acks are idempotent on the broker.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

import numpy as np

from cursorsync.core.continuity import count_vanished, vanished_unacked
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.guard import AnchorConflictError, SafePlan, UnsafePlanError, guard
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.mapping import Runs, TopicMapping
from cursorsync.core.mapping_retention import LiveLedgers, first_ledger, live_part
from cursorsync.core.packed_mappings import HeldMappings, Mappings
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, Result, RewindPolicy, SyncRecord
from cursorsync.core.translate import translate, unmapped_source
from cursorsync.errors import AdminUnavailableError, CursorSyncError
from cursorsync.sync.first_plans import FirstPlans
from cursorsync.sync.plans import IDLE_TARGET_READ_EVERY, IdleCursor, Planned, pack, read_offset

log = logging.getLogger(__name__)



class EmitterLike(Protocol):
    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None) -> object: ...


#: Reads the target's cursor for (concrete topic, subscription): None when unknown.
TargetReader = Callable[[str, str], CursorState | None]
#: Which of these source entries of a concrete topic are markers (asked of the source).
MarkerLookup = Callable[[str, list[Position]], list[Position]]
#: When the source's managed ledger was created, for a concrete topic (asked of the source).
SourceCreatedAt = Callable[[str], datetime]
#: A source topic created later than this before the last observation of its cursor is
#: taken as created after it: the broker's and this host's clocks may differ by as much.
CLOCK_SKEW = timedelta(seconds=60)
#: Source entries looked up per (topic partition, subscription) and sync, at most.
MARKER_LOOKUPS_PER_SYNC = 64
#: Source entries looked up per sync batch over all cursors, at most: a lookup only keeps
#: markers out of the unmapped count (no ack depends on it), so a batch never waits on
#: thousands of them. Cursors left without budget go first in the next batch.
MARKER_LOOKUPS_PER_BATCH = 512
#: Unmapped entries past the last mapped one looked up per cursor and sync, in order. The
#: markers a broker writes after a partition's last message are a few; a lookup there
#: that finds a message means the mapping is behind, and nothing past that last mapped
#: entry is looked up again until it moves.
MARKER_TAIL_LOOKUPS = 8
#: Unmapped entries past the last mapped one are looked up once the mapping of their
#: partition has not moved for this long: as this step saw it, or by the newest row of
#: the mapping (a step that just started, as an executor's may be, has seen nothing).
MARKER_LOOKUP_SETTLE_S = 5.0


@dataclass
class MarkerCache:
    """What the source's admin API said, per topic partition: entries that are markers,
    every entry looked up, the last mapped source entry with when it was first seen, and
    the last mapped entries past which a lookup found a message (the mapping is behind)."""

    markers: dict[PartitionKey, RangeSet] = field(default_factory=dict)
    looked_up: dict[PartitionKey, RangeSet] = field(default_factory=dict)
    frontiers: dict[PartitionKey, tuple[Position, float]] = field(default_factory=dict)
    behind: dict[PartitionKey, Position] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncConfig:
    cumulative: bool = False
    dry_run: bool = False
    rewind_policy: RewindPolicy = "halt"
    #: Snapshot evidence on: segments are trusted only as far as an anchor has checked them
    #: (:meth:`cursorsync.core.mapping.TopicMapping.vouched`).
    vouch: bool = False
    #: Cursors planned for the first time per batch, at most (None: all); the others wait
    #: for the next batches, taken in turn. For a step that lives across batches.
    first_plans_per_batch: int | None = None


@dataclass
class StepResult:
    records: list[SyncRecord]
    acks_sent: int
    refused: int
    halted: int
    translate_seconds: float
    #: Subscriptions skipped because the target's admin API gave no usable answer.
    unavailable: int = 0
    #: Plans refused because the mapping contradicts the source's snapshot anchors.
    anchor_conflicts: int = 0
    #: Cursors not planned yet, left for the next batches (first_plans_per_batch).
    deferred: int = 0


class SyncStep:
    """Holds what the loop must remember between batches: the previous source states."""

    def __init__(self, config: SyncConfig, emitter: EmitterLike | None,
                 read_target: TargetReader, lookup_markers: MarkerLookup | None = None,
                 source_created_at: SourceCreatedAt | None = None) -> None:
        self.config = config
        self.emitter = emitter
        self.read_target = read_target
        self.lookup_markers = lookup_markers
        #: Without it, entries that vanished unacked are never taken as acked.
        self.source_created_at = source_created_at
        self.previous: dict[tuple[PartitionKey, str], ObservedCursor] = {}
        #: (partition, subscription) pairs halted in the tables: nothing is emitted for them.
        self.halted: set[tuple[PartitionKey, str]] = set()
        self.markers = MarkerCache()
        #: The last plan per (partition, subscription) with what it was made from: an idle
        #: cursor (same source, same mapping version, same target) reuses it untranslated.
        self._plans: dict[tuple[PartitionKey, str], Planned] = {}
        #: Idle cursors, packed (:mod:`cursorsync.sync.plans`); their previous observation
        #: is the packed source, so they are not in ``previous``.
        self._idle: dict[tuple[PartitionKey, str], IdleCursor] = {}
        #: Where the first live ledgers the step reads go, for the mapping builder.
        self.live_ledgers: LiveLedgers | None = None
        #: Mappings handed over as dicts, with a version per partition.
        self._held = HeldMappings()
        #: Plans of the last run refused for contradicting snapshot anchors.
        self.anchor_conflicts = 0
        #: Target reads skipped for idle cursors since start (IDLE_TARGET_READ_EVERY).
        self.target_reads_skipped = 0
        self.clock = time.monotonic
        self.wall_clock = time.time
        #: Source entries looked up in this batch.
        self.lookups = 0
        #: The first cursor a batch had no lookup budget left for: the next batch starts there.
        self._lookups_resume: tuple[PartitionKey, str] | None = None
        #: Which never planned cursors wait for a later batch (first_plans_per_batch).
        self._first_plans = FirstPlans(config.first_plans_per_batch)

    def run(self, observed: Iterable[ObservedCursor],
            mappings: Mappings | Mapping[PartitionKey, TopicMapping]) -> StepResult:
        """One batch: ``mappings`` as :class:`~cursorsync.core.packed_mappings.Mappings`
        (a version per partition, the mapping built on demand), or a dict of them."""
        given = mappings if isinstance(mappings, Mappings) else self._held.adopt(mappings)
        records: list[SyncRecord] = []
        sent = refused = halted = unavailable = packed = 0
        self.anchor_conflicts = 0
        self.lookups = 0
        t_translate = 0.0
        resume, self._lookups_resume = self._lookups_resume, None
        latest = _latest(observed)
        deferred = self._first_plans.deferred(
            latest, lambda k: k in self._idle or k in self._plans, self.previous)
        for obs in _rotated(latest, resume):
            k = (obs.key, obs.subscription)
            if deferred and k in deferred:
                continue
            topic = obs.key.concrete_topic()
            version = given.version(obs.key)
            markers = self.markers.markers.get(obs.key) if self.markers.markers else None
            known = self._plans.get(k)
            target: CursorState | None
            try:
                idle = self._idle.get(k)
                if idle is not None:
                    again = self._idle_again(k, idle, obs, topic, version, markers)
                    if isinstance(again, SyncRecord):
                        records.append(again)
                        continue
                    target = again if again is not None else self.read_target(
                        topic, obs.subscription)
                elif known is not None and known.settled(obs.state, version, markers):
                    # Nothing to send last time and nothing changed since on this side:
                    # the target is read again only every IDLE_TARGET_READ_EVERY batches.
                    target = known.target
                    known.unread += 1
                    self.target_reads_skipped += 1
                else:
                    target = self.read_target(topic, obs.subscription)
                    if known is not None:
                        known.unread = 0
            except AdminUnavailableError as err:
                unavailable += 1
                log.warning("skip %s/%s this batch: the target cursor cannot be read: %s",
                            topic, obs.subscription, err)
                continue
            if target is None:
                log.info("skip %s/%s: the target has no such subscription yet",
                         topic, obs.subscription)
                continue
            prev = self.previous.get(k)
            lost = self._lost(obs, prev, topic)
            if lost is None:
                unavailable += 1
                continue  # the previous observation stays, as the evidence
            previous_source = prev.state if prev is not None else None
            t0 = time.perf_counter()
            known = self._plans.get(k)
            if known is not None and known.reusable(obs.state, version, target, previous_source,
                                                    self.markers.markers.get(obs.key)):
                plan, mapping = known.plan, known.used
                known.source = obs.state  # the same values: kept as the idle path finds it
            else:
                found = given.get(obs.key)
                mapping = _NO_MAPPING if found is None else found
                firsts = first_ledger(obs.state.ledgers), first_ledger(target.ledgers)
                live = live_part(mapping, *firsts)
                if live is not None:
                    # What names only deleted ledgers goes: memory follows the live ledgers.
                    given.trim(obs.key, live)
                    mapping, version = live, given.version(obs.key)
                    if self.live_ledgers is not None:
                        # The builder's known mapping has the same rows, so the same dead
                        # part; with nothing dead here, it has none to drop either.
                        self.live_ledgers.saw(obs.key, *firsts)
                if self.config.vouch:
                    mapping = mapping.vouched()
                mapping = self._with_markers(obs.key, mapping)
                plan = translate(obs.state, mapping, target, previous_source=previous_source)
                if plan.unmapped_acked_entries and self._look_up(obs, topic, mapping, target):
                    mapping = self._with_markers(obs.key, mapping)
                    plan = translate(obs.state, mapping, target, previous_source=previous_source)
                self._plans[k] = Planned(obs.state, version, target,
                                          self.markers.markers.get(obs.key), mapping, plan)
            t_translate += time.perf_counter() - t0
            self.previous[k] = obs
            if lost:
                plan = replace(plan, rewound_entries=plan.rewound_entries + lost)
            result, acks = self._emit(obs, topic, plan, mapping, target, lost=lost)
            planned = self._plans.get(k)
            if planned is not None:
                planned.quiet = result == "emitted" and not plan.to_ack and not lost
                if planned.quiet and planned.final and k not in self.halted:
                    # Idle: while the plan's inputs stay what they are, the plan and the
                    # guard's answer stay the same. It is kept packed until one changes.
                    self._idle[k] = idle = IdleCursor.of(planned, obs.observed_at)
                    # Cursors that go idle together read their targets in different batches.
                    idle.unread = max(idle.unread, read_offset(k))
                    plan = idle.plan  # the same value, without what its sets derived on use
                    del self._plans[k], self.previous[k]
                    packed += 1
            refused += result == "refused"
            halted += result == "halted"
            sent += acks
            if result != "emitted":
                # Nothing was sent: the target stays where it was.
                plan = replace(plan, mark_delete=target.mark_delete,
                               individually_deleted=target.individually_deleted,
                               to_ack=RangeSet())
            records.append(SyncRecord(obs.key, obs.subscription, plan, acks, self.config.dry_run,
                                      obs.observed_at, datetime.now(UTC), result))
        if packed > len(self._plans):
            # Most plans went idle: dicts keep their size when emptied, so they are copied.
            self._plans, self.previous = dict(self._plans), dict(self.previous)
        return StepResult(records, sent, refused, halted, t_translate, unavailable,
                          self.anchor_conflicts, len(deferred))

    def _idle_again(self, k: tuple[PartitionKey, str], idle: IdleCursor, obs: ObservedCursor,
                    topic: str, version: int, markers: RangeSet | None,
                    ) -> SyncRecord | CursorState | None:
        """An idle cursor's record for this batch while nothing changed (its target read
        every IDLE_TARGET_READ_EVERY batches). Else it is unpacked for the full path, and
        the target, if read here, is returned."""
        target = None
        if not (self.halted and k in self.halted) and idle.unchanged(obs.state, version,
                                                                       markers):
            still = idle.unread + 1 < IDLE_TARGET_READ_EVERY
            if still:
                idle.unread += 1
                self.target_reads_skipped += 1
            else:
                target = self.read_target(topic, obs.subscription)
                still = target is not None and pack(target) == idle.target
                if still:
                    idle.unread = 0
            if still:
                idle.observed_at = obs.observed_at
                return SyncRecord(obs.key, obs.subscription, idle.plan, 0, self.config.dry_run,
                                  obs.observed_at, datetime.now(UTC), repeated=True)
        del self._idle[k]
        self.previous[k] = ObservedCursor(obs.key, obs.subscription, idle.source_state(),
                                          idle.observed_at)
        return target

    def _lost(self, obs: ObservedCursor, prev: ObservedCursor | None, topic: str) -> int | None:
        """How many entries the previous observation showed unacked went with a source topic
        deleted and created since (0: none, or they went by trimming); None when the source
        cannot say now."""
        if prev is None:
            return 0
        gone = vanished_unacked(prev.state, obs.state)
        if not gone:
            return 0
        count = max(count_vanished(prev.state, gone), 1)
        if self.source_created_at is None:
            return count
        try:
            created = self.source_created_at(topic)
        except CursorSyncError as err:
            log.warning("skip %s/%s this batch: %d entries it showed unacked are in ledgers "
                        "now gone, and when the source topic was created cannot be read: %s",
                        topic, obs.subscription, count, err)
            return None
        return count if created > prev.observed_at - CLOCK_SKEW else 0

    def _emit(self, obs: ObservedCursor, topic: str, plan: AckPlan, mapping: TopicMapping,
              target: CursorState, *, lost: int = 0) -> tuple[Result, int]:
        """Halt, guard, send: what became of the plan, and the acks sent."""
        if (obs.key, obs.subscription) in self.halted:
            log.warning("skip %s/%s: halted after a source rewind; `cursorsync resume` "
                        "clears it", topic, obs.subscription)
            return "halted", 0
        if lost:
            log.error("skip %s/%s: the source topic was deleted and created again since the "
                      "last sync; %d entries its cursor showed unacked went with it, and their "
                      "copies on the target must stay unacked. Halted until an operator "
                      "resumes it (resuming lets the new cursor's markDeletePosition cover "
                      "those copies)", topic, obs.subscription, lost)
            return "halted", 0
        if plan.rewound_entries and self.config.rewind_policy == "halt":
            log.error("skip %s/%s: the source cursor moved back over %d entries; "
                      "rewind_policy=halt emits nothing until an operator resets the "
                      "target cursor too", topic, obs.subscription, plan.rewound_entries)
            return "halted", 0
        try:
            safe = guard(plan, obs.state, mapping, target)
        except AnchorConflictError as err:
            self.anchor_conflicts += 1
            log.error("skip %s/%s: %s", topic, obs.subscription, err)
            return "refused", 0
        except UnsafePlanError as err:
            log.error("skip %s/%s: %s", topic, obs.subscription, err)
            return "refused", 0
        if not plan.to_ack or self.config.dry_run or self.emitter is None:
            return "emitted", 0
        try:
            sent = self.emitter.apply(topic, obs.subscription, safe,
                                      cumulative=self.config.cumulative, ledgers=target.ledgers)
        except CursorSyncError as err:
            log.error("skip %s/%s: emission failed: %s", topic, obs.subscription, err)
            return "failed", 0
        return "emitted", int(getattr(sent, "acks_sent", 0))

    def _with_markers(self, key: PartitionKey, mapping: TopicMapping) -> TopicMapping:
        found = self.markers.markers.get(key)
        if found is None or not found:
            return mapping
        b = found.bounds
        runs = Runs(np.stack([b[:, 0], b[:, 1] + 1, b[:, 3] - b[:, 1]], axis=1))
        return replace(mapping, unreplicated=mapping.unreplicated.union(runs))

    def _look_up(self, obs: ObservedCursor, topic: str, mapping: TopicMapping,
                 target: CursorState) -> bool:
        """Look up the plan's unmapped source entries not looked up before; True when some
        turned out to be markers."""
        if self.lookup_markers is None or not len(mapping.segments):
            return False
        cache = self.markers
        seen = cache.looked_up.get(obs.key, RangeSet())
        pending = unmapped_source(obs.state, mapping, target.ledgers) - seen
        last = mapping.segments.rows[-1]
        frontier = Position(int(last[0]), int(last[1] + last[4] - 1))
        now = self.clock()
        known = cache.frontiers.get(obs.key)
        if known is None or known[0] != frontier:
            cache.frontiers[obs.key] = known = (frontier, now)
        ledgers = obs.state.ledgers
        if ledgers is None or not pending:
            return False
        settled = now - known[1] >= MARKER_LOOKUP_SETTLE_S or (
            mapping.written_at is not None
            and self.wall_clock() - mapping.written_at >= MARKER_LOOKUP_SETTLE_S)
        past = pending.after(frontier)
        budget = min(MARKER_LOOKUPS_PER_SYNC, MARKER_LOOKUPS_PER_BATCH - self.lookups)
        if budget <= 0:
            if self._lookups_resume is None:
                self._lookups_resume = (obs.key, obs.subscription)
            return False
        positions = list(itertools.islice((pending - past).iter_entries(ledgers), budget))
        if len(positions) == budget < MARKER_LOOKUPS_PER_SYNC and self._lookups_resume is None:
            self._lookups_resume = (obs.key, obs.subscription)  # cut short by the budget
        tail: list[Position] = []
        if settled and cache.behind.get(obs.key) != frontier:
            tail = list(itertools.islice(past.iter_entries(ledgers),
                                         min(MARKER_TAIL_LOOKUPS, budget - len(positions))))
        if not positions and not tail:
            return False
        asked = positions + tail
        self.lookups += len(asked)
        try:
            markers = self.lookup_markers(topic, asked)
        except CursorSyncError as err:
            log.warning("%s: cannot look up unmapped source entries (%s); they stay unmapped",
                        topic, err)
            return False
        cache.looked_up[obs.key] = seen | _entries(asked)
        if not set(tail) <= set(markers):
            cache.behind[obs.key] = frontier  # a message past it: the mapping is behind
        if not markers:
            return False
        cache.markers[obs.key] = cache.markers.get(obs.key, RangeSet()) | _entries(markers)
        log.debug("%s: %d of %d unmapped source entries are markers", topic, len(markers),
                  len(asked))
        return True


#: The mapping of a partition with no rows yet.
_NO_MAPPING = TopicMapping()


def _entries(positions: list[Position]) -> RangeSet:
    return RangeSet.entries(np.array([p.ledger for p in positions], np.int64),
                            np.array([p.entry for p in positions], np.int64),
                            np.ones(len(positions), np.int64))


def _rotated(observed: list[ObservedCursor],
             first: tuple[PartitionKey, str] | None) -> list[ObservedCursor]:
    """``observed`` (sorted) starting at ``first``, or at the next one after it."""
    if first is None:
        return observed
    i = next((i for i, o in enumerate(observed) if (o.key, o.subscription) >= first), 0)
    return observed[i:] + observed[:i]


def _latest(observed: Iterable[ObservedCursor]) -> list[ObservedCursor]:
    """The newest observation per (partition, subscription): older ones are superseded."""
    # Sorted on plain tuples (comparing the dataclass keys costs ten times as much), newest
    # last within a key; then the last of each run of equal keys.
    obs = sorted(observed, key=lambda o: (o.key.topic, o.key.partition, o.subscription,
                                          o.observed_at))
    return [o for o, n in zip(obs, [*obs[1:], None] if obs else [], strict=True)
            if n is None or n.key != o.key or n.subscription != o.subscription]


def fresh_target(ledgers: Ledgers | None) -> CursorState:
    """A target cursor nobody has acked on: before its first ledger."""
    if ledgers is None or not len(ledgers.ids):
        return CursorState(Position(-1, -1), RangeSet(), ledgers)
    return CursorState(Position(int(ledgers.ids[0]), -1), RangeSet(), ledgers)
