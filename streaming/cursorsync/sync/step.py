"""The sync step: observed source cursors -> guarded ack plans -> the emitter -> records.

A readable filter chain, per (topic partition, subscription), each skip
logged with its reason and the others going on:

1. translate the source cursor through the partition's mapping, against the
   target cursor as the target's admin API reports it (actual, not assumed; a batch's
   targets are read together, :mod:`cursorsync.sync.target_reads`); source entries the
   plan counts as unmapped are looked up (:mod:`cursorsync.sync.marker_lookups`);
2. a source that moved backwards: ``halt`` emits nothing for it from then on, until an
   operator resumes it (:mod:`cursorsync.sync.halts`); ``report`` goes on (acks
   already sent cannot be taken back either way). A source cursor that covers entries
   only because their ledgers are gone is asked about (:mod:`cursorsync.core.continuity`):
   entries it showed unacked before, or, observed for the first time, mapped entries in
   ledgers before the first one the source lists. Unless the source's ledger ids show
   them to be the same topic's (trimmed, so acked), they may be of a topic deleted and
   created again, never acked, and the subscription halts whatever the policy; if the
   source cannot say, nothing is sent this batch;
3. :func:`cursorsync.core.guard.guard`: the safety rule, or nothing is sent;
4. emit (unless dry-run);
5. record every outcome: emitted, halted, refused or failed (:class:`SyncRecord`), so the
   tables and metrics never keep showing an older, better state.

An idle cursor (its last plan passed the guard and needed nothing sent, and its source
state, mapping and target are what they were) records that plan again without the chain:
the same inputs give the same answer. Its target is read again every
IDLE_TARGET_READ_EVERY batches, and it is kept packed (:mod:`cursorsync.sync.plans`)
until something changes; the sync sink keeps idle cursors out of the step between
batches, in columns (:mod:`cursorsync.sync.idle_store`), and hands one back when its row
needs deciding.

Re-running a step for the same observations re-sends only acks that the
target does not show yet; acks are idempotent on the broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from cursorsync.core.continuity import uncovered
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.guard import (
    AnchorConflictError,
    SafePlan,
    UnsafePlanError,
    check_safe,
    guard,
)
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.packed import HeldMappings, Mappings
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, Result, RewindPolicy, SyncRecord
from cursorsync.core.retention import LiveLedgers, first_ledger, live_part
from cursorsync.core.segments import TopicMapping
from cursorsync.core.topology import Topology, holding
from cursorsync.core.translate import translate
from cursorsync.errors import AdminUnavailableError, CursorSyncError
from cursorsync.pulsar.admin import TopicCreation
from cursorsync.sync.first_plans import FirstPlans
from cursorsync.sync.marker_lookups import MarkerLookup, MarkerLookups
from cursorsync.sync.plans import IDLE_TARGET_READ_EVERY, IdleCursor, Planned, pack, read_offset

log = logging.getLogger(__name__)


class EmitterLike(Protocol):
    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None, unproven: RangeSet | None = None) -> object: ...


#: Reads the target's cursor for (concrete topic, subscription): None when unknown.
TargetReader = Callable[[str, str], CursorState | None]
#: A target read's answer: the cursor, None when unknown, or why the admin API gave none.
Target = CursorState | None | AdminUnavailableError
#: Reads the target cursors of a batch's (concrete topic, subscription) pairs together.
TargetsReader = Callable[[Sequence[tuple[str, str]]], dict[tuple[str, str], Target]]
#: The source's managed ledger of a concrete topic, with the ledger ids it owns (asked of
#: the source: :meth:`cursorsync.pulsar.admin.AdminClient.creation`).
SourceCreatedAt = Callable[[str], TopicCreation]


@dataclass(frozen=True)
class SyncConfig:
    cumulative: bool = False
    dry_run: bool = False
    rewind_policy: RewindPolicy = "halt"
    #: Snapshot evidence on: segments are trusted only as far as an anchor has checked them
    #: (:meth:`cursorsync.core.segments.TopicMapping.vouched`).
    vouch: bool = False
    #: Cursors planned for the first time per batch, at most (None: all); the others wait
    #: for the next batches, taken in turn. For a step that lives across batches.
    first_plans_per_batch: int | None = None


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


class SyncStep:
    """Holds what the loop must remember between batches: the previous source states."""

    def __init__(self, config: SyncConfig, emitter: EmitterLike | None,
                 read_target: TargetReader, lookup_markers: MarkerLookup | None = None,
                 source_created_at: SourceCreatedAt | None = None, *,
                 read_targets: TargetsReader | None = None,
                 topology: Callable[[str], Topology | None] | None = None) -> None:
        """``topology``: a topic's replication topology (None: not known); a topic not
        known to have two clusters is planned with the evidence that holds on any
        (:func:`cursorsync.core.topology.holding`). Without it, every mapping is used."""
        self.config = config
        self.topology = topology
        self.emitter = emitter
        #: How a batch reads its target cursors: together when the reader can (its
        #: requests go out concurrently), else ``read_target`` for each in turn.
        self.read_targets = read_targets or one_by_one(read_target)
        #: Without it, entries a cursor covers only because their ledgers are gone are never
        #: taken as acked.
        self.source_created_at = source_created_at
        self.previous: dict[tuple[PartitionKey, str], ObservedCursor] = {}
        #: (partition, subscription) pairs halted in the tables: nothing is emitted for them.
        self.halted_keys: set[tuple[PartitionKey, str]] = set()
        self.lookups = MarkerLookups(lookup_markers)
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
        #: Which never planned cursors wait for a later batch (first_plans_per_batch).
        self._first_plans = FirstPlans(config.first_plans_per_batch)

    def run(self, observed: Iterable[ObservedCursor],
            mappings: Mappings | Mapping[PartitionKey, TopicMapping]) -> StepResult:
        """One batch: ``mappings`` as :class:`~cursorsync.core.packed.Mappings`
        (a version per partition, the mapping built on demand), or a dict of them."""
        given = mappings if isinstance(mappings, Mappings) else self._held.adopt(mappings)
        records: list[SyncRecord] = []
        sent = refused = halted = unavailable = packed = 0
        self.anchor_conflicts = 0
        t_translate = 0.0
        resume = self.lookups.next_batch()
        latest = _latest(observed)
        deferred = self._first_plans.deferred(
            latest, lambda k: k in self._idle or k in self._plans, self.previous)
        # First what each cursor needs: an idle one nothing changed for is recorded again
        # at once; the targets the others need are read together, then they are planned.
        work: list[SyncRecord | _Pending] = []
        for obs in _rotated(latest, resume):
            k = (obs.key, obs.subscription)
            if deferred and k in deferred:
                continue
            version = given.version(obs.key)
            markers = self.lookups.markers(obs.key)
            idle = self._idle.get(k)
            if idle is not None:
                held = bool(self.halted_keys) and k in self.halted_keys
                if held or not idle.unchanged(obs.state, version, markers):
                    work.append(_Pending(obs, version, "unpack"))
                elif idle.unread + 1 < IDLE_TARGET_READ_EVERY:
                    idle.unread += 1
                    self.target_reads_skipped += 1
                    work.append(self._repeated(idle, obs))
                else:
                    work.append(_Pending(obs, version, "recheck"))  # its target is due
            else:
                known = self._plans.get(k)
                # Nothing to send last time and nothing changed since on this side: the
                # target is read again only every IDLE_TARGET_READ_EVERY batches.
                settled = known is not None and known.settled(obs.state, version, markers)
                work.append(_Pending(obs, version, "known" if settled else "read"))
        targets = self.read_targets([(p.obs.key.concrete_topic(), p.obs.subscription)
                                     for p in work if isinstance(p, _Pending)
                                     and p.how != "known"])
        for item in work:
            if isinstance(item, SyncRecord):
                records.append(item)
                continue
            obs, version = item.obs, item.version
            k = (obs.key, obs.subscription)
            topic = obs.key.concrete_topic()
            known = self._plans.get(k)
            target: Target
            if item.how == "known":
                assert known is not None
                target = known.target
                known.unread += 1
                self.target_reads_skipped += 1
            else:
                target = targets[topic, obs.subscription]
                if isinstance(target, AdminUnavailableError):
                    unavailable += 1
                    log.warning("skip %s/%s this batch: the target cursor cannot be read: %s",
                                topic, obs.subscription, target)
                    continue
                if item.how != "read":
                    idle = self._idle[k]
                    if (item.how == "recheck" and target is not None
                            and pack(target) == idle.target):
                        idle.unread = 0
                        records.append(self._repeated(idle, obs))
                        continue
                    # Something changed: unpacked for the full path.
                    del self._idle[k]
                    self.previous[k] = ObservedCursor(obs.key, obs.subscription,
                                                      idle.source_state(), idle.observed_at)
                elif known is not None:
                    known.unread = 0
            if target is None:
                log.info("skip %s/%s: the target has no such subscription yet",
                         topic, obs.subscription)
                continue
            prev = self.previous.get(k)
            previous_source = prev.state if prev is not None else None
            t0 = time.perf_counter()
            known = self._plans.get(k)
            whole = self._whole_mapping(obs.key.topic)
            if whole and known is not None and known.reusable(
                    obs.state, version, target, previous_source, self.lookups.markers(obs.key)):
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
                if not whole:
                    mapping = holding(mapping)
                mapping = self.lookups.with_markers(obs.key, mapping)
                plan = translate(obs.state, mapping, target, previous_source=previous_source)
                if plan.unmapped_acked_entries and self.lookups.look_up(obs, topic, mapping,
                                                                        target):
                    mapping = self.lookups.with_markers(obs.key, mapping)
                    plan = translate(obs.state, mapping, target, previous_source=previous_source)
                self._plans[k] = Planned(obs.state, version, target,
                                          self.lookups.markers(obs.key), mapping, plan)
            t_translate += time.perf_counter() - t0
            lost = self._lost(obs, prev, topic, mapping, target)
            if lost is None:
                unavailable += 1
                continue  # the previous observation (or none) stays, as the evidence
            self.previous[k] = obs
            if lost.entries:
                plan = replace(plan, rewound_entries=plan.rewound_entries + lost.entries)
            result, acks = self._emit(obs, topic, plan, mapping, target, lost=lost)
            planned = self._plans.get(k)
            if planned is not None:
                planned.quiet = result is Result.EMITTED and not plan.to_ack and not lost.entries
                if planned.quiet and planned.final and k not in self.halted_keys:
                    # Idle: while the plan's inputs stay what they are, the plan and the
                    # guard's answer stay the same. It is kept packed until one changes.
                    self._idle[k] = idle = IdleCursor.of(planned, obs.observed_at)
                    # Cursors that go idle together read their targets in different batches.
                    idle.unread = max(idle.unread, read_offset(k))
                    plan = idle.plan  # the same value, without what its sets derived on use
                    del self._plans[k], self.previous[k]
                    packed += 1
            refused += result is Result.REFUSED
            halted += result is Result.HALTED
            sent += acks
            if result is not Result.EMITTED:
                # Nothing was sent: the target stays where it was.
                plan = replace(plan, mark_delete=target.mark_delete,
                               individually_deleted=target.individually_deleted,
                               to_ack=RangeSet())
            records.append(SyncRecord(obs.key, obs.subscription, plan, acks, self.config.dry_run,
                                      obs.confirmed_at, datetime.now(UTC), result))
        if packed > len(self._plans):
            # Most plans went idle: dicts keep their size when emptied, so they are copied.
            self._plans, self.previous = dict(self._plans), dict(self.previous)
        return StepResult(records, sent, refused, halted, t_translate, unavailable,
                          self.anchor_conflicts, len(deferred))

    def release_idle(self) -> dict[tuple[PartitionKey, str], IdleCursor]:
        """Takes out the idle cursors that can be kept elsewhere until something changes
        for them (:mod:`cursorsync.sync.idle_store`): those not halted, of partitions
        without markers found."""
        out = {k: c for k, c in self._idle.items()
               if c.markers is None and k not in self.halted_keys}
        if out:
            self._idle = {k: c for k, c in self._idle.items() if k not in out}
        return out

    def _whole_mapping(self, topic: str) -> bool:
        """Whether all of a topic's mapping holds: no topology given, or two clusters."""
        if self.topology is None:
            return True
        found = self.topology(topic)
        return found is not None and found.two_clusters

    def adopt_idle(self, cursors: Mapping[tuple[PartitionKey, str], IdleCursor]) -> None:
        """Idle cursors handed back: :meth:`run` decides for them as for its own."""
        self._idle.update(cursors)

    def _repeated(self, idle: IdleCursor, obs: ObservedCursor) -> SyncRecord:
        """An idle cursor's record again: its plan, nothing sent."""
        idle.observed_at = obs.observed_at
        return SyncRecord(obs.key, obs.subscription, idle.plan, 0, self.config.dry_run,
                          obs.confirmed_at, datetime.now(UTC), repeated=True)

    def _lost(self, obs: ObservedCursor, prev: ObservedCursor | None, topic: str,
              mapping: TopicMapping, target: CursorState) -> _Lost | None:
        """What the cursor covers only because ledgers are gone, unless ledger ids show them
        to be its topic's (:func:`cursorsync.core.continuity.uncovered`): entries the
        previous observation showed unacked, and target copies of entries in ledgers no
        observation listed (a cursor observed for the first time, or the mapping of older
        ledgers arriving later). None when the source cannot say now."""
        previous = None if prev is None else prev.state
        found = uncovered(previous, obs.state, mapping.segments, target)
        if not found:
            return _NOTHING_LOST
        creation = self._creation(obs, topic, "it covers entries in ledgers the source no "
                                  "longer lists")
        if isinstance(creation, _Unreadable):
            return None
        if creation is not None:
            found = uncovered(previous, obs.state, mapping.segments, target,
                              creation.first_ledger)
        if found.vanished:
            return _Lost(found.vanished, (
                f"{found.vanished} entries its cursor showed unacked are in ledgers the "
                "source no longer lists, and the source topic owns no ledger as old as "
                "those it was observed with (deleted and created again, or unknown)"))
        if found.copies:
            count = max(found.copies.count_entries(target.ledgers), 1)
            return _Lost(count, (
                f"its markDeletePosition covers {count} target copies of source entries in "
                "ledgers older than any the source topic owns now and than any observation "
                "of it listed (of a topic deleted and created again, or trimmed before: "
                "unknown)"))
        return _NOTHING_LOST

    def _creation(self, obs: ObservedCursor, topic: str, what: str
                  ) -> TopicCreation | _Unreadable | None:
        """The source topic's creation (None: no way to ask), or _UNREADABLE after logging
        why this cursor waits."""
        if self.source_created_at is None:
            return None
        try:
            return self.source_created_at(topic)
        except CursorSyncError as err:
            log.warning("skip %s/%s this batch: %s, and the source topic's internal-info "
                        "cannot be read: %s", topic, obs.subscription, what, err)
            return _UNREADABLE

    def _emit(self, obs: ObservedCursor, topic: str, plan: AckPlan, mapping: TopicMapping,
              target: CursorState, *, lost: _Lost | None = None) -> tuple[Result, int]:
        """Halt, guard, send: what became of the plan, and the acks sent."""
        if (obs.key, obs.subscription) in self.halted_keys:
            log.warning("skip %s/%s: halted after a source rewind; `cursorsync resume` "
                        "clears it", topic, obs.subscription)
            return Result.HALTED, 0
        if lost is not None and lost.entries:
            log.error("skip %s/%s: %s; their copies on the target stay unacked. Halted until "
                      "an operator resumes it (resuming lets the markDeletePosition cover "
                      "those copies)", topic, obs.subscription, lost.why)
            return Result.HALTED, 0
        if plan.rewound_entries and self.config.rewind_policy == "halt":
            log.error("skip %s/%s: the source cursor moved back over %d entries; "
                      "rewind_policy=halt emits nothing until an operator resets the "
                      "target cursor too", topic, obs.subscription, plan.rewound_entries)
            return Result.HALTED, 0
        try:
            safe = guard(plan, obs.state, mapping, target)
        except AnchorConflictError as err:
            self.anchor_conflicts += 1
            log.error("skip %s/%s: %s", topic, obs.subscription, err)
            return Result.REFUSED, 0
        except UnsafePlanError as err:
            log.error("skip %s/%s: %s", topic, obs.subscription, err)
            return Result.REFUSED, 0
        if not plan.to_ack or self.config.dry_run or self.emitter is None:
            return Result.EMITTED, 0
        try:
            if self.config.cumulative:
                # What a cumulative ack would cover on the strength of the target's read alone
                # (the guard against a fresh target refuses just that): a subscription reset,
                # or deleted and created again, since the read does not hold it.
                unproven = check_safe(plan, obs.state, mapping, fresh_target(target.ledgers))
                sent = self.emitter.apply(topic, obs.subscription, safe, cumulative=True,
                                          ledgers=target.ledgers, unproven=unproven)
            else:
                sent = self.emitter.apply(topic, obs.subscription, safe, cumulative=False,
                                          ledgers=target.ledgers)
        except CursorSyncError as err:
            log.error("skip %s/%s: emission failed: %s", topic, obs.subscription, err)
            return Result.FAILED, 0
        return Result.EMITTED, int(getattr(sent, "acks_sent", 0))



#: The mapping of a partition with no rows yet.
_NO_MAPPING = TopicMapping()


@dataclass(frozen=True, slots=True)
class _Lost:
    """Entries a cursor covers that may never have been acked (see :meth:`SyncStep._lost`),
    and why, for the log."""

    entries: int
    why: str = ""


_NOTHING_LOST = _Lost(0)


class _Unreadable:
    """The source topic's internal-info could not be read."""


_UNREADABLE = _Unreadable()


@dataclass(frozen=True, slots=True)
class _Pending:
    """A cursor of this batch still to plan, once the targets are read: ``how`` its
    target is had (read: read it; known: its last plan's; recheck: an idle cursor's, due
    for a read; unpack: an idle cursor something changed for)."""

    obs: ObservedCursor
    version: int
    how: str


def one_by_one(read: TargetReader) -> TargetsReader:
    """A batch's targets read with ``read``, one after another."""
    def many(pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Target]:
        out: dict[tuple[str, str], Target] = {}
        for pair in pairs:
            try:
                out[pair] = read(*pair)
            except AdminUnavailableError as err:
                out[pair] = err
        return out

    return many


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
                                          o.observed_at, o.confirmed_at))
    return [o for o, n in zip(obs, [*obs[1:], None] if obs else [], strict=True)
            if n is None or n.key != o.key or n.subscription != o.subscription]


def fresh_target(ledgers: Ledgers | None) -> CursorState:
    """A target cursor nobody has acked on: before its first ledger."""
    if ledgers is None or not len(ledgers.ids):
        return CursorState(Position(-1, -1), RangeSet(), ledgers)
    return CursorState(Position(int(ledgers.ids[0]), -1), RangeSet(), ledgers)
