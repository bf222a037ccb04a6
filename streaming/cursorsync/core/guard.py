"""The safety rule and the guard: nothing reaches the target that breaks the rule.

**The rule.** A target entry consumers can receive is acknowledged only if a segment
maps it from a source entry that the source cursor has acked, or it is a known copy of
a source entry (an ``unpaired`` run) at or before the target position that a snapshot
anchor at or before the source's markDeletePosition names. Skippable entries are always
safe to ack, and what the target has acked already stays acked. Unknown mapping means
not acked.

**The guard.** :func:`guard` is the emit gate every emit path calls, and the only maker
of the :class:`SafePlan` emitters accept. Its check (:func:`check_safe`) stands apart
from the planner: the planner (:mod:`cursorsync.core.translate`) maps the source's acks
forward onto the target, the guard walks from each target position the plan would ack
back to its source. They share the range algebra and nothing else, so a mistake in one
is caught by the other.
"""

from __future__ import annotations

import weakref
from dataclasses import fields
from typing import Any, NoReturn, final

import numpy as np
import numpy.typing as npt

from cursorsync.core import sorting
from cursorsync.core.batches import unbacked_index_acks
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.keys import I64, Keys, fits, keyspace, pack, to_keys
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import TopicMapping
from cursorsync.errors import CursorSyncError


def check_safe(plan: AckPlan, source: CursorState, mapping: TopicMapping,
               target: CursorState) -> RangeSet:
    """Return the target positions the plan would ack against the safety rule (empty when safe).

    Two ways to ack: ``to_ack`` entry by entry, and a cumulative ack up to the
    plan's markDeletePosition. Every target entry either covers must be the
    counterpart of a source entry acked on the source, a skippable entry, a known copy
    an anchor licenses, or already acked on the target. ``to_ack`` is checked in position
    space. The cumulative span is checked on the positions that may hold an entry
    (:func:`may_hold_entries`), independently of how the plan was folded. An index ack
    that the source does not back puts its whole target entry in the answer.
    """
    bad_indexes = RangeSet()
    if plan.index_acks:
        wrong = unbacked_index_acks(plan.index_acks, source.batches, source.acked(),
                                    mapping.segments)
        if wrong:
            bad_indexes = RangeSet.of(*((Position(a.target.ledger, a.target.entry - 1),
                                         a.target) for a in wrong))
    return bad_indexes | _entries_unsafe(plan, source, mapping, target)


def _entries_unsafe(plan: AckPlan, source: CursorState, mapping: TopicMapping,
                    target: CursorState) -> RangeSet:
    """:func:`check_safe` for the whole-entry acks."""
    if not plan.to_ack and plan.mark_delete <= target.mark_delete:
        # Nothing to send, and up to the markDeletePosition is acked on the target already.
        return RangeSet()
    acked = target.acked()
    rest = ((plan.to_ack - acked)
            | may_hold_entries(RangeSet.up_to(plan.mark_delete) - acked, target.ledgers))
    if not rest:
        return rest
    licensed = _licensed_copies(source.mark_delete, mapping)
    source_acked = source.acked()
    if _all_backed(rest, source_acked, mapping, licensed):
        return RangeSet()
    rest = rest - mapping.skippable.ranges() - licensed
    return _unbacked(rest, source_acked, mapping.segments.rows) if rest else rest


def _licensed_copies(source_mark_delete: Position, mapping: TopicMapping) -> RangeSet:
    """Known copies (``unpaired`` runs) at or before the furthest target position named by
    an anchor whose source position is at or before ``source_mark_delete``: the anchor
    says each came from a source entry before its source position, all of them acked."""
    a = mapping.anchors.rows
    if not len(a) or not len(mapping.unpaired):
        return RangeSet()
    md_l, md_e = source_mark_delete.ledger, source_mark_delete.entry
    reached = a[(a[:, 0] < md_l) | ((a[:, 0] == md_l) & (a[:, 1] <= md_e))]
    if not len(reached):
        return RangeSet()
    top = reached[sorting.lexsort((reached[:, 3], reached[:, 2]))[-1]]
    return mapping.unpaired.ranges() & RangeSet.up_to(Position(int(top[2]), int(top[3])))


# Longer than 50 lines: one vectorised pass whose steps share the packed key arrays;
# split, each part would take and return most of them.
def _all_backed(rest: RangeSet, source_acked: RangeSet, mapping: TopicMapping,
                licensed: RangeSet) -> bool:
    """Is every position of ``rest`` (target positions) a copy of an acked source entry, a
    skippable entry or a licensed copy? The answer for the plans that pass, on based keys.

    Each range of ``rest`` must be covered whole by the target runs it meets (segments,
    skippable runs, licensed copies), and each segment's piece of it, moved to the source
    at the segment's entry offset, must lie inside one acked range. False also where based
    keys cannot hold the positions or runs overlap: :func:`_unbacked` decides then.
    """
    t_keys, s_keys = rest._keys(), source_acked._keys()
    if t_keys is None or s_keys is None:
        return False
    r_lo, r_hi, t_base = t_keys
    a_lo, a_hi, s_base = s_keys
    r = rest.bounds
    g = mapping.segments.rows
    g = g[_near(r, g[:, 2], g[:, 3], g[:, 4])]
    k = mapping.skippable.rows
    k = k[_near(r, k[:, 0], k[:, 1], k[:, 2])]
    c = licensed.bounds
    ledger = np.concatenate((g[:, 2], k[:, 0], c[:, 0]))
    first = np.concatenate((g[:, 3], k[:, 1], c[:, 1] + 1))
    count = np.concatenate((g[:, 4], k[:, 2], c[:, 3] - c[:, 1]))
    sl, se, n = g[:, 0], g[:, 1], g[:, 4]
    if not len(ledger) or (c[:, 0] != c[:, 2]).any() or not fits(
            t_base, int(ledger.min()), int(ledger.max()), int(first.min()) - 1,
            int((first + count).max()) - 1):
        return False
    if len(g) and not fits(s_base, int(sl.min()), int(sl.max()), int(se.min()) - 1,
                           int((se + n).max()) - 1):
        return False
    lo = pack(ledger, first - 1, t_base, minus_one=False)
    # Source key minus target key, per segment run; the other runs need no source.
    shift = np.concatenate((pack(sl, se - 1, s_base, minus_one=False) - lo[:len(g)],
                            np.zeros(len(k) + len(c), np.int64)))
    mapped = np.arange(len(lo)) < len(g)
    order = sorting.argsort(lo)
    lo, shift, mapped = lo[order], shift[order], mapped[order]
    hi = lo + count[order]
    if not (hi[:-1] <= lo[1:]).all():
        return False
    i, j, p_lo, p_hi = _meets(r_lo, r_hi, lo, hi)
    # Covered whole: the pieces of each range add up to it (they neither overlap nor
    # leave it); a range spanning ledgers never is (a ledger's -1 is no entry).
    got = np.bincount(i, minlength=len(r_lo))
    if not got.all() or not np.array_equal(
            np.add.reduceat(p_hi - p_lo, np.cumsum(got) - got), r_hi - r_lo):
        return False
    # Each segment's piece inside one acked range: the first acked range ending at or
    # after the piece ends.
    on = mapped[j]
    s_lo, s_hi = p_lo[on] + shift[j[on]], p_hi[on] + shift[j[on]]
    at = sorting.searchsorted(a_hi, s_hi, side="left")
    return bool((at < len(a_hi)).all() and (a_lo[np.minimum(at, len(a_hi) - 1)] <= s_lo).all())


def _unbacked(rest: RangeSet, source_acked: RangeSet, rows: I64) -> RangeSet:
    """The part of ``rest`` (target positions) that is not a copy of an acked source entry,
    exactly, on exact keys.

    From the target side: each segment takes the ranges of ``rest`` that meet its target
    run, clipped to the run. A segment stays within one ledger on each side, so a clipped
    range is a source range at the segment's entry offset; what of it the source has not
    acked goes back to the target as the segment's share of the answer. What of ``rest``
    no segment covers is unmapped, and in the answer whole.
    """
    r = rest.bounds
    g = rows[_near(r, rows[:, 2], rows[:, 3], rows[:, 4])]
    if not len(g):
        return rest
    runs = np.stack([g[:, 2], g[:, 3] - 1, g[:, 2], g[:, 3] + g[:, 4] - 1], axis=1)
    ks = keyspace(r, runs)
    seg, _, lo, hi = _meets(*to_keys(ks, runs), *to_keys(ks, r))
    t_l, lo_e = ks.unpack(lo)
    _, hi_e = ks.unpack(hi)
    offset = (g[:, 1] - g[:, 3])[seg]  # source entry - target entry, per piece
    s_l = g[seg, 0]
    pieces = np.stack([s_l, lo_e + offset, s_l, hi_e + offset], axis=1)
    unmapped = rest - RangeSet(np.stack([t_l, lo_e, t_l, hi_e], axis=1))
    unacked = RangeSet(pieces) - source_acked
    if not unacked:
        return unmapped
    u = unacked.bounds
    ks = keyspace(pieces, u)
    piece, _, lo, hi = _meets(*to_keys(ks, pieces), *to_keys(ks, u))
    _, lo_e = ks.unpack(lo)
    _, hi_e = ks.unpack(hi)
    back_l, back = t_l[piece], offset[piece]
    return unmapped | RangeSet(np.stack([back_l, lo_e - back, back_l, hi_e - back], axis=1))


def _near(r: I64, ledger: I64, first: I64, count: I64) -> npt.NDArray[np.bool_]:
    """Which runs (``count`` entries from ``ledger:first``) meet the hull of the bounds
    ``r``: they end after its first range starts and start before its last range ends."""
    near: npt.NDArray[np.bool_] = (
        ((ledger > r[0, 0]) | ((ledger == r[0, 0]) & (first + count - 1 > r[0, 1])))
        & ((ledger < r[-1, 2]) | ((ledger == r[-1, 2]) & (first <= r[-1, 3]))))
    return near


def _meets(alo: Keys, ahi: Keys, blo: Keys, bhi: Keys) -> tuple[I64, I64, Keys, Keys]:
    """For each interval of A (any order), the intervals of B (sorted, none overlapping)
    that meet it, clipped to it: (index into A, index into B, lo, hi) of each such piece,
    grouped by A."""
    first = sorting.searchsorted(bhi, alo, side="right")  # first of B ending after A starts
    stop = sorting.searchsorted(blo, ahi, side="left")    # first of B starting at or after A ends
    n = np.maximum(stop - first, 0)
    a = np.repeat(np.arange(len(alo)), n)
    b = first[a] + (np.arange(len(a)) - np.repeat(np.cumsum(n) - n, n))
    return a, b, np.maximum(blo[b], alo[a]), np.minimum(bhi[b], ahi[a])


def may_hold_entries(ranges: RangeSet, ledgers: Ledgers | None) -> RangeSet:
    """The part of ``ranges`` where an entry may be.

    Without a ledger list, all of it. With one, only what the list rules out
    goes: positions of a listed closed ledger past its entry count, ledgers
    absent between listed ones, positions before the first listed ledger
    (deleted ledgers), and each ledger's ``-1`` (never an entry). The last
    listed ledger is open, its count a snapshot: every position in it and
    past it may hold an entry.
    """
    if ledgers is None or not len(ledgers.ids) or not ranges:
        return ranges
    closed = np.flatnonzero(ledgers.entries[:-1] > 0)
    ids, counts = ledgers.ids[closed], ledgers.entries[closed]
    possible = RangeSet(np.stack([ids, np.full_like(ids, -1), ids, counts - 1], axis=1))
    open_start = Position(int(ledgers.ids[-1]), -1)
    top = ranges.bounds[-1]
    end = Position(int(top[2]), int(top[3]))
    if end > open_start:
        possible = possible | RangeSet.of((open_start, end))
    return ranges & possible


class UnsafePlanError(CursorSyncError):
    """A plan would acknowledge a target entry whose source is not acknowledged. Never sent."""


class AnchorConflictError(UnsafePlanError):
    """The mapping and the source's snapshot anchors disagree: one is wrong. Never sent."""


#: The plans :func:`guard` passed, by the SafePlan it made for each, with the plan's field
#: values as it saw them. A SafePlan holds nothing itself: this is where its plan is.
_GUARDED: weakref.WeakKeyDictionary[SafePlan, tuple[AckPlan, tuple[object, ...]]] = (
    weakref.WeakKeyDictionary())
_PLAN_FIELDS = tuple(f.name for f in fields(AckPlan))


@final
class SafePlan:
    """An AckPlan that passed :func:`guard`; emitters accept nothing else.

    Only :func:`guard` makes one, and only for the plan it checked: the object holds no
    plan, :attr:`plan` looks it up by the object's identity among those the guard passed.
    So no constructor, ``dataclasses.replace``, subclass or attribute assignment yields one
    for another plan, a copy is the same object, and pickling refuses (another process
    guards its own plans). A plan whose fields were swapped after the guard saw it is
    refused too.
    """

    __slots__ = ("__weakref__",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a SafePlan comes only from cursorsync.core.guard.guard()")

    def __init_subclass__(cls, **kwargs: Any) -> NoReturn:
        raise TypeError("SafePlan has no subclasses: a SafePlan comes only from guard()")

    @property
    def plan(self) -> AckPlan:
        """The plan the guard passed; TypeError for a SafePlan the guard did not make."""
        seen = _GUARDED.get(self)
        if seen is None:
            raise TypeError("this SafePlan was not made by cursorsync.core.guard.guard()")
        plan, values = seen
        for name, value in zip(_PLAN_FIELDS, values, strict=True):
            if getattr(plan, name) is not value:
                raise TypeError(f"the plan's {name} changed after the guard passed it")
        return plan

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError("a SafePlan is not pickled: guard the plan in the process that emits it")

    def __copy__(self) -> SafePlan:
        return self

    def __deepcopy__(self, memo: object) -> SafePlan:
        return self

    def __repr__(self) -> str:
        seen = _GUARDED.get(self)
        return f"SafePlan({seen[0] if seen is not None else 'not from the guard'})"


def guard(plan: AckPlan, source: CursorState, mapping: TopicMapping,
          target: CursorState) -> SafePlan:
    """The emit gate: every emit path calls this; it raises instead of letting a bad ack out.

    A mapping that contradicts the source's snapshot anchors where the target is not acked
    yet is not trusted for anything: the plan is refused whatever it holds."""
    contradictions = mapping.anchors.contradictions(mapping.segments.rows,
                                                    after_target=target.mark_delete)
    if contradictions:
        raise AnchorConflictError(
            f"refusing to emit: the mapping contradicts the source's snapshot markers "
            f"({'; '.join(contradictions[:3])}); nothing was sent until the mapping is "
            f"repaired")
    bad = check_safe(plan, source, mapping, target)
    if bad:
        raise UnsafePlanError(f"refusing to emit: target positions {bad} are not acked on the "
                              f"source (source {source}); nothing was sent")
    safe: SafePlan = object.__new__(SafePlan)
    _GUARDED[safe] = (plan, tuple(getattr(plan, name) for name in _PLAN_FIELDS))
    return safe
