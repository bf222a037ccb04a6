"""The safety rule and the guard: nothing reaches the target that breaks the rule.

**The rule.** :func:`safe_target_acks` and :func:`anchored_target_acks` are the
only functions that turn source acks into target acks: a target entry consumers
can receive is in their result only if a segment maps it from a source entry
that the source cursor has acked, or it is a known copy of a source entry and a
snapshot anchor shows every source entry it can have come from acked. Unknown
mapping means not acked.

**The guard.** :func:`guard` is the emit gate every emit path calls; it
re-checks a plan against the rule (:func:`check_safe`) and is the only maker
of the :class:`SafePlan` emitters accept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.keys import (
    I64,
    base_for,
    clip_runs,
    fits,
    keyspace,
    ledger_of,
    merge,
    pack,
    rebase,
    to_keys,
)
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.mapping import SegmentSet, TopicMapping
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import CursorSyncError


def safe_target_acks(source_acked: RangeSet, segments: SegmentSet) -> RangeSet:
    """THE safety rule: target entries whose source counterpart is acked on the source.

    Invariant: the result contains a target entry only if some segment maps it
    from a source entry inside ``source_acked``. Nothing is extrapolated
    beyond a segment; unmapped source acks produce nothing.
    """
    global _last_rule
    last = _last_rule
    if last[0] is source_acked and last[1] is segments:
        return last[2]  # the same values (both immutable): the plan's answer, for its guard
    result = _safe_target_acks(source_acked, segments)
    _last_rule = (source_acked, segments, result)
    return result


#: The last inputs of :func:`safe_target_acks` and its answer: a sync translates a cursor,
#: then guards the plan against the rule for the same source and mapping.
_last_rule: tuple[object, object, RangeSet] = (None, None, RangeSet())


def _safe_target_acks(source_acked: RangeSet, segments: SegmentSet) -> RangeSet:
    rows = segments.rows
    if len(rows) == 0 or not source_acked:
        return RangeSet()
    keyed = _keyed_target_acks(source_acked, rows)
    if keyed is not None:
        return keyed
    # Positions based keys cannot hold: exact keys over the ledgers in play.
    s = source_acked.bounds
    sl, se, tl, te, cnt = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4]
    seg_bounds = np.stack([sl, se - 1, sl, se + cnt - 1], axis=1)
    ks = keyspace(s, seg_bounds)
    s_lo, s_hi = to_keys(ks, s)
    g_lo, g_hi = to_keys(ks, seg_bounds)
    # Acked ranges overlapping segment j: those with hi > seg lo and lo < seg hi.
    first = np.searchsorted(s_hi, g_lo, side="right")
    last = np.searchsorted(s_lo, g_hi, side="left")
    n = np.maximum(last - first, 0)
    total = int(n.sum())
    if total == 0:
        return RangeSet()
    seg = np.repeat(np.arange(len(rows)), n)
    offs = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
    k = first[seg] + offs
    lo = np.maximum(s_lo[k], g_lo[seg])
    hi = np.minimum(s_hi[k], g_hi[seg])
    _, lo_e = ks.unpack(lo)
    _, hi_e = ks.unpack(hi)
    shift = (te - se)[seg]
    tls = tl[seg]
    return RangeSet(np.stack([tls, lo_e + shift, tls, hi_e + shift], axis=1))


def anchored_target_acks(source: CursorState, mapping: TopicMapping) -> RangeSet:
    """The rule for snapshot anchors: target entries known to be copies of source entries
    (``unpaired`` runs) at or before the furthest target position that an anchor at or
    before the source's markDeletePosition names (:mod:`cursorsync.core.anchors`): every
    source entry they can have come from is acked."""
    return mapping.anchors.acks(source.mark_delete, mapping.unpaired.ranges())


def _keyed_target_acks(source_acked: RangeSet, rows: I64) -> RangeSet | None:
    """:func:`safe_target_acks` on based keys, or None when they cannot hold the positions.

    Each segment takes the acked ranges that meet its source run, clipped to the run; a
    segment stays within one ledger on each side, so a key moves to the target by adding
    the difference of the segment's first keys.
    """
    keyed = source_acked._keys()
    if keyed is None:
        return None
    s_lo, s_hi, s_base = keyed
    sl, se, tl, te, cnt = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4]
    low = int(sl.min())
    base = min(s_base, base_for(low))
    top = ledger_of(int(s_hi[-1]), s_base)
    if not fits(base, low, max(int(sl.max()), top), int(se.min()) - 1,
                int((se + cnt).max()) - 1):
        return None
    t_low = int(tl.min())
    t_base = base_for(t_low)
    if not fits(t_base, t_low, int(tl.max()), int(te.min()) - 1, int((te + cnt).max()) - 1):
        return None
    s_lo, s_hi = rebase(s_lo, s_base, base), rebase(s_hi, s_base, base)
    g_lo = pack(sl, se - 1, base, minus_one=False)
    g_hi = pack(sl, se + cnt - 1, base, minus_one=False)
    lo, hi, counts = clip_runs(g_lo, g_hi, s_lo, s_hi)
    shift = np.repeat(pack(tl, te, t_base, minus_one=False) - (g_lo + 1), counts)
    lo += shift
    hi += shift
    return RangeSet._from_keys(*merge(lo, hi), t_base)


def check_safe(plan: AckPlan, source: CursorState, mapping: TopicMapping,
               target: CursorState) -> RangeSet:
    """Return the target positions the plan would ack against the safety rule (empty when safe).

    Two ways to ack: ``to_ack`` entry by entry, and a cumulative ack up to the
    plan's markDeletePosition. Every target entry either covers must be the
    counterpart of a source entry acked on the source, a skippable entry, or
    already acked on the target. ``to_ack`` is checked in position space. The
    cumulative span is checked on the positions that may hold an entry
    (:func:`may_hold_entries`), independently of how the plan was folded.
    """
    if not plan.to_ack and plan.mark_delete <= target.mark_delete:
        # Nothing to send, and up to the markDeletePosition is acked on the target already.
        return RangeSet()
    allowed = (safe_target_acks(source.acked(), mapping.segments)
               | anchored_target_acks(source, mapping)
               | mapping.skippable.ranges() | target.acked())
    bad = plan.to_ack - allowed
    cumulative = may_hold_entries(RangeSet.up_to(plan.mark_delete) - allowed, target.ledgers)
    return bad | cumulative


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


#: Only :func:`guard` holds it, so only the guard can make a SafePlan.
_GUARD_KEY = object()


@dataclass(frozen=True)
class SafePlan:
    """An AckPlan that passed :func:`guard`; emitters accept nothing else.

    Made by :func:`guard` alone: building one anywhere else raises TypeError.
    """

    plan: AckPlan
    _key: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._key is not _GUARD_KEY:
            raise TypeError("a SafePlan comes only from cursorsync.core.guard.guard()")


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
    return SafePlan(plan, _GUARD_KEY)


