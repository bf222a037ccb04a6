"""The plans the sync step keeps between batches, and what each cursor of a batch needs
because of them.

A plan is a pure function of its inputs (the source cursor, the mapping's version, the
markers found, the target cursor), so a cursor whose inputs did not change needs no new
one. The step keeps each moving cursor's last plan in full
(:class:`~cursorsync.sync.plans.Planned`) and each idle cursor's packed
(:class:`~cursorsync.sync.plans.IdleCursor`). Before a batch is planned, each of its
cursors is sorted by what it needs (:class:`WorkKind`): an idle cursor nothing changed for
is recorded again at once; the others wait for their targets, read together, and then go
the step's whole way. A cursor never planned yet waits for a later batch while more of
them than ``first_plans_per_batch`` have no plan (:mod:`cursorsync.sync.first_plans`).

None of this changes what is acknowledged: it only spares the translation, the guard and
the target reads whose answers are known already.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.sync.first_plans import FirstPlans
from cursorsync.sync.plans import (
    IDLE_TARGET_READ_EVERY,
    IdleCursor,
    Planned,
    encode_state,
    read_offset,
)

#: A cursor: (topic partition, subscription).
Key = tuple[PartitionKey, str]


class WorkKind(StrEnum):
    """How a cursor of a batch still to plan has its target."""

    #: Read it: the cursor moved, or its last plan sent something, or its target is due.
    READ = "read"
    #: Its last plan's: nothing changed on the source's side, and the target is not due.
    KNOWN = "known"
    #: An idle cursor's target is due: read it, and record the idle plan again if the
    #: target is what it was.
    RECHECK = "recheck"
    #: An idle cursor something changed for: read it, and take the cursor out of the idle.
    UNPACK = "unpack"


@dataclass(frozen=True, slots=True)
class Work:
    """A cursor of this batch still to plan once the targets are read."""

    obs: ObservedCursor
    #: The version of its partition's mapping when the batch was sorted.
    version: int
    kind: WorkKind
    #: The concrete topic the admin API and the emitter address.
    topic: str


class KeptPlans:
    """Each moving cursor's last plan and each idle cursor's, kept from batch to batch;
    the turn of the cursors never planned yet."""

    def __init__(self, first_plans_per_batch: int | None, *, dry_run: bool) -> None:
        #: The last plan per cursor with what it was made from: a cursor whose inputs are
        #: the same (source, mapping version, target) reuses it untranslated.
        self.plans: dict[Key, Planned] = {}
        #: Idle cursors, packed; their previous observation is the packed source, so the
        #: step's ``previous`` has none of them.
        self.idle: dict[Key, IdleCursor] = {}
        #: Target reads skipped for idle cursors since start (IDLE_TARGET_READ_EVERY).
        self.target_reads_skipped = 0
        self._first_plans = FirstPlans(first_plans_per_batch)
        self._dry_run = dry_run

    def deferred(self, latest: list[ObservedCursor],
                 previous: Mapping[Key, ObservedCursor]) -> set[Key]:
        """The cursors of ``latest`` (sorted, one observation each) never planned yet that
        wait for a later batch (first_plans_per_batch)."""
        return self._first_plans.deferred(
            latest, lambda k: k in self.idle or k in self.plans, previous)

    def sort(self, obs: ObservedCursor, version: int, markers: RangeSet | None,
             halted: set[Key], batches_moved: frozenset[Key] = frozenset(),
             ) -> SyncRecord | Work:
        """What a cursor of the batch needs (``version``: its mapping's, ``markers``: its
        partition's markers found, ``batches_moved``: cursors whose partly acked batches
        changed on the source): an idle cursor's record again when nothing changed for it
        and its target is not due, else the work to do once targets are read."""
        k = (obs.key, obs.subscription)
        idle = self.idle.get(k)
        if idle is not None:
            if ((halted and k in halted) or (batches_moved and k in batches_moved)
                    or not idle.unchanged(obs.state, version, markers)):
                kind = WorkKind.UNPACK
            elif idle.unread + 1 < IDLE_TARGET_READ_EVERY:
                idle.unread += 1
                self.target_reads_skipped += 1
                return self.repeated(idle, obs)
            else:
                kind = WorkKind.RECHECK  # its target is due
        else:
            known = self.plans.get(k)
            # Nothing to send last time and nothing changed since on this side: the target
            # is read again only every IDLE_TARGET_READ_EVERY batches.
            settled = known is not None and known.settled(obs.state, version, markers)
            kind = WorkKind.KNOWN if settled else WorkKind.READ
        return Work(obs, version, kind, obs.key.concrete_topic())

    def known_target(self, k: Key) -> CursorState:
        """The target of a cursor whose work is KNOWN: its last plan's, a read skipped."""
        known = self.plans[k]
        known.unread += 1
        self.target_reads_skipped += 1
        return known.target

    def was_read(self, k: Key) -> None:
        """The target of a cursor whose work is READ was read."""
        known = self.plans.get(k)
        if known is not None:
            known.unread = 0

    def read_idle(self, item: Work, target: CursorState | None) -> SyncRecord | ObservedCursor:
        """An idle cursor's target as read (RECHECK, UNPACK): the idle plan's record again
        when nothing changed after all, else the cursor leaves the idle ones, and its
        previous observation (the packed source) is returned for the full path."""
        obs = item.obs
        k = (obs.key, obs.subscription)
        idle = self.idle[k]
        if (item.kind is WorkKind.RECHECK and target is not None
                and encode_state(target) == idle.target):
            idle.unread = 0
            return self.repeated(idle, obs)
        del self.idle[k]
        return ObservedCursor(obs.key, obs.subscription, idle.source_state(), idle.observed_at)

    def settle(self, k: Key, planned: Planned, *, quiet: bool, halted: bool,
               observed_at: datetime) -> AckPlan | None:
        """After the plan's emission: ``quiet``, it sent nothing and needed nothing sent.
        Returns the plan to record when the cursor goes idle: while the plan's inputs stay
        what they are, the plan and the guard's answer stay the same, so it is kept packed
        until one changes."""
        planned.quiet = quiet
        if not (quiet and planned.final and not halted):
            return None
        self.idle[k] = idle = IdleCursor.of(planned, observed_at)
        # Cursors that go idle together read their targets in different batches.
        idle.unread = max(idle.unread, read_offset(k))
        del self.plans[k]
        return idle.plan  # the same value, without what its sets derived on use

    def repeated(self, idle: IdleCursor, obs: ObservedCursor) -> SyncRecord:
        """An idle cursor's record again: its plan, nothing sent."""
        idle.observed_at = obs.observed_at
        return SyncRecord(obs.key, obs.subscription, idle.plan, 0, self._dry_run,
                          obs.confirmed_at, datetime.now(UTC), repeated=True)

    def release(self, halted: set[Key]) -> dict[Key, IdleCursor]:
        """Takes out the idle cursors that can be kept elsewhere until something changes
        for them (:mod:`cursorsync.sync.idle_store`): those not ``halted``, of partitions
        without markers found."""
        out = {k: c for k, c in self.idle.items() if c.markers is None and k not in halted}
        if out:
            self.idle = {k: c for k, c in self.idle.items() if k not in out}
        return out

    def adopt(self, cursors: Mapping[Key, IdleCursor]) -> None:
        """Idle cursors handed back: sorted in the next batch as the ones kept here."""
        self.idle.update(cursors)


def in_turn(observed: list[ObservedCursor], first: Key | None) -> list[ObservedCursor]:
    """``observed`` (sorted) starting at ``first``, or at the next one after it."""
    if first is None:
        return observed
    i = next((i for i, o in enumerate(observed) if (o.key, o.subscription) >= first), 0)
    return observed[i:] + observed[:i]


def newest(observed: Iterable[ObservedCursor]) -> list[ObservedCursor]:
    """The newest observation per (partition, subscription): older ones are superseded."""
    # Sorted on plain tuples (comparing the dataclass keys costs ten times as much), newest
    # last within a key; then the last of each run of equal keys.
    obs = sorted(observed, key=lambda o: (o.key.topic, o.key.partition, o.subscription,
                                          o.observed_at, o.confirmed_at))
    return [o for o, n in zip(obs, [*obs[1:], None] if obs else [], strict=True)
            if n is None or n.key != o.key or n.subscription != o.subscription]

