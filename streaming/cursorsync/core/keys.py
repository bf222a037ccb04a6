"""Positions packed into one order-preserving integer key each, and interval algebra on
the keys.

Range algebra (:mod:`cursorsync.core.ranges`) and the translation's segment
joins run on these keys, so a comparison of two positions is one integer
comparison in a vectorised numpy pass.

Two packings:

* **Based keys** (:func:`pack`): ``(ledger - base + 1) << 32 | (entry + 1)``,
  with ledger ``-1`` (where ``MIN_POSITION`` lives) at 0. Needing no look-up of
  the ledgers in play, they are computed once per range set and kept, and sets
  of one topic share a base, so the algebra runs on them directly. They hold
  entries up to ``2**32 - 2`` and ledgers within :data:`LEDGER_SPAN` of the base.
* **Key spaces** (:class:`KeySpace`): ranks of the ledgers in play, for any
  int64 position: the exact fallback when based keys cannot hold the values.

The algebra (:func:`algebra`, :func:`merge`, :func:`clip_runs`) takes canonical
``(lo, hi]`` interval arrays: sorted, non-empty, neither overlapping nor touching.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from cursorsync.core import sorting

I64 = npt.NDArray[np.int64]
Keys = npt.NDArray[Any]  # int64, or object (Python ints) when ids are too wide to pack

#: No ranges: the (0, 4) bounds array.
EMPTY_BOUNDS = np.empty((0, 4), dtype=np.int64)

# ------------------------------------------------------------------ based keys

ENTRY_BITS = 32
ENTRY_MASK = (1 << ENTRY_BITS) - 1
#: Largest entry id a based key holds.
MAX_KEYED_ENTRY = ENTRY_MASK - 1
#: Ledgers base .. base + LEDGER_SPAN - 1 (and -1) fit; the top ledger slot stays free so
#: that no key reaches KEY_ABOVE.
LEDGER_SPAN = 2**31 - 2
#: Bases are multiples of this, so that range sets of one topic get the same base.
BASE_ALIGN = 1 << 30
#: Below and above every based key: open ends for complements.
KEY_BELOW = -1
KEY_ABOVE = 2**63 - 1


def base_for(min_ledger: int) -> int:
    """The base for sets whose smallest ledger other than -1 is ``min_ledger``."""
    return (max(min_ledger, 0) // BASE_ALIGN) * BASE_ALIGN


def fits(base: int, min_ledger: int, max_ledger: int, min_entry: int, max_entry: int) -> bool:
    """Do positions within these extremes have based keys? ``min_ledger`` ignores -1."""
    return (base <= min_ledger and max_ledger < base + LEDGER_SPAN
            and min_entry >= -1 and max_entry <= MAX_KEYED_ENTRY)


def pack(ledgers: I64, entries: I64, base: int, *, minus_one: bool = True) -> I64:
    """Based keys of positions that fit (:func:`fits`). ``minus_one=False`` promises that no
    ledger is -1, which saves a pass."""
    return pack_next(ledgers, entries + 1, base, minus_one=minus_one)


def pack_next(ledgers: I64, next_entries: I64, base: int, *, minus_one: bool = True) -> I64:
    """:func:`pack` of (ledger, entry) given entry + 1, which :func:`next_entries_fit` can
    check on the way."""
    high = ledgers + (1 - base)
    if minus_one and base != 0:
        high = np.where(ledgers == -1, 0, high)
    high <<= ENTRY_BITS
    high |= next_entries
    return high


def pack_position(ledger: int, entry: int, base: int) -> int:
    """:func:`pack` of one position that fits, ledger not -1, in Python integers."""
    return ((ledger + 1 - base) << ENTRY_BITS) | (entry + 1)


def next_entries_fit(*next_entries: I64) -> bool:
    """Are all entry + 1 in [0, 2**32), so entries in [-1, MAX_KEYED_ENTRY]? One OR over
    each array: a value outside sets a bit above the low 32 (a negative one, all of them)."""
    bits = 0
    for a in next_entries:
        bits |= int(np.bitwise_or.reduce(a, axis=None)) if a.size else 0
    return bits >> ENTRY_BITS == 0


def unpack(keys: I64, base: int) -> tuple[I64, I64]:
    """(ledgers, entries) of based keys."""
    high = keys >> ENTRY_BITS
    ledgers = high + (base - 1)
    if base != 0:
        ledgers[high == 0] = -1
    return ledgers, (keys & ENTRY_MASK) - 1


def rebase(keys: I64, base: int, to: int) -> I64:
    """The same positions (sorted keys) as keys of base ``to`` (<= ``base``); ledger -1
    stays at 0."""
    first = int(sorting.searchsorted(keys, 1 << ENTRY_BITS))
    if to == base or first == len(keys):  # nothing to move (a far base may not fit int64)
        return keys
    out = keys.copy()
    out[first:] += (base - to) << ENTRY_BITS
    return out


def ledger_of(key: int, base: int) -> int:
    high = key >> ENTRY_BITS
    return -1 if high == 0 else high + base - 1


# ------------------------------------------------------- interval algebra on keys

#: An operand at least this many times smaller than the other is walked range by range
#: (binary searches into the larger, then work in proportion to the output); operands
#: of similar size take one merged sweep.
_SMALL = 8
#: Up to this many runs are copied as slices; more are gathered through one index array.
_FEW_RUNS = 16
#: Operands of at most this many intervals together are combined in Python lists: a
#: cursor's few ranges meet a mapping's few runs on every sync, where each numpy call's
#: fixed cost is most of the work.
_FEW_INTERVALS = 12


def merge(lo: Keys, hi: Keys) -> tuple[Keys, Keys]:
    """Canonicalise (lo, hi] key intervals: drop empties, sort, merge overlaps and touches.

    Canonical input costs one comparison per interval; sorted input whose neighbours
    at most touch (a monotone map of canonical bounds, runs cut at segment ends) two and
    a copy; only unsorted input is sorted.
    """
    keep = lo < hi
    if not keep.all():
        lo, hi = lo[keep], hi[keep]
    if len(lo) < 2:
        return lo, hi
    gap = hi[:-1] < lo[1:]
    if gap.all():
        return lo, hi
    if (hi[:-1] <= lo[1:]).all():
        # Sorted, and neighbours at most touch: each touching pair joins.
        return lo[np.append(True, gap)], hi[np.append(gap, True)]
    if not (lo[1:] >= lo[:-1]).all():
        order = sorting.argsort(lo)
        lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    # A new interval starts where it begins strictly after everything before it ends.
    starts = np.concatenate(([True], lo[1:] > reach[:-1]))
    idx = np.flatnonzero(starts)
    ends = np.concatenate((idx[1:] - 1, [len(lo) - 1]))
    return lo[idx], reach[ends]


def combine(
    alo: Keys, ahi: Keys, blo: Keys, bhi: Keys, op: str
) -> tuple[Keys, Keys]:
    """Boolean combination of two canonical key interval sets, by an event sweep.

    Events count +1/-1 for A's lo/hi and +2/-2 for B's, so the running sum is
    (in A) + 2 * (in B). A stable sort of the four sorted runs (every lo before
    every hi) orders equal keys lo first, so at one key the sum only rises, then
    only falls: where the selection starts and ends alternate, and an interval
    opened and closed at the same key is empty and dropped.
    """
    na, nb = len(alo), len(blo)
    if na + nb == 0:
        return _empty(alo), _empty(ahi)
    keys = np.concatenate((alo, blo, ahi, bhi))
    code = np.repeat(np.array([1, 2, -1, -2], dtype=np.int8), [na, nb, na, nb])
    order = sorting.argsort(keys)
    keys = keys[order]
    cover = np.cumsum(code[order], dtype=np.int8)
    if op == "and":
        sel = cover == 3
    elif op == "or":
        sel = cover > 0
    else:  # "sub"
        sel = cover == 1
    # Nothing is selected before the first event or after the last.
    edges = np.flatnonzero(sel[1:] != sel[:-1]) + 1
    if sel[0]:
        edges = np.append(0, edges)
    lo, hi = keys[edges[0::2]], keys[edges[1::2]]
    keep = lo < hi
    return lo[keep], hi[keep]


#: Per sweep count (in A + 2 * in B), whether the result holds the key: or, and, sub.
_SELECTS = {"or": (False, True, True, True), "and": (False, False, False, True),
            "sub": (False, True, False, False)}


def sweep_few(alo: I64, ahi: I64, blo: I64, bhi: I64, op: str) -> tuple[I64, I64]:
    """:func:`combine` on Python ints, for a handful of intervals: the same events in the
    same order (a lo sorts before a hi at one key), the same selection."""
    events = sorted([*((k, 0, 1) for k in alo.tolist()), *((k, 0, 2) for k in blo.tolist()),
                     *((k, 1, -1) for k in ahi.tolist()), *((k, 1, -2) for k in bhi.tolist())])
    select = _SELECTS[op]
    cover, inside = 0, False
    lo: list[int] = []
    hi: list[int] = []
    for key, _, code in events:
        cover += code
        if select[cover] != inside:
            inside = not inside
            (lo if inside else hi).append(key)
    kept = [(a, b) for a, b in zip(lo, hi, strict=True) if a < b]
    return (np.array([a for a, _ in kept], np.int64),
            np.array([b for _, b in kept], np.int64))


def _empty(keys: Keys) -> Keys:
    """No keys, of the same kind as ``keys``: not a view of it, which would keep its whole
    buffer alive for as long as the (often long-kept) empty answer lives."""
    return _NO_KEYS if keys.dtype == np.int64 else keys[:0].copy()


_NO_KEYS: I64 = np.empty(0, np.int64)
_NO_KEYS.setflags(write=False)


def _aranges(starts: I64, stops: I64) -> I64:
    """starts[0]..stops[0]-1, then starts[1]..stops[1]-1, and so on, in one array."""
    counts = stops - starts
    offsets = np.cumsum(counts) - counts
    out: I64 = np.arange(int(counts.sum()), dtype=np.int64)
    out += np.repeat(starts - offsets, counts)
    return out


def _take_runs(starts: I64, stops: I64, *arrays: I64) -> list[I64]:
    """For each array, a new one of a[starts[0]:stops[0]], a[starts[1]:stops[1]], ..."""
    if len(starts) <= _FEW_RUNS:
        cuts = list(zip(starts.tolist(), stops.tolist(), strict=True))
        return [np.concatenate([a[:0], *(a[i:j] for i, j in cuts)]) for a in arrays]
    at = _aranges(starts, stops)
    return [a[at] for a in arrays]


def clip_runs(alo: I64, ahi: I64, blo: I64, bhi: I64) -> tuple[I64, I64, I64]:
    """For each interval of A (any, walked one by one), the intervals of canonical B that
    meet it, clipped to it; and how many each interval of A got.

    Only the first and the last interval of each run can stick out of A's interval: the
    ones between lie inside it, as B's intervals neither overlap nor touch.
    """
    j0 = sorting.searchsorted(bhi, alo, side="right")  # first of B that ends after A starts
    j1 = sorting.searchsorted(blo, ahi, side="left")   # first of B that starts at or after A ends
    counts = np.maximum(j1 - j0, 0)  # an empty interval of A meets nothing
    j1 = j0 + counts
    lo, hi = _take_runs(j0, j1, blo, bhi)
    ends = np.cumsum(counts)
    meet = counts > 0
    first, last = (ends - counts)[meet], ends[meet] - 1
    lo[first] = np.maximum(lo[first], alo[meet])
    hi[last] = np.minimum(hi[last], ahi[meet])
    return lo, hi, counts


def _complement(lo: I64, hi: I64) -> tuple[I64, I64]:
    """Every key outside the canonical intervals, as canonical intervals (open ends at
    KEY_BELOW and KEY_ABOVE, which no interval of keys reaches)."""
    return np.concatenate(([KEY_BELOW], hi)), np.concatenate((lo, [KEY_ABOVE]))


def _subtract_from(alo: I64, ahi: I64, blo: I64, bhi: I64) -> tuple[I64, I64]:
    """A - B walking A (the small side): for each interval of A, the gaps of B inside it.

    Gap k lies between B's intervals k-1 and k; the first and the last gap met can be
    cut short by A's interval, or emptied when A's interval starts or ends inside B.
    """
    m = len(blo)
    j0 = sorting.searchsorted(bhi, alo, side="right")
    j1 = sorting.searchsorted(blo, ahi, side="left")
    k = _aranges(j0, j1 + 1)
    glo = bhi[np.maximum(k - 1, 0)]
    glo[k == 0] = KEY_BELOW
    ghi = blo[np.minimum(k, m - 1)]
    ghi[k == m] = KEY_ABOVE
    counts = j1 - j0 + 1
    last = np.cumsum(counts) - 1
    first = last - counts + 1
    glo[first] = np.maximum(glo[first], alo)
    ghi[last] = np.minimum(ghi[last], ahi)
    keep = glo < ghi
    return glo[keep], ghi[keep]


def _union_small(alo: I64, ahi: I64, blo: I64, bhi: I64) -> tuple[I64, I64]:
    """A | B walking B (the small side): each interval of B swallows the intervals of A it
    meets or touches, and the rest of A is copied around them."""
    n = len(alo)
    if not len(blo) or not n:
        return (alo, ahi) if n else (blo, bhi)
    i0 = sorting.searchsorted(ahi, blo, side="left")   # first of A that reaches B's start
    i1 = sorting.searchsorted(alo, bhi, side="right")  # first of A that starts after B's end
    meet = i1 > i0
    wlo = np.where(meet, np.minimum(blo, alo[np.minimum(i0, n - 1)]), blo)
    whi = np.where(meet, np.maximum(bhi, ahi[np.maximum(i1 - 1, 0)]), bhi)
    # Widened intervals that share an interval of A, or meet, are one; both bounds are
    # non-decreasing, so a group ends where the next one starts after its end.
    g = np.flatnonzero(np.concatenate(([True], wlo[1:] > whi[:-1])))
    gend = np.append(g[1:], len(wlo)) - 1
    glo, ghi, s, e = wlo[g], whi[gend], i0[g], i1[gend]
    keep_from, keep_to = np.append(0, e), np.append(s, n)
    if len(g) <= _FEW_RUNS:
        cuts = list(zip(keep_from.tolist(), keep_to.tolist(), strict=True))
        lo_parts, hi_parts = [alo[cuts[0][0]:cuts[0][1]]], [ahi[cuts[0][0]:cuts[0][1]]]
        for r, (i, j) in enumerate(cuts[1:]):
            lo_parts += [glo[r:r + 1], alo[i:j]]
            hi_parts += [ghi[r:r + 1], ahi[i:j]]
        return np.concatenate(lo_parts), np.concatenate(hi_parts)
    kept = _aranges(keep_from, keep_to)
    dropped = e - s
    at = s - (np.cumsum(dropped) - dropped)
    return np.insert(alo[kept], at, glo), np.insert(ahi[kept], at, ghi)


def algebra(alo: I64, ahi: I64, blo: I64, bhi: I64, op: str) -> tuple[I64, I64]:
    """A op B on canonical based keys, by the cheapest exact method for the sizes."""
    n, m = len(alo), len(blo)
    if op != "sub" and n < m:
        alo, ahi, blo, bhi, n, m = blo, bhi, alo, ahi, m, n
    if m == 0 or n == 0:
        return (_empty(alo), _empty(ahi)) if op == "and" else (alo, ahi)
    if ahi[-1] < blo[0] or bhi[-1] < alo[0]:  # apart, not even touching
        if op == "and":
            return _empty(alo), _empty(ahi)
        if op == "sub":
            return alo, ahi
        first = ahi[-1] < blo[0]
        return ((np.concatenate((alo, blo)), np.concatenate((ahi, bhi))) if first
                else (np.concatenate((blo, alo)), np.concatenate((bhi, ahi))))
    if n + m <= _FEW_INTERVALS:
        return sweep_few(alo, ahi, blo, bhi, op)
    if m * _SMALL <= n:
        if op == "or":
            return _union_small(alo, ahi, blo, bhi)
        if op == "and":
            return clip_runs(blo, bhi, alo, ahi)[:2]
        return clip_runs(*_complement(blo, bhi), alo, ahi)[:2]
    if op == "sub" and n * _SMALL <= m:
        return _subtract_from(alo, ahi, blo, bhi)
    if op == "sub" and _within(alo, ahi, blo, bhi):
        # The usual answer for large operands of similar size (a cursor against its
        # previous poll, a plan against what the rule allows): a binary search per
        # range instead of the sweep.
        return _empty(alo), _empty(ahi)
    lo, hi = combine(alo, ahi, blo, bhi, op)
    return lo, hi


def _within(alo: I64, ahi: I64, blo: I64, bhi: I64) -> bool:
    """Does every interval of A lie inside one of B? Only the interval of B holding
    A's upper end can hold all of it."""
    j = sorting.searchsorted(bhi, ahi, side="left")
    return bool(j[-1] < len(bhi) and (blo[j] <= alo).all())


def covers(lo: Keys, hi: Keys, points: Keys) -> npt.NDArray[np.bool_]:
    """For each point key p: is there an interval with lo < p <= hi (lo, hi canonical)."""
    if len(lo) == 0:
        return np.zeros(len(points), dtype=bool)
    j = sorting.searchsorted(hi, points, side="left")
    inside = j < len(hi)
    jj = np.minimum(j, len(hi) - 1)
    return inside & (lo[jj] < points)


# ------------------------------------------------------------------ key spaces


class KeySpace:
    """Order-preserving packing of (ledger, entry) into one integer.

    key = rank(ledger) << shift | (entry + 1), with ranks over the ledgers in
    play. When that does not fit in int64 (absurd entry ids), keys fall back to
    exact Python ints in object arrays: slower, never wrong.
    """

    def __init__(self, ledger_arrays: Iterable[I64], entry_arrays: Iterable[I64]) -> None:
        heads = []
        for a in ledger_arrays:
            if a.size:
                # Run heads: cheap on the sorted arrays we mostly get, correct on any.
                heads.append(a[np.concatenate(([True], a[1:] != a[:-1]))])
        self.ledgers: I64 = (
            sorting.unique(np.concatenate(heads)) if heads else np.empty(0, dtype=np.int64)
        )
        max_entry = -1
        for e in entry_arrays:
            if e.size:
                lo = int(e.min())
                if lo < -1:
                    raise ValueError(f"entry id {lo} is below -1: not a Pulsar position")
                max_entry = max(max_entry, int(e.max()))
        self.shift = max(1, (max_entry + 1).bit_length())
        rank_bits = max(1, (len(self.ledgers)).bit_length())
        self.wide = self.shift + rank_bits > 62

    def pack(self, ledgers: I64, entries: I64) -> Keys:
        ranks = sorting.searchsorted(self.ledgers, ledgers)
        if self.wide:
            r = ranks.astype(object)
            e = entries.astype(object)
            return (r << self.shift) | (e + 1)  # type: ignore[no-any-return]
        return (ranks.astype(np.int64) << self.shift) | (entries + 1)

    def unpack(self, keys: Keys) -> tuple[I64, I64]:
        if self.wide:
            ranks = np.array([int(k) >> self.shift for k in keys], dtype=np.int64)
            mask = (1 << self.shift) - 1
            entries = np.array([(int(k) & mask) - 1 for k in keys], dtype=np.int64)
        else:
            k = keys.astype(np.int64)
            ranks = k >> self.shift
            entries = (k & ((1 << self.shift) - 1)) - 1
        return self.ledgers[ranks], entries


def keyspace(*bounds: I64) -> KeySpace:
    """One key space for every position of the given (n, 4) bound arrays."""
    return KeySpace(
        [b[:, c] for b in bounds for c in (0, 2)], [b[:, c] for b in bounds for c in (1, 3)]
    )


def to_keys(ks: KeySpace, b: I64) -> tuple[Keys, Keys]:
    """(lo keys, hi keys) of (n, 4) bounds."""
    return ks.pack(b[:, 0], b[:, 1]), ks.pack(b[:, 2], b[:, 3])


def from_keys(ks: KeySpace, lo: Keys, hi: Keys) -> I64:
    """(n, 4) bounds from lo and hi keys."""
    if len(lo) == 0:
        return EMPTY_BOUNDS
    ll, le = ks.unpack(lo)
    hl, he = ks.unpack(hi)
    return np.stack([ll, le, hl, he], axis=1)
