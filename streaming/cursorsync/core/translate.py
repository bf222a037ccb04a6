"""Translate a source cursor into an ack plan for the target cluster.

The plan keeps the invariants of DESIGN.md:

* **Safety (no loss).** Target acks come only from :func:`safe_target_acks` and
  :func:`anchored_target_acks`, which map the source's acks forward onto the
  target; the guard (:mod:`cursorsync.core.guard`) checks the plan again, on its
  own, from the target back, before anything is sent.
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

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from cursorsync.core import sorting
from cursorsync.core.batches import PartialBatch, plan_index_acks
from cursorsync.core.cursor import AckPlan, CursorState, Outcome, fold
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
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import SegmentSet, TopicMapping


def implied_unreplicated(mapping: TopicMapping, target_ledgers: Ledgers | None) -> RangeSet:
    """Source positions that cannot have a data counterpart on the target.

    Replication keeps the order of a topic partition and sends every entry it sends
    in that order; after a restart it starts again at or before the first entry it
    has not had confirmed. So when two segments next to each other in target order
    end at t1 (from s1) and start at t2 (from s2), with s1 < s2, and every target
    entry strictly between t1 and t2 is a known skippable one (a marker), then no
    source entry strictly between s1 and s2 was replicated as data: each was never
    replicated (a local snapshot marker, an entry that came from another cluster) or
    arrived as one of those markers. Which entries a replicator sends is decided by the
    entry itself, so a copy sent again after a restart changes nothing. Such entries
    are not "unmapped yet", and the unmapped count leaves them out. Where the source
    goes back (a copy sent again), the pair says nothing.

    Only counting uses this; nothing is acked because of it. Which target entries lie
    between t1 and t2 is known in two ways. In one ledger they are the ids between, all
    of which exist, so known skippable runs covering them settle it without any ledger
    list, also once the ledger is deleted (:func:`marker_bridged`). Across a ledger end
    only the ledger list says which entries exist, so such a gap is judged only when
    both its ends are entries of ``target_ledgers`` (a stale list says nothing about
    what lies past it).
    """
    pairs = _target_pairs(mapping)
    if pairs is None:
        return RangeSet()
    gaps, _, forward, same = pairs
    known = target_ledgers is not None and len(target_ledgers.ids) > 0
    if _few(pairs, mapping):
        few: list[bool] = (forward & same).tolist()
        if known:
            assert target_ledgers is not None
            listed_few = _listed_few(target_ledgers, gaps.tolist())
            few = [j or (f and x) for j, f, x in zip(few, forward.tolist(), listed_few,
                                                      strict=True)]
        return _implied_few(mapping, pairs, few, target_ledgers)
    listed = np.zeros(len(gaps), bool)
    if known:
        assert target_ledgers is not None
        listed = (forward & _exists(target_ledgers, gaps[:, 0], gaps[:, 1])
                  & _exists(target_ledgers, gaps[:, 2], gaps[:, 3] + 1))
    return _implied(mapping, pairs, listed | (forward & same), target_ledgers)


def marker_bridged(mapping: TopicMapping, before_ledger: int) -> RangeSet:
    """The part of :func:`implied_unreplicated` that gaps inside target ledgers before
    ``before_ledger`` imply, each entry between their ends a known skippable one: what
    those ledgers' runs say about the source, kept as source facts once the target has
    deleted the ledgers and the runs go (:mod:`cursorsync.core.retention`)."""
    pairs = _target_pairs(mapping)
    if pairs is None:
        return RangeSet()
    gaps, _, forward, same = pairs
    judged = forward & same & (gaps[:, 0] < before_ledger)
    if _few(pairs, mapping):
        return _implied_few(mapping, pairs, judged.tolist(), None)
    return _implied(mapping, pairs, judged, None)


def _implied(mapping: TopicMapping,
             pairs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
             judged: np.ndarray, target_ledgers: Ledgers | None) -> RangeSet:
    """The source gaps of the ``judged`` pairs whose target gap holds no entry but known
    skippable ones: in one ledger every id between the ends exists; across a ledger end
    only the entries ``target_ledgers`` lists are known to."""
    gaps, src, _, same = pairs
    idx = np.flatnonzero(judged)
    if not len(idx):
        return RangeSet()
    rest = RangeSet(gaps[idx]) - mapping.skippable.ranges()
    take = np.ones(len(idx), bool)
    if rest:
        rb = rest.bounds
        ks = keyspace(gaps[idx], rb)
        g_lo, _ = to_keys(ks, gaps[idx])
        r_lo, _ = to_keys(ks, rb)
        # Each leftover range lies inside one gap: the last gap starting at or before it.
        owner = sorting.searchsorted(g_lo, r_lo, side="right") - 1
        holds = same[idx][owner]
        if target_ledgers is not None and len(target_ledgers.ids):
            holds |= (target_ledgers.entries_up_to(rb[:, 2], rb[:, 3])
                      - target_ledgers.entries_up_to(rb[:, 0], rb[:, 1])) > 0
        take[owner[holds]] = False
    return RangeSet(src[idx[take]]) if take.any() else RangeSet()


#: Up to this many segment pairs and skippable runs, gaps are judged on Python ints: a
#: partition's few segments are judged on every sync where its mapping grew, and there
#: each numpy call's fixed cost is most of the work.
_FEW_PAIRS = 64


def _few(pairs: tuple[np.ndarray, ...], mapping: TopicMapping) -> bool:
    return len(pairs[0]) <= _FEW_PAIRS and len(mapping.skippable.rows) <= _FEW_PAIRS


def _implied_few(mapping: TopicMapping,
                 pairs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                 judged: list[bool], target_ledgers: Ledgers | None) -> RangeSet:
    """:func:`_implied` of few pairs and runs, gap by gap: the judged gaps none of whose
    parts outside the skippable runs holds an entry."""
    gaps, src, _, same = pairs
    runs = _merged_runs(mapping.skippable.rows.tolist())
    ends = [hi for _, hi in runs]
    listed = target_ledgers if target_ledgers is not None and len(target_ledgers.ids) else None
    take = [i for i, (gap, one_ledger, j) in enumerate(zip(gaps.tolist(), same.tolist(),
                                                           judged, strict=True))
            if j and not _holds_entry(gap, runs, ends, one_ledger, listed)]
    return RangeSet(src[take]) if take else RangeSet()


def _merged_runs(rows: list[list[int]]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Runs (ledger, first entry, count) as sorted, merged (lo, hi] position pairs."""
    out: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for lo, hi in sorted(((ledger, first - 1), (ledger, first + count - 1))
                         for ledger, first, count in rows if count > 0):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _holds_entry(gap: list[int], runs: list[tuple[tuple[int, int], tuple[int, int]]],
                 ends: list[tuple[int, int]], one_ledger: bool,
                 ledgers: Ledgers | None) -> bool:
    """Whether a part of the (lo, hi] gap outside ``runs`` holds an entry: any part does in
    one ledger; across ledgers, a part the ledger list has an entry in."""
    cur, hi = (gap[0], gap[1]), (gap[2], gap[3])
    k = bisect_right(ends, cur)  # the first run ending after the gap's start
    while cur < hi:
        part_end = hi if k == len(runs) or runs[k][0] >= hi else runs[k][0]
        if cur < part_end and (one_ledger or (
                ledgers is not None and ledgers.entries_up_to_one(*part_end)
                > ledgers.entries_up_to_one(*cur))):
            return True
        if part_end == hi:
            return False
        cur = max(cur, runs[k][1])
        k += 1
    return False


def _listed_few(ledgers: Ledgers, gaps: list[list[int]]) -> list[bool]:
    """:func:`_exists` of both ends of each gap, on Python ints."""
    def exists(ledger: int, entry: int) -> bool:
        return ledgers.entries_up_to_one(ledger, entry) - ledgers.entries_up_to_one(
            ledger, entry - 1) == 1
    return [exists(a, b) and exists(c, d + 1) for a, b, c, d in gaps]


def _target_pairs(mapping: TopicMapping
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Each two segments next to each other in target order: the target gap between them
    and the source gap between them (as range bounds, first position excluded), whether
    the source goes forward, and whether the two ends share a target ledger. None for
    fewer than two segments."""
    rows = mapping.segments.rows
    if len(rows) < 2:
        return None
    rows = rows[sorting.lexsort((rows[:, 3], rows[:, 2]))]
    sl, se, tl, te, n = (rows[:, i] for i in range(5))
    s_end_e = se[:-1] + n[:-1] - 1
    forward = (sl[1:] > sl[:-1]) | ((sl[1:] == sl[:-1]) & (se[1:] > s_end_e))
    gaps = np.stack([tl[:-1], te[:-1] + n[:-1] - 1, tl[1:], te[1:] - 1], axis=1)
    src = np.stack([sl[:-1], s_end_e, sl[1:], se[1:] - 1], axis=1)
    return gaps, src, forward, tl[1:] == tl[:-1]


def _exists(ledgers: Ledgers, ledger: np.ndarray, entry: np.ndarray) -> np.ndarray:
    """Which positions are entries of the ledger list."""
    inside = ledgers.entries_up_to(ledger, entry) - ledgers.entries_up_to(ledger, entry - 1)
    found: np.ndarray = inside == 1
    return found


def safe_target_acks(source_acked: RangeSet, segments: SegmentSet) -> RangeSet:
    """The planner's side of the safety rule: target entries whose source counterpart is
    acked on the source, mapped forward segment by segment.

    Invariant: the result contains a target entry only if some segment maps it
    from a source entry inside ``source_acked``. Nothing is extrapolated
    beyond a segment; unmapped source acks produce nothing.
    """
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
    first = sorting.searchsorted(s_hi, g_lo, side="right")
    last = sorting.searchsorted(s_lo, g_hi, side="left")
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
    mapped = (safe_target_acks(source_acked, mapping.segments)
              | anchored_target_acks(source, mapping))
    after, skipped = _ack_skippable(current | mapped, mapping, target.ledgers)
    md, individual = fold(target.mark_delete, after, target.ledgers)
    to_ack = after - current

    segs = mapping.segments.rows
    waiting, unmapped = _unmapped(source_acked, mapping, target.ledgers, source.ledgers)
    if unmapped is None:
        unmapped = waiting.count_entries(source.ledgers)
    rewound = 0
    if previous_source is not None:
        rewound = (previous_source.acked() - source_acked).count_entries(source.ledgers)
    partial = 0
    if partially_acked is not None:
        partial = (partially_acked - source_acked).count_entries(source.ledgers)
    outcome = (Outcome.UNKNOWN if not len(segs)
               else Outcome.PARTIAL if unmapped else Outcome.EXACT)
    return AckPlan(md, individual, to_ack, target.mark_delete, unmapped, rewound, partial,
                   skipped, outcome)


def unmapped_source(source: CursorState, mapping: TopicMapping,
                    target_ledgers: Ledgers | None) -> RangeSet:
    """Source entries acked on the source that no segment maps and nothing explains (known
    unreplicated runs, :func:`implied_unreplicated`): the sync is waiting for their
    evidence. Empty while there is no segment at all.

    Acks before the first segment count too, unless the target shows that nothing before
    its first mapped entry is data (:func:`_stream_starts_mapped`): then they precede
    replication and have no counterpart to wait for.
    """
    return _unmapped(source.acked(), mapping, target_ledgers, source.ledgers)[0]


def _unmapped(acked: RangeSet, mapping: TopicMapping, target_ledgers: Ledgers | None,
              source_ledgers: Ledgers | None) -> tuple[RangeSet, int | None]:
    """:func:`unmapped_source` of the source's acked positions, and how many entries of
    ``source_ledgers`` they are when that was counted on the way (None: not counted).

    The same entries, cheaper: the costlier checks run only where they can change the
    count (acks before the first segment that are entries of ``source_ledgers``, anything
    left for :func:`implied_unreplicated` to explain).
    """
    segs = mapping.segments.rows
    if not len(segs):
        return RangeSet(), 0
    # What the segments and known runs explain goes first: what is left is small.
    rest = acked - mapping.segments.source_ranges() - mapping.unreplicated.ranges()
    if (n := _entries_in(rest, source_ledgers)) == 0:
        return rest, n
    later = rest.after(Position(int(segs[0, 0]), int(segs[0, 1]) - 1))
    if _entries_in(rest - later, source_ledgers) == 0:
        rest = later  # nothing before the first segment to wait for
    elif _stream_starts_mapped(mapping, target_ledgers):
        rest = later  # only the acks after the first segment's start can wait for evidence
    if (n := _entries_in(rest, source_ledgers)) == 0:
        return rest, n
    # Every gap ends before some segment's first source entry, so before the last row's
    # (rows are sorted by it): what is left from there on (under traffic, most of it) is
    # no gap's to explain.
    last = segs[-1]
    if not rest - rest.after(Position(int(last[0]), int(last[1]) - 1)):
        return rest, None
    return rest - implied_unreplicated(mapping, target_ledgers), None


def _entries_in(ranges: RangeSet, ledgers: Ledgers | None) -> int | None:
    """The entries ``ranges`` holds; None without a ledger list (any range might hold one)."""
    if not ranges:
        return 0
    return None if ledgers is None or not len(ledgers.ids) else ranges.count_entries(ledgers)


def _stream_starts_mapped(mapping: TopicMapping, target_ledgers: Ledgers | None) -> bool:
    """Every target entry before the first mapped one is known skippable or foreign, so no
    source entry before the first segment was replicated as data. Unknown (no ledger
    list) is not known."""
    if target_ledgers is None or not len(target_ledgers.ids):
        return False
    rows = mapping.segments.rows
    first = rows[sorting.lexsort((rows[:, 3], rows[:, 2]))[0]]
    before = (RangeSet.up_to(Position(int(first[2]), int(first[3]) - 1))
              - mapping.skippable.ranges() - mapping.foreign.ranges())
    return before.count_entries(target_ledgers) == 0


def is_monotone(plan: AckPlan, target: CursorState) -> bool:
    """The plan keeps every ack the target already has."""
    kept = RangeSet.up_to(plan.mark_delete) | plan.individually_deleted
    return not (target.acked().canonical(target.ledgers) - kept.canonical(target.ledgers))


def with_index_acks(plan: AckPlan, source: CursorState, segments: SegmentSet,
                    target: CursorState,
                    target_partials: Mapping[Position, PartialBatch] | None = None) -> AckPlan:
    """The plan with the source's partly acked batches (``source.batches``) carried to the
    target as index acks; ``partial_batches_unacked`` counts those no segment maps yet."""
    if not source.batches:
        return plan
    acked = target.acked() | plan.to_ack | RangeSet.up_to(plan.mark_delete)
    live = [b for b in source.batches if b.position not in source.acked()]
    acks = plan_index_acks(live, segments, acked, target_partials)
    waiting = sum(1 for b in live if not segments.covering(b.position))
    return replace(plan, index_acks=acks, partial_batches_unacked=waiting)
