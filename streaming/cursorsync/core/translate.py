"""Translate a source cursor into an ack plan for the target cluster.

The three invariants of DESIGN.md are enforced here and nowhere else:

* **Safety (no loss).** :func:`safe_target_acks` is the only function that
  turns source acks into target acks: a target entry consumers can receive is
  in its result only if a segment maps it from a source entry that the source
  cursor has acked. Unknown mapping means not acked. :func:`check_safe` is the
  guard every emit path calls before sending anything.
* **Progress.** Every mapped target entry whose source is acked is in the
  plan, and skippable entries (markers) whose predecessor is acked join it, so
  the target markDeletePosition advances as far as the source's allows.
* **Monotone.** The plan is a superset of what the target already has acked;
  a source that moved backwards is counted in ``rewound_entries``, never
  hidden and never "un-acked" (acks cannot be taken back).

Cost: a handful of vectorised passes over ranges and segments, O((ranges +
segments) log), memory proportional to ranges. No loop ever runs per entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cursorsync.core.mapping import SegmentSet, TopicMapping
from cursorsync.core.positions import Position
from cursorsync.core.ranges import Ledgers, RangeSet, _keyspace, _to_keys, fold
from cursorsync.errors import CursorSyncError

Outcome = Literal["exact", "partial", "unknown"]


@dataclass(frozen=True)
class CursorState:
    """A subscription cursor as the broker reports it, plus the topic's ledgers when known."""

    mark_delete: Position
    individually_deleted: RangeSet = field(default_factory=RangeSet)
    ledgers: Ledgers | None = None

    @classmethod
    def parse(cls, mark_delete: str, individually_deleted: str = "[]",
              ledgers: Ledgers | None = None) -> CursorState:
        return cls(Position.parse(mark_delete), RangeSet.parse(individually_deleted), ledgers)

    def acked(self) -> RangeSet:
        """Every acked position: up to the markDeletePosition, and the individual ranges."""
        return RangeSet.up_to(self.mark_delete) | self.individually_deleted

    def __str__(self) -> str:
        return f"markDelete={self.mark_delete} individual={self.individually_deleted}"


@dataclass(frozen=True)
class AckPlan:
    """What the target cursor should become, and what must be sent to get there."""

    #: Target markDeletePosition after the plan is applied.
    mark_delete: Position
    #: Target individually acked ranges after it.
    individually_deleted: RangeSet
    #: Target entries to acknowledge: acked after the plan, not acked before.
    to_ack: RangeSet
    #: The target's markDeletePosition before the plan.
    previous_mark_delete: Position
    #: Source entries acked on the source that no segment maps yet (they wait).
    unmapped_acked_entries: int
    #: Source entries previously seen acked that are no longer acked (a rewind).
    rewound_entries: int
    #: Partially acked source batches: unacked at entry level, redelivered after failover.
    partial_batches_unacked: int
    #: Skippable target entries (markers) the plan acks.
    skippable_acked_entries: int
    outcome: Outcome

    def split(self, *, cumulative: bool) -> tuple[Position | None, RangeSet]:
        """(cumulative ack position or None, ranges to ack individually).

        With cumulative acks (Exclusive/Failover) one ack covers everything up
        to the new markDeletePosition; Shared/Key_Shared must ack every entry.
        """
        if cumulative and self.mark_delete > self.previous_mark_delete:
            return self.mark_delete, self.to_ack.after(self.mark_delete)
        return None, self.to_ack


def safe_target_acks(source_acked: RangeSet, segments: SegmentSet) -> RangeSet:
    """THE safety rule: target entries whose source counterpart is acked on the source.

    Invariant: the result contains a target entry only if some segment maps it
    from a source entry inside ``source_acked``. Nothing is extrapolated
    beyond a segment; unmapped source acks produce nothing.
    """
    rows = segments.rows
    if len(rows) == 0 or not source_acked:
        return RangeSet()
    s = source_acked.bounds
    sl, se, tl, te, cnt = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4]
    seg_bounds = np.stack([sl, se - 1, sl, se + cnt - 1], axis=1)
    ks = _keyspace(s, seg_bounds)
    s_lo, s_hi = _to_keys(ks, s)
    g_lo, g_hi = _to_keys(ks, seg_bounds)
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


def implied_unreplicated(mapping: TopicMapping, target_ledgers: Ledgers | None) -> RangeSet:
    """Source positions that cannot have a data counterpart on the target.

    Replication keeps the order of a topic partition and sends every entry it sends
    in that order. So when two consecutive segments map source entries s1 < s2 to
    target entries t1 < t2, and every target entry strictly between t1 and t2 is a
    known skippable one (a marker), then no source entry strictly between s1 and s2
    was replicated as data: each was never replicated (a local snapshot marker, an
    entry that came from another cluster) or arrived as one of those markers. Such
    entries are not "unmapped yet", and the unmapped count leaves them out.

    Only counting uses this; nothing is acked because of it. A gap is judged only when
    both its target ends are entries of ``target_ledgers`` (a stale list says nothing
    about what lies past it); without a ledger list nothing is implied.
    """
    rows = mapping.segments.rows
    if len(rows) < 2 or target_ledgers is None or not len(target_ledgers.ids):
        return RangeSet()
    sl, se, tl, te, n = (rows[:, i] for i in range(5))
    t_end_l, t_end_e = tl[:-1], te[:-1] + n[:-1] - 1
    t_next_l, t_next_e = tl[1:], te[1:]
    known = (_exists(target_ledgers, t_end_l, t_end_e)
             & _exists(target_ledgers, t_next_l, t_next_e))
    gaps = np.stack([t_end_l, t_end_e, t_next_l, t_next_e - 1], axis=1)
    rest = RangeSet(gaps[known]) - mapping.skippable.ranges()
    blocked = np.zeros(len(gaps), bool)
    if rest:
        rb = rest.bounds
        holds = (target_ledgers.entries_up_to(rb[:, 2], rb[:, 3])
                 - target_ledgers.entries_up_to(rb[:, 0], rb[:, 1])) > 0
        if holds.any():
            ks = _keyspace(gaps, rb)
            g_lo, _ = _to_keys(ks, gaps)
            r_lo, _ = _to_keys(ks, rb[holds])
            # Each leftover range lies inside one gap: the last gap starting at or before it.
            blocked[np.searchsorted(g_lo, r_lo, side="right") - 1] = True
    take = known & ~blocked
    if not take.any():
        return RangeSet()
    s_end_e = se[:-1] + n[:-1] - 1
    src = np.stack([sl[:-1], s_end_e, sl[1:], se[1:] - 1], axis=1)[take]
    return RangeSet(src)


def _exists(ledgers: Ledgers, ledger: np.ndarray, entry: np.ndarray) -> np.ndarray:
    """Which positions are entries of the ledger list."""
    return (ledgers.entries_up_to(ledger, entry) - ledgers.entries_up_to(ledger, entry - 1)) == 1


def _ack_skippable(acked: RangeSet, mapping: TopicMapping,
                   ledgers: Ledgers | None) -> tuple[RangeSet, int]:
    """Add skippable runs whose predecessor entry is acked, until nothing changes."""
    runs = mapping.skippable.rows
    added = 0
    while len(runs):
        pl, pe = runs[:, 0], runs[:, 1] - 1
        if ledgers is not None and len(ledgers.ids):
            pl, pe = ledgers.canonical(pl, pe)
        hit = acked.contains_arrays(pl, pe)
        if not hit.any():
            break
        take = runs[hit]
        new = RangeSet.entries(take[:, 0], take[:, 1], take[:, 2]) - acked
        added += new.count_entries()
        acked = acked | new
        runs = runs[~hit]
    return acked, added


def translate(
    source: CursorState,
    mapping: TopicMapping,
    target: CursorState,
    *,
    previous_source: CursorState | None = None,
    partially_acked: RangeSet | None = None,
) -> AckPlan:
    """Plan the target cursor for one (topic partition, subscription).

    ``target`` is the target cursor as last known (from its stats, or the last
    applied plan). The plan never removes anything from it.
    """
    source_acked = source.acked()
    current = target.acked()
    mapped = safe_target_acks(source_acked, mapping.segments)
    after, skipped = _ack_skippable(current | mapped, mapping, target.ledgers)
    md, individual = fold(target.mark_delete, after, target.ledgers)
    to_ack = after - current

    segs = mapping.segments.rows
    unmapped = unmapped_source(source, mapping, target.ledgers).count_entries(source.ledgers)
    rewound = 0
    if previous_source is not None:
        rewound = (previous_source.acked() - source_acked).count_entries(source.ledgers)
    partial = 0
    if partially_acked is not None:
        partial = (partially_acked - source_acked).count_entries(source.ledgers)
    outcome: Outcome = "unknown" if not len(segs) else ("partial" if unmapped else "exact")
    return AckPlan(md, individual, to_ack, target.mark_delete, unmapped, rewound, partial,
                   skipped, outcome)


def unmapped_source(source: CursorState, mapping: TopicMapping,
                    target_ledgers: Ledgers | None) -> RangeSet:
    """Source entries acked on the source, after the first segment, that no segment maps and
    nothing explains (known unreplicated runs, :func:`implied_unreplicated`): the sync is
    waiting for their evidence. Empty while there is no segment at all."""
    segs = mapping.segments.rows
    if not len(segs):
        return RangeSet()
    horizon = Position(int(segs[0, 0]), int(segs[0, 1]) - 1)
    return (source.acked().after(horizon) - mapping.segments.source_ranges()
            - mapping.unreplicated.ranges() - implied_unreplicated(mapping, target_ledgers))


def check_safe(plan: AckPlan, source: CursorState, mapping: TopicMapping,
               target: CursorState) -> RangeSet:
    """Return the target positions the plan would ack against the safety rule (empty when safe).

    Two ways to ack: ``to_ack`` entry by entry, and a cumulative ack up to the
    plan's markDeletePosition. Every target entry either covers must be the
    counterpart of a source entry acked on the source, a skippable entry, or
    already acked on the target. The cumulative span is checked on existing
    entries when the target's ledger list is known, and in position space
    (stricter) when it is not.
    """
    allowed = (safe_target_acks(source.acked(), mapping.segments)
               | mapping.skippable.ranges() | target.acked())
    bad = plan.to_ack - allowed
    cumulative = RangeSet.up_to(plan.mark_delete) - allowed
    ledgers = target.ledgers
    if ledgers is not None and len(ledgers.ids):
        cumulative = cumulative.canonical(ledgers)
        if cumulative.count_entries(ledgers) == 0:
            cumulative = RangeSet()
    return bad | cumulative


class UnsafePlanError(CursorSyncError):
    """A plan would acknowledge a target entry whose source is not acknowledged. Never sent."""


@dataclass(frozen=True)
class SafePlan:
    """An AckPlan that passed :func:`guard`; emitters accept nothing else."""

    plan: AckPlan


def guard(plan: AckPlan, source: CursorState, mapping: TopicMapping,
          target: CursorState) -> SafePlan:
    """The emit gate: every emit path calls this; it raises instead of letting a bad ack out."""
    bad = check_safe(plan, source, mapping, target)
    if bad:
        raise UnsafePlanError(f"refusing to emit: target positions {bad} are not acked on the "
                              f"source (source {source}); nothing was sent")
    return SafePlan(plan)


def is_monotone(plan: AckPlan, target: CursorState) -> bool:
    """The plan keeps every ack the target already has."""
    kept = RangeSet.up_to(plan.mark_delete) | plan.individually_deleted
    return not (target.acked().canonical(target.ledgers) - kept.canonical(target.ledgers))
