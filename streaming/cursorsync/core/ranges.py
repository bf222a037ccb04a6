"""Sets of open-closed position ranges, the shape of a Pulsar cursor's acks.

A RangeSet is immutable and canonical: ranges sorted, non-empty, and neither
overlapping nor touching in position space, so equal sets are equal values.
Every operation is vectorised with numpy over the ranges (never over entries):
positions are packed into one comparable integer key per bound, relative to
the ledgers in play, and the interval algebra runs on the keys.

Position space is not entry space: ``(1:9..2:-1]`` holds no entry, and
``(1:5..1:9]`` and ``(2:-1..2:3]`` are contiguous entries when ledger 1 ends at
entry 9. Where the entry count of each ledger is known (internalStats
``ledgers``), :class:`Ledgers` maps bounds to existing entries so that such
ranges fold the way the broker folds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from cursorsync.core.keys import EMPTY_BOUNDS, I64, Keys, KeySpace, from_keys, keyspace, to_keys
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import (
    MIN_POSITION,
    Position,
    format_range_bounds,
    parse_range_bounds,
)

_EMPTY = EMPTY_BOUNDS


def _merge(lo: Keys, hi: Keys) -> tuple[Keys, Keys]:
    """Canonicalise (lo, hi] key intervals: drop empties, sort, merge overlaps and touches."""
    keep = lo < hi
    lo, hi = lo[keep], hi[keep]
    if len(lo) == 0:
        return lo, hi
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    # A new interval starts where it begins strictly after everything before it ends.
    starts = np.concatenate(([True], lo[1:] > reach[:-1]))
    idx = np.flatnonzero(starts)
    ends = np.concatenate((idx[1:] - 1, [len(lo) - 1]))
    return lo[idx], reach[ends]


def _combine(
    alo: Keys, ahi: Keys, blo: Keys, bhi: Keys, op: str
) -> tuple[Keys, Keys]:
    """Boolean combination of two canonical key interval sets, by an event sweep.

    Each set's bounds interleave into one sorted run, so a stable sort of the
    two runs is a linear merge; running coverage counts then say, for the gap
    after each distinct key, whether it is in A and in B.
    """
    na = len(alo)
    keys = np.concatenate((np.stack([alo, ahi], axis=1).ravel(),
                           np.stack([blo, bhi], axis=1).ravel()))
    if len(keys) == 0:
        return alo[:0], ahi[:0]
    da = np.zeros(len(keys), dtype=np.int8)
    db = np.zeros(len(keys), dtype=np.int8)
    da[0:2 * na:2], da[1:2 * na:2] = 1, -1
    db[2 * na::2], db[2 * na + 1::2] = 1, -1
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    ca = np.cumsum(da[order], dtype=np.int32)
    cb = np.cumsum(db[order], dtype=np.int32)
    # Coverage after the last event at each distinct key holds until the next key.
    last = np.concatenate((keys[1:] != keys[:-1], [True]))
    keys, ca, cb = keys[last], ca[last], cb[last]
    ina, inb = ca > 0, cb > 0
    if op == "and":
        sel = ina & inb
    elif op == "or":
        sel = ina | inb
    else:  # "sub"
        sel = ina & ~inb
    sel = sel[:-1]  # nothing is covered after the last key
    idx = np.flatnonzero(sel)
    if len(idx) == 0:
        return keys[:0], keys[:0]
    run_start = np.concatenate(([True], idx[1:] != idx[:-1] + 1))
    starts = idx[run_start]
    ends = idx[np.concatenate((run_start[1:], [True]))]
    return keys[starts], keys[ends + 1]


def _covers(lo: Keys, hi: Keys, points: Keys) -> npt.NDArray[np.bool_]:
    """For each point key p: is there an interval with lo < p <= hi (lo, hi canonical)."""
    if len(lo) == 0:
        return np.zeros(len(points), dtype=bool)
    j = np.searchsorted(hi, points, side="left")
    inside = j < len(hi)
    jj = np.minimum(j, len(hi) - 1)
    return inside & (lo[jj] < points)


def _search(ledgers: I64, entries: I64, pos: tuple[int, int], side: str) -> int:
    """searchsorted for one position in position-sorted (ledger, entry) columns."""
    lo = int(np.searchsorted(ledgers, pos[0], side="left"))
    hi = int(np.searchsorted(ledgers, pos[0], side="right"))
    return lo + int(np.searchsorted(entries[lo:hi], pos[1], side=side))  # type: ignore[call-overload]


# ----------------------------------------------------------------------- rangeset


class RangeSet:
    """An immutable, canonical set of open-closed position ranges ``(lo..hi]``.

    Invariant (checked by :meth:`is_canonical`): rows sorted by lo, lo < hi,
    and hi[i] < lo[i+1] (no overlap, no touch). Operators have named twins:
    ``|`` union, ``&`` intersection, ``-`` difference, ``in`` contains.
    """

    __slots__ = ("_b",)

    def __init__(self, bounds: I64 | None = None, *, _canonical: bool = False) -> None:
        b = _EMPTY if bounds is None else np.asarray(bounds, dtype=np.int64).reshape(-1, 4)
        if not _canonical and len(b):
            ks = keyspace(b)
            lo, hi = _merge(*to_keys(ks, b))
            b = from_keys(ks, lo, hi)
        b.setflags(write=False)
        self._b: I64 = b

    # -- construction
    @classmethod
    def of(cls, *ranges: tuple[Position | str, Position | str]) -> RangeSet:
        rows = []
        for lo, hi in ranges:
            a = lo if isinstance(lo, Position) else Position.parse(lo)
            b = hi if isinstance(hi, Position) else Position.parse(hi)
            rows.append((a.ledger, a.entry, b.ledger, b.entry))
        return cls(np.array(rows, dtype=np.int64).reshape(-1, 4))

    @classmethod
    def parse(cls, text: str) -> RangeSet:
        """From an admin-stats string such as ``[(1:5..1:6],(1:8..1:9]]``; ValueError names a
        range whose end is not after its start (Pulsar writes none)."""
        b = parse_range_bounds(text)
        backwards = (b[:, 2] < b[:, 0]) | ((b[:, 2] == b[:, 0]) & (b[:, 3] <= b[:, 1]))
        if backwards.any():
            i = int(np.flatnonzero(backwards)[0])
            lo, hi = b[i].tolist()[:2], b[i].tolist()[2:]
            raise ValueError(f"range {i} of {text[:200]!r}, ({lo[0]}:{lo[1]}..{hi[0]}:{hi[1]}],"
                             " does not end after it starts")
        return cls(b)

    @classmethod
    def up_to(cls, position: Position) -> RangeSet:
        """Everything at or before ``position``: what a markDeletePosition acks."""
        if position <= MIN_POSITION:
            return cls()
        return cls(
            np.array([[MIN_POSITION.ledger, MIN_POSITION.entry, position.ledger, position.entry]])
        )

    @classmethod
    def entries(cls, ledger: I64, first: I64, count: I64) -> RangeSet:
        """Runs of ``count`` entries from ``ledger:first``, as ranges."""
        ledger = np.asarray(ledger, dtype=np.int64)
        first = np.asarray(first, dtype=np.int64)
        count = np.asarray(count, dtype=np.int64)
        return cls(np.stack([ledger, first - 1, ledger, first + count - 1], axis=1))

    # -- access
    @property
    def bounds(self) -> I64:
        """(n, 4) read-only array: lo ledger, lo entry, hi ledger, hi entry."""
        return self._b

    def __len__(self) -> int:
        return len(self._b)

    def __bool__(self) -> bool:
        return len(self._b) > 0

    def __iter__(self) -> Iterator[tuple[Position, Position]]:
        for a, b, c, d in self._b.tolist():
            yield Position(a, b), Position(c, d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and np.array_equal(self._b, other._b)

    def __hash__(self) -> int:
        return hash(self._b.tobytes())

    def __repr__(self) -> str:
        text = str(self)
        return f"RangeSet({text if len(text) < 200 else text[:200] + '...'})"

    def __str__(self) -> str:
        return format_range_bounds(self._b)

    def is_canonical(self) -> bool:
        if len(self._b) == 0:
            return True
        ks = keyspace(self._b)
        lo, hi = to_keys(ks, self._b)
        return bool((lo < hi).all() and (hi[:-1] < lo[1:]).all())

    # -- algebra
    def _binary(self, other: RangeSet, op: str) -> RangeSet:
        if len(other) == 1 and len(self) > 64:
            return self._with_one(other._b[0], op)
        ks = keyspace(self._b, other._b)
        alo, ahi = to_keys(ks, self._b)
        blo, bhi = to_keys(ks, other._b)
        lo, hi = _combine(alo, ahi, blo, bhi, op)
        return RangeSet(from_keys(ks, lo, hi), _canonical=True)

    def _with_one(self, r: I64, op: str) -> RangeSet:
        """self op (a..b] in O(log n) searches plus one copy: cursor-sized sets meet single
        ranges (a markDeletePosition, a horizon) on every sync."""
        b = self._b
        a_pos = (int(r[0]), int(r[1]))
        z_pos = (int(r[2]), int(r[3]))
        if op == "or":
            i0 = _search(b[:, 2], b[:, 3], a_pos, "left")    # first hi >= a (touch merges)
            i1 = _search(b[:, 0], b[:, 1], z_pos, "right")   # first lo > b
        else:
            i0 = _search(b[:, 2], b[:, 3], a_pos, "right")   # first hi > a (overlap)
            i1 = _search(b[:, 0], b[:, 1], z_pos, "left")    # first lo >= b
        mid = b[i0:i1]
        if op == "or":
            lo = min(a_pos, (int(mid[0, 0]), int(mid[0, 1]))) if len(mid) else a_pos
            hi = max(z_pos, (int(mid[-1, 2]), int(mid[-1, 3]))) if len(mid) else z_pos
            piece = np.array([[lo[0], lo[1], hi[0], hi[1]]], dtype=np.int64)
            out = np.concatenate((b[:i0], piece, b[i1:]))
        elif op == "and":
            out = mid.copy()
            if len(out):
                if (int(out[0, 0]), int(out[0, 1])) < a_pos:
                    out[0, 0:2] = a_pos
                if (int(out[-1, 2]), int(out[-1, 3])) > z_pos:
                    out[-1, 2:4] = z_pos
        else:  # difference
            keep = []
            if len(mid):
                if (int(mid[0, 0]), int(mid[0, 1])) < a_pos:
                    keep.append([mid[0, 0], mid[0, 1], a_pos[0], a_pos[1]])
                if (int(mid[-1, 2]), int(mid[-1, 3])) > z_pos:
                    keep.append([z_pos[0], z_pos[1], mid[-1, 2], mid[-1, 3]])
            piece = np.array(keep, dtype=np.int64).reshape(-1, 4)
            out = np.concatenate((b[:i0], piece, b[i1:]))
        return RangeSet(out, _canonical=True)

    def union(self, other: RangeSet) -> RangeSet:
        if not other:
            return self
        if not self:
            return other
        if len(self) == 1 and len(other) > 1:
            return other._binary(self, "or")
        return self._binary(other, "or")

    def intersection(self, other: RangeSet) -> RangeSet:
        if not self or not other:
            return RangeSet()
        if len(self) == 1 and len(other) > 1:
            return other._binary(self, "and")
        return self._binary(other, "and")

    def difference(self, other: RangeSet) -> RangeSet:
        if not self or not other:
            return self
        return self._binary(other, "sub")

    __or__ = union
    __and__ = intersection
    __sub__ = difference

    def contains(self, position: Position) -> bool:
        """Is ``position`` inside some range (lo < position <= hi)?"""
        return bool(self.contains_many([position])[0])

    def __contains__(self, position: object) -> bool:
        return isinstance(position, Position) and self.contains(position)

    def contains_many(self, positions: Iterable[Position]) -> npt.NDArray[np.bool_]:
        pts = list(positions)
        pl = np.array([p.ledger for p in pts], dtype=np.int64)
        pe = np.array([p.entry for p in pts], dtype=np.int64)
        return self.contains_arrays(pl, pe)

    def contains_arrays(self, ledgers: I64, entries: I64) -> npt.NDArray[np.bool_]:
        if len(self._b) == 0 or len(ledgers) == 0:
            return np.zeros(len(ledgers), dtype=bool)
        ks = KeySpace(
            [self._b[:, 0], self._b[:, 2], ledgers], [self._b[:, 1], self._b[:, 3], entries]
        )
        lo, hi = to_keys(ks, self._b)
        return _covers(lo, hi, ks.pack(ledgers, entries))

    # -- ledger-aware views
    def canonical(self, ledgers: Ledgers | None) -> RangeSet:
        """The same entries with bounds moved onto existing entries, so ledger ends fold."""
        if ledgers is None or not self:
            return self
        ll, le = ledgers.canonical(self._b[:, 0], self._b[:, 1])
        hl, he = ledgers.canonical(self._b[:, 2], self._b[:, 3])
        return RangeSet(np.stack([ll, le, hl, he], axis=1))

    def count_entries(self, ledgers: Ledgers | None = None) -> int:
        """Entries inside the ranges.

        Exact with ``ledgers`` (entries past the last known ledger are not
        counted); without, ranges that span ledgers count only the entries of
        their last ledger, so the result is a lower bound.
        """
        b = self._b
        if len(b) == 0:
            return 0
        if ledgers is not None and len(ledgers.ids):
            n = ledgers.entries_up_to(b[:, 2], b[:, 3]) - ledgers.entries_up_to(b[:, 0], b[:, 1])
            return int(np.maximum(n, 0).sum())
        same = b[:, 0] == b[:, 2]
        n = np.where(same, b[:, 3] - b[:, 1], b[:, 3] + 1)
        return int(np.maximum(n, 0).sum())

    def iter_entries(self, ledgers: Ledgers | None = None) -> Iterator[Position]:
        """Every entry inside the ranges, in order. Per-entry: for emission and tests only.

        With ``ledgers``, only entries that exist in them (as :meth:`count_entries`
        counts); without, ranges must stay within one ledger.
        """
        if ledgers is None:
            for a, b, c, d in self._b.tolist():
                if a != c:
                    raise ValueError(
                        f"range ({a}:{b}..{c}:{d}] spans ledgers; its entries need the ledger list"
                    )
                for e in range(max(b + 1, 0), d + 1):
                    yield Position(a, e)
            return
        known = list(zip(ledgers.ids.tolist(), ledgers.entries.tolist(), strict=True))
        for a, b, c, d in self._b.tolist():
            for lid, n in known:
                if lid < a or lid > c:
                    continue
                lo = b + 1 if lid == a else 0
                hi = d if lid == c else n - 1
                for e in range(max(lo, 0), min(hi, n - 1) + 1):
                    yield Position(lid, e)

    def after(self, position: Position) -> RangeSet:
        """The part strictly after ``position``."""
        return self - RangeSet.up_to(position)
