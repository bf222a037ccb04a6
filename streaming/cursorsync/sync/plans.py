"""What the sync step remembers of each cursor's last plan: in full while the cursor
moves, packed into a few bytes while it is idle.

Most of a job's cursors sit still (everything acked on both sides, nothing to send), and
the arrays their plans were made from (cursor states, ledger lists, the tables derived
from them) cost kilobytes each. An idle cursor keeps only what tells the step whether
anything changed (its source state without what was derived from it, its target cursor as
bytes, the version of the mapping and the markers it was planned with) and the plan it
records again. The step's memory then grows with the cursors that move; an idle one
costs a few hundred bytes.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from cursorsync.core.cursor import AckPlan, CursorState, Outcome
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import TopicMapping

#: An idle cursor whose last plan sent nothing has its target read every this many batches:
#: nothing is sent for it in between, so a stale target costs no ack, only a late one if
#: the target's cursor was moved back meanwhile (a reset on the target).
IDLE_TARGET_READ_EVERY = 10

#: One empty set shared by every packed plan.
_EMPTY = RangeSet()
#: A packed state's head: markDeletePosition, ranges, ledgers (-1: no list); int64s in the
#: machine's order, like the arrays after it.
_HEAD = struct.Struct("=4q")
#: A packed idle plan's head: markDeletePosition, the previous one, the four counts, the
#: outcome; the individually deleted ranges' bounds follow.
_PLAN = struct.Struct("=8qB")
#: A plan's outcome by its index in the packed bytes: the order is the format's.
_OUTCOMES: tuple[Outcome, ...] = (Outcome.EXACT, Outcome.PARTIAL, Outcome.UNKNOWN)


@dataclass
class Planned:
    """A plan and its inputs; reused while nothing it was made from has changed, and only if
    it had nothing unmapped (unmapped entries may be looked up as markers later) and no
    rewind (a source that did not move since its previous observation has none)."""

    source: CursorState
    #: The version of the partition's mapping (:mod:`cursorsync.core.packed`).
    version: int
    target: CursorState
    markers: RangeSet | None
    used: TopicMapping
    plan: AckPlan
    #: The plan's last run sent nothing and needed nothing sent.
    quiet: bool = False
    #: Batches since the target was last read for it.
    unread: int = 0

    @property
    def final(self) -> bool:
        """Nothing unmapped (a lookup may still find markers) and no rewind: the plan stays
        right while its inputs stay the same."""
        return not self.plan.unmapped_acked_entries and not self.plan.rewound_entries

    def settled(self, source: CursorState, version: int, markers: RangeSet | None) -> bool:
        """Quiet, and the same source and mapping: the target needs no fresh read yet."""
        return (self.quiet and self.unread + 1 < IDLE_TARGET_READ_EVERY
                and version == self.version and states_equal(source, self.source)
                and _markers_equal(markers, self.markers))

    def reusable(self, source: CursorState, version: int, target: CursorState,
                 previous: CursorState | None, markers: RangeSet | None) -> bool:
        return (version == self.version and self.final
                and (previous is None or states_equal(previous, source))
                and states_equal(source, self.source) and states_equal(target, self.target)
                and _markers_equal(markers, self.markers))


@dataclass(slots=True)
class IdleCursor:
    """An idle cursor, packed: its last plan passed the guard, sent nothing and had nothing
    unmapped, and the source, mapping, markers and target it was made from are these.

    The source state is kept as it is, without what was derived from it: the sync sink
    hands the step the same state object for a row that did not change
    (:class:`cursorsync.sync.observed.Observations`), so it costs nothing more, and
    comparing it is an identity check."""

    source: CursorState
    target: bytes
    #: When the source was last observed as it is.
    observed_at: datetime
    version: int
    markers: RangeSet | None
    plan: AckPlan
    #: Batches since the target was last read for it.
    unread: int

    @classmethod
    def of(cls, planned: Planned, observed_at: datetime) -> IdleCursor:
        planned.source.forget()
        return cls(planned.source, encode_state(planned.target), observed_at, planned.version,
                   planned.markers, compact_plan(planned.plan), planned.unread)

    def unchanged(self, source: CursorState, version: int, markers: RangeSet | None) -> bool:
        """The same source, mapping and markers as when it went idle."""
        return (version == self.version and _markers_equal(markers, self.markers)
                and states_equal(source, self.source))

    def source_state(self) -> CursorState:
        return self.source


def read_offset(k: tuple[PartitionKey, str]) -> int:
    """Batches an idle cursor counts as already passed without a target read, by its key:
    its target is read within IDLE_TARGET_READ_EVERY batches of going idle, and the reads
    of cursors that went idle in one batch spread over the next ones."""
    return stable_hash(k) % IDLE_TARGET_READ_EVERY


def stable_hash(k: tuple[PartitionKey, str]) -> int:
    """A number drawn from a (partition, subscription) key, the same in every process (a
    CRC-32, unlike :func:`hash`): what spreads per-cursor work that recurs every few
    batches over those batches."""
    key, subscription = k
    return zlib.crc32(f"{key.topic}\0{key.partition}\0{subscription}".encode())


def states_equal(a: CursorState, b: CursorState) -> bool:
    """Equal cursor states (the ledger lists compared by value, partial batches too)."""
    if a is b:
        return True
    if (a.mark_delete != b.mark_delete or a.individually_deleted != b.individually_deleted
            or a.batches != b.batches):
        return False
    return a.ledgers == b.ledgers


def _markers_equal(a: RangeSet | None, b: RangeSet | None) -> bool:
    return (a is None) == (b is None) and (a is None or a == b)


def encode_state(state: CursorState) -> bytes:
    """A cursor state as bytes: markDeletePosition, the individually deleted ranges' bounds,
    the ledger list (or none), each part led by its length: equal bytes are equal states."""
    md = state.mark_delete
    bounds = state.individually_deleted.bounds
    ledgers = state.ledgers
    if ledgers is None:
        return _HEAD.pack(md.ledger, md.entry, len(bounds), -1) + bounds.tobytes()
    return (_HEAD.pack(md.ledger, md.entry, len(bounds), len(ledgers.ids)) + bounds.tobytes()
            + ledgers.ids.tobytes() + ledgers.entries.tobytes())


def compact_plan(plan: AckPlan) -> AckPlan:
    """The plan without what its sets derived on use (keys, caches): the same value."""
    idm = plan.individually_deleted
    kept = RangeSet(idm.bounds.copy(), _canonical=True) if idm else _EMPTY
    previous = plan.mark_delete if plan.previous_mark_delete == plan.mark_delete else \
        plan.previous_mark_delete
    return replace(plan, individually_deleted=kept, previous_mark_delete=previous,
                   to_ack=_EMPTY if not plan.to_ack else plan.to_ack)


def encode_plan(plan: AckPlan) -> bytes:
    """A plan with nothing to ack as bytes (:func:`decode_plan` gives :func:`compact_plan`
    of it back): an idle cursor's plan, kept in a column."""
    if plan.to_ack or plan.index_acks:
        raise ValueError("only a plan with nothing to ack is packed")
    md, prev = plan.mark_delete, plan.previous_mark_delete
    return _PLAN.pack(md.ledger, md.entry, prev.ledger, prev.entry,
                      plan.unmapped_acked_entries, plan.rewound_entries,
                      plan.partial_batches_unacked, plan.skippable_acked_entries,
                      _OUTCOMES.index(plan.outcome)) + plan.individually_deleted.bounds.tobytes()


def decode_plan(data: bytes) -> AckPlan:
    """:func:`encode_plan`'s bytes read back."""
    (md_l, md_e, prev_l, prev_e, unmapped, rewound, partial, skippable,
     outcome) = _PLAN.unpack_from(data)
    md = Position(md_l, md_e)
    bounds = np.frombuffer(data, np.int64, offset=_PLAN.size).reshape(-1, 4).copy()
    idm = RangeSet(bounds, _canonical=True) if len(bounds) else _EMPTY
    prev = md if (prev_l, prev_e) == (md_l, md_e) else Position(prev_l, prev_e)
    return AckPlan(md, idm, _EMPTY, prev, unmapped, rewound, partial, skippable,
                   _OUTCOMES[outcome])
