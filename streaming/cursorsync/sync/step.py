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
   only because their ledgers are gone is asked about (:mod:`cursorsync.sync.lost_entries`):
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
the same inputs give the same answer (:mod:`cursorsync.sync.kept_plans`). Its target is
read again every IDLE_TARGET_READ_EVERY batches, and it is kept packed
(:mod:`cursorsync.sync.plans`) until something changes; the sync sink keeps idle cursors
out of the step between batches, in columns (:mod:`cursorsync.sync.idle_store`), and hands
one back when its row needs deciding.

Re-running a step for the same observations re-sends only acks that the
target does not show yet; acks are idempotent on the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import NamedTuple, Protocol, runtime_checkable

from cursorsync.core.batches import PartialBatch
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
from cursorsync.core.translate import translate, with_index_acks
from cursorsync.errors import AdminUnavailableError, CursorSyncError
from cursorsync.sync.batch_moves import BatchMoves
from cursorsync.sync.batch_reads import HeldBatches
from cursorsync.sync.kept_plans import KeptPlans, Key, Work, WorkKind, in_turn, newest
from cursorsync.sync.lost_entries import Lost, LostEntries, SourceCreatedAt
from cursorsync.sync.marker_lookups import MarkerLookup, MarkerLookups, TailCheck
from cursorsync.sync.plans import IdleCursor, Planned
from cursorsync.sync.step_totals import Emitted, StepResult, Totals, mark
from cursorsync.sync.target_reads import (
    Target,
    TargetReader,
    TargetsReader,
    fresh_target,
    serial_targets_reader,
)

log = logging.getLogger(__name__)


class EmitterLike(Protocol):
    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None, unproven: RangeSet | None = None) -> object: ...


@runtime_checkable
class OpensConsumers(Protocol):
    """An emitter that opens many target consumers at once before their plans are sent."""

    def open_consumers(self, cursors: Sequence[tuple[str, str]]) -> None: ...


class BatchReadsLike(Protocol):
    def many(self, cursors: Sequence[tuple[str, str]]) -> dict[tuple[str, str], HeldBatches]:
        ...


#: The source's managed ledger of a concrete topic, with the ledger ids it owns (asked of
#: the source: :meth:`cursorsync.pulsar.admin.AdminClient.creation`).


@dataclass(frozen=True)
class StepSettings:
    cumulative: bool = False
    dry_run: bool = False
    rewind_policy: RewindPolicy = "halt"
    #: Snapshot evidence on: segments are trusted only as far as an anchor has checked them
    #: (:meth:`cursorsync.core.segments.TopicMapping.vouched`).
    vouch: bool = False
    #: Cursors planned for the first time per batch, at most (None: all); the others wait
    #: for the next batches, taken in turn. For a step that lives across batches.
    first_plans_per_batch: int | None = None


class SyncStep:
    """Holds what the loop must remember between batches: the previous source states, the
    plans kept (:class:`~cursorsync.sync.kept_plans.KeptPlans`), the markers found."""

    def __init__(self, config: StepSettings, emitter: EmitterLike | None,
                 read_target: TargetReader, lookup_markers: MarkerLookup | None = None,
                 source_created_at: SourceCreatedAt | None = None, *,
                 read_targets: TargetsReader | None = None,
                 topology: Callable[[str], Topology | None] | None = None,
                 live_ledgers: LiveLedgers | None = None,
                 batch_reads: BatchReadsLike | None = None,
                 batch_moves: BatchMoves | None = None,
                 tail_check: TailCheck | None = None,
                 lookups_in_background: bool = False) -> None:
        """``topology``: a topic's replication topology (None: not known); a topic not
        known to have two clusters is planned with the evidence that holds on any
        (:func:`cursorsync.core.topology.holding`). Without it, every mapping is used.
        ``live_ledgers``: where the first live ledgers the step reads go, for the mapping
        builder. ``batch_reads``: both clusters' partly acked batches
        (``emission.batch_index_acks``); without it no batch index is carried.
        ``batch_moves``: whose partly acked batches changed (:meth:`note_batches`).
        ``tail_check``: whether anything past a source partition's last mapped entry is
        dispatchable; without it the entries there are looked up one by one.
        ``lookups_in_background``: source lookups run beside the batches, their answers
        taken by the next (for a step that lives across batches)."""
        self.config = config
        self.batch_reads = batch_reads
        self.batch_moves = batch_moves
        self.batches_moved: frozenset[Key] = frozenset()  # this batch's (note_batches)
        #: This batch's target partial batches, by cursor (None: not known).
        self._target_batches: dict[tuple[str, str], dict[Position, PartialBatch] | None] = {}
        self.emitter = emitter
        #: How a batch reads its target cursors: together when the reader can (its
        #: requests go out concurrently), else ``read_target`` for each in turn.
        self.read_targets = read_targets or serial_targets_reader(read_target)
        #: Without it, entries a cursor covers only because their ledgers are gone are never
        #: taken as acked.
        self.lost = LostEntries(source_created_at)
        self.topology = topology
        self.live_ledgers = live_ledgers
        self.previous: dict[Key, ObservedCursor] = {}
        #: The first observation of each cursor whose first plan waits: the ledgers it
        #: listed show, at that plan, which gone ledgers were its topic's (trimmed).
        self.first_seen: dict[Key, ObservedCursor] = {}
        #: Cursors halted in the tables: nothing is emitted for them.
        self.halted_keys: set[Key] = set()
        self.lookups = MarkerLookups(lookup_markers, tail_check,
                                     in_background=lookups_in_background)
        self.kept = KeptPlans(config.first_plans_per_batch, dry_run=config.dry_run)
        #: Mappings handed over as dicts, with a version per partition.
        self._held = HeldMappings()

    def run(self, observed: Iterable[ObservedCursor],
            mappings: Mappings | Mapping[PartitionKey, TopicMapping]) -> StepResult:
        """One batch: ``mappings`` as :class:`~cursorsync.core.packed.Mappings`
        (a version per partition, the mapping built on demand), or a dict of them."""
        given = mappings if isinstance(mappings, Mappings) else self._held.adopt(mappings)
        totals = Totals()
        batch = self._sort(observed, given)
        since = mark()
        targets = self._read_targets(batch.work)
        held = self._read_batches(batch.work)
        totals.spent("targets", since)
        records: list[SyncRecord | None] = []
        to_send: list[_ToSend] = []
        for item in batch.work:
            if isinstance(item, SyncRecord):  # an idle cursor nothing changed for
                records.append(item)
                continue
            item = self._with_batches(item, held)
            target = self._target(item, targets, totals)
            if isinstance(target, SyncRecord):  # an idle cursor whose target is as it was
                records.append(target)
            if not isinstance(target, CursorState):
                continue
            obs, k = item.obs, (item.obs.key, item.obs.subscription)
            prev = self.previous.get(k)
            since = mark()
            planned = self._plan(item, target, prev, given)
            totals.spent("translate", since)
            witness = prev if prev is not None else self.first_seen.get(k)
            lost = self.lost.check(obs, witness, item.topic, planned.used, target)
            if lost is None:
                totals.unavailable += 1
                continue  # the previous observation (or none) stays, as the evidence
            self.previous[k] = obs
            self.first_seen.pop(k, None)
            plan = planned.plan
            if lost.entries:
                plan = replace(plan, rewound_entries=plan.rewound_entries + lost.entries)
            to_send.append(_ToSend(len(records), item, target, planned, plan, lost))
            records.append(None)  # the record once the plan is sent
        since = mark()
        self._open_consumers(to_send)
        totals.spent("emit", since)
        for one in to_send:
            since = mark()
            emitted = self._emit(one.item.obs, one.item.topic, one.plan, one.planned.used,
                                 one.target, lost=one.lost)
            totals.spent("emit", since)
            plan = self._settle(one.item, one.planned, one.plan, emitted, one.lost, totals)
            records[one.at] = self._record(one.item.obs, plan, one.target, emitted, totals)
        if totals.went_idle > len(self.kept.plans):
            # Most plans went idle: dicts keep their size when emptied, so they are copied.
            self.kept.plans, self.previous = dict(self.kept.plans), dict(self.previous)
        return totals.result([r for r in records if r is not None], batch.deferred)

    def note_batches(self) -> None:
        """Before a batch: the source cursors whose partly acked batches changed since the
        last (``batch_moves``), which the step plans again, idle or not."""
        self.batches_moved = (self.batch_moves.next_batch() if self.batch_moves is not None
                              else frozenset())

    def _sort(self, observed: Iterable[ObservedCursor], given: Mappings) -> _Sorted:
        """The batch's cursors (the newest observation of each), from the one the marker
        lookups' budget stopped at last: the records of idle cursors nothing changed for,
        at once, and the work of the others, but for those whose first plan waits."""
        resume = self.lookups.next_batch()
        latest = newest(observed)
        deferred = self.kept.deferred(latest, self.previous)
        for obs in latest if deferred else ():
            k = (obs.key, obs.subscription)
            if k in deferred and k not in self.previous:
                self.first_seen.setdefault(k, obs)
        work = [self.kept.sort(obs, given.version(obs.key), self.lookups.markers(obs.key),
                               self.halted_keys, self.batches_moved)
                for obs in in_turn(latest, resume)
                if not (deferred and (obs.key, obs.subscription) in deferred)]
        return _Sorted(work, len(deferred))

    def _read_targets(self, work: list[SyncRecord | Work]) -> dict[tuple[str, str], Target]:
        """The target cursors the batch's work needs, read together."""
        return self.read_targets([(w.topic, w.obs.subscription) for w in work
                                  if isinstance(w, Work) and w.kind is not WorkKind.KNOWN])

    def _read_batches(self, work: list[SyncRecord | Work]) -> dict[tuple[str, str], HeldBatches]:
        """Both clusters' partly acked batches for the batch's work, read together."""
        if self.batch_reads is None:
            return {}
        return self.batch_reads.many([(w.topic, w.obs.subscription) for w in work
                                      if isinstance(w, Work)])

    def _with_batches(self, item: Work, held: Mapping[tuple[str, str], HeldBatches]) -> Work:
        """The work with its source's partly acked batches in its source state, and its
        target's kept for the plan."""
        got = held.get((item.topic, item.obs.subscription))
        if got is None:
            return item
        self._target_batches[item.topic, item.obs.subscription] = got.target
        obs = item.obs
        return replace(item, obs=replace(obs, state=replace(obs.state, batches=got.source)))

    def _target(self, item: Work, targets: Mapping[tuple[str, str], Target], totals: Totals,
                ) -> CursorState | SyncRecord | None:
        """The cursor's target: its last plan's, or as read. An idle cursor's record again
        when its target is as it was; None when the cursor waits (logged)."""
        obs = item.obs
        k = (obs.key, obs.subscription)
        if item.kind is WorkKind.KNOWN:
            return self.kept.known_target(k)
        target = targets[item.topic, obs.subscription]
        if isinstance(target, AdminUnavailableError):
            totals.unavailable += 1
            log.warning("skip %s/%s this batch: the target cursor cannot be read: %s",
                        item.topic, obs.subscription, target)
            return None
        if item.kind is WorkKind.READ:
            self.kept.was_read(k)
        else:
            idle = self.kept.read_idle(item, target)
            if isinstance(idle, SyncRecord):
                return idle
            self.previous[k] = idle  # something changed: unpacked for the full path
        if target is None:
            log.info("skip %s/%s: the target has no such subscription yet",
                     item.topic, obs.subscription)
        return target

    def _plan(self, item: Work, target: CursorState, prev: ObservedCursor | None,
              given: Mappings) -> Planned:
        """The cursor's plan, kept: its last one while nothing it was made from changed, else
        translated anew through the live part of its partition's mapping, with the evidence
        that holds for its topic and the markers found (looked up when the plan has source
        entries unmapped)."""
        obs, version = item.obs, item.version
        k = (obs.key, obs.subscription)
        previous_source = prev.state if prev is not None else None
        whole = self._whole_mapping(obs.key.topic)
        known = self.kept.plans.get(k)
        if whole and known is not None and not obs.state.batches and known.reusable(
                obs.state, version, target, previous_source, self.lookups.markers(obs.key)):
            known.source = obs.state  # the same values: kept as the idle path finds it
            return known
        found = given.get(obs.key)
        mapping = _NO_MAPPING if found is None else found
        live = self._trimmed(obs.key, mapping, obs.state, target, given)
        if live is not None:
            mapping, version = live, given.version(obs.key)
        if self.config.vouch:
            mapping = mapping.vouched()
        if not whole:
            mapping = holding(mapping)
        else:
            self.lookups.judged(obs.key, mapping, target.ledgers, obs.state.ledgers)
        mapping = self.lookups.with_markers(obs.key, mapping)
        plan = translate(obs.state, mapping, target, previous_source=previous_source)
        if plan.unmapped_acked_entries and self.lookups.look_up(obs, item.topic, mapping,
                                                                target):
            mapping = self.lookups.with_markers(obs.key, mapping)
            plan = translate(obs.state, mapping, target, previous_source=previous_source)
        if obs.state.batches:
            plan = with_index_acks(plan, obs.state, mapping.segments, target,
                                   self._target_batches.get((item.topic, obs.subscription)))
        self.kept.plans[k] = planned = Planned(obs.state, version, target,
                                               self.lookups.markers(obs.key), mapping, plan)
        return planned

    def _trimmed(self, key: PartitionKey, mapping: TopicMapping, source: CursorState,
                 target: CursorState, given: Mappings) -> TopicMapping | None:
        """The partition's mapping without what names only deleted ledgers, which goes
        (memory follows the live ledgers); None when nothing is dead."""
        firsts = first_ledger(source.ledgers), first_ledger(target.ledgers)
        live = live_part(mapping, *firsts)
        if live is not None:
            given.trim(key, live)
            if self.live_ledgers is not None:
                # The builder's known mapping has the same rows, so the same dead part;
                # with nothing dead here, it has none to drop either.
                self.live_ledgers.saw(key, *firsts)
        return live

    def _whole_mapping(self, topic: str) -> bool:
        """Whether all of a topic's mapping holds: no topology given, or two clusters."""
        if self.topology is None:
            return True
        found = self.topology(topic)
        return found is not None and found.two_clusters

    def _settle(self, item: Work, planned: Planned, plan: AckPlan, emitted: Emitted,
                lost: Lost, totals: Totals) -> AckPlan:
        """The plan to record, after its emission: a cursor whose plan sent nothing and
        needed nothing sent goes idle (:meth:`KeptPlans.settle`), its plan kept packed."""
        obs = item.obs
        k = (obs.key, obs.subscription)
        quiet = (emitted.result is Result.EMITTED and not plan.to_ack
                 and not plan.index_acks and not lost.entries)
        idle_plan = self.kept.settle(k, planned, quiet=quiet, halted=k in self.halted_keys,
                                     observed_at=obs.observed_at)
        if idle_plan is None:
            return plan
        del self.previous[k]  # the idle cursor's packed source is its previous observation
        totals.went_idle += 1
        return idle_plan

    def _record(self, obs: ObservedCursor, plan: AckPlan, target: CursorState,
                emitted: Emitted, totals: Totals) -> SyncRecord:
        """What became of the cursor's plan, counted and recorded."""
        totals.add(emitted)
        if emitted.result is not Result.EMITTED:
            # Nothing was sent: the target stays where it was.
            plan = replace(plan, mark_delete=target.mark_delete,
                           individually_deleted=target.individually_deleted,
                           to_ack=RangeSet())
        return SyncRecord(obs.key, obs.subscription, plan, emitted.acks, self.config.dry_run,
                          obs.confirmed_at, datetime.now(UTC), emitted.result)

    def release_idle(self) -> dict[Key, IdleCursor]:
        """Takes out the idle cursors that can be kept elsewhere until something changes
        for them (:mod:`cursorsync.sync.idle_store`): those not halted, of partitions
        without markers found."""
        return self.kept.release(self.halted_keys)

    def adopt_idle(self, cursors: Mapping[Key, IdleCursor]) -> None:
        """Idle cursors handed back: :meth:`run` decides for them as for its own."""
        self.kept.adopt(cursors)

    def _open_consumers(self, to_send: Sequence[_ToSend]) -> None:
        """Open the target consumers the batch's plans are sent through, together (a
        subscribe is a round trip or two to the target's brokers, and a first batch of acks
        after a start needs one per partition). Only for plans :meth:`_emit` would send, but
        for a guard's refusal; a consumer that fails to open here is opened, or its failure
        reported, when its plan is sent."""
        if not isinstance(self.emitter, OpensConsumers) or self.config.dry_run:
            return
        wanted = [(one.item.topic, one.item.obs.subscription) for one in to_send
                  if (one.plan.to_ack or one.plan.index_acks)
                  and self._held_back(one.item.obs, one.item.topic, one.plan, one.lost) is None]
        if wanted:
            self.emitter.open_consumers(wanted)

    def _held_back(self, obs: ObservedCursor, topic: str, plan: AckPlan, lost: Lost | None
                   ) -> tuple[int, str] | None:
        """Why the plan is held back whatever the guard says (the log level and message), or
        None: a halted cursor, entries lost to deleted ledgers, a rewind under ``halt``."""
        where = f"{topic}/{obs.subscription}"
        if (obs.key, obs.subscription) in self.halted_keys:
            return logging.WARNING, (f"skip {where}: halted after a source rewind; "
                                     "`cursorsync resume` clears it")
        if lost is not None and lost.entries:
            return logging.ERROR, (f"skip {where}: {lost.why}; their copies on the target "
                                   "stay unacked. Halted until an operator resumes it "
                                   "(resuming lets the markDeletePosition cover those copies)")
        if plan.rewound_entries and self.config.rewind_policy == "halt":
            return logging.ERROR, (f"skip {where}: the source cursor moved back over "
                                   f"{plan.rewound_entries} entries; rewind_policy=halt emits "
                                   "nothing until an operator resets the target cursor too")
        return None

    def _emit(self, obs: ObservedCursor, topic: str, plan: AckPlan, mapping: TopicMapping,
              target: CursorState, *, lost: Lost | None = None) -> Emitted:
        """Halt, guard, send: what became of the plan, and the acks sent."""
        held = self._held_back(obs, topic, plan, lost)
        if held is not None:
            log.log(*held)
            return Emitted(Result.HALTED)
        try:
            safe = guard(plan, obs.state, mapping, target)
        except AnchorConflictError as err:
            log.error("skip %s/%s: %s", topic, obs.subscription, err)
            return Emitted(Result.REFUSED, anchor_conflict=True)
        except UnsafePlanError as err:
            log.error("skip %s/%s: %s", topic, obs.subscription, err)
            return Emitted(Result.REFUSED)
        if (not plan.to_ack and not plan.index_acks) or self.config.dry_run or (
                self.emitter is None):
            return Emitted(Result.EMITTED)
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
            return Emitted(Result.FAILED)
        return Emitted(Result.EMITTED, int(getattr(sent, "acks_sent", 0))
                        + int(getattr(sent, "index_acks", 0)))


#: The mapping of a partition with no rows yet.
_NO_MAPPING = TopicMapping()


class _ToSend(NamedTuple):
    """A cursor planned in a batch, its plan to send once the batch's consumers are open."""

    at: int  # where its record goes among the batch's
    item: Work
    target: CursorState
    planned: Planned
    plan: AckPlan
    lost: Lost


class _Sorted(NamedTuple):
    """A batch's cursors sorted by :meth:`SyncStep._sort`."""

    #: In the batch's order: idle cursors' records again, and the work of the others.
    work: list[SyncRecord | Work]
    #: Cursors whose first plan waits for a later batch.
    deferred: int
