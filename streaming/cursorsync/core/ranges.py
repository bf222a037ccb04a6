"""Sets of open-closed position ranges, the shape of a Pulsar cursor's acks.

A RangeSet is immutable and canonical: ranges sorted, non-empty, and neither
overlapping nor touching in position space, so equal sets are equal values.
Every operation is vectorised with numpy over the ranges (never over entries):
positions are packed into one comparable integer key per bound and the interval
algebra runs on the keys. A set keeps its based keys (:mod:`cursorsync.core.keys`)
and derives its bounds array only when asked, so a chain of operations on
cursor-sized sets costs a few linear passes each; positions that based keys
cannot hold go through an exact key space per operation.

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

from cursorsync.core import sorting
from cursorsync.core.keys import (
    EMPTY_BOUNDS,
    I64,
    LEDGER_SPAN,
    KeySpace,
    algebra,
    base_for,
    combine,
    covers,
    fits,
    from_keys,
    keyspace,
    ledger_of,
    merge,
    next_entries_fit,
    pack,
    pack_next,
    pack_position,
    rebase,
    to_keys,
    unpack,
)
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import (
    MIN_POSITION,
    Position,
    format_range_bounds,
    parse_range_bounds,
)

_EMPTY = EMPTY_BOUNDS
_NO_KEYS = np.empty(0, dtype=np.int64)
_NO_KEYS.setflags(write=False)
#: (lo keys, hi keys, base) of a canonical set.
Based = tuple[I64, I64, int]


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of each span ``[start, start + length)``, one after another (an
    array's rows gathered by where each begins and how long it is)."""
    begin = np.cumsum(lengths) - lengths
    return np.repeat(starts - begin, lengths) + np.arange(int(lengths.sum()))


def _extremes(ledgers: I64, entries: I64) -> tuple[int | None, int, int, int]:
    """(smallest ledger but -1 or None, largest ledger, smallest entry, largest entry)."""
    low, top = int(ledgers.min()), int(ledgers.max())
    if low == -1:
        rest = ledgers[ledgers != -1]
        return (int(rest.min()) if rest.size else None), top, int(entries.min()), int(
            entries.max())
    return low, top, int(entries.min()), int(entries.max())


def _pack_any(ledgers: I64, entries: I64, base: int | None = None) -> tuple[I64, int] | None:
    """Based keys of arbitrary positions (in ``base`` if given), or None if they do not fit."""
    low, top, e_low, e_top = _extremes(ledgers, entries)
    if base is None:
        base = base_for(top if low is None else low)
    if not fits(base, base if low is None else low, top, e_low, e_top):
        return None
    return pack(ledgers, entries, base), base


def _based_bounds(b: I64, *, canonical: bool) -> Based | None:
    """Based keys of (n, 4) bounds, or None if they do not fit. Canonical bounds run in
    position order, so their ledgers are read off the ends, not searched."""
    if len(b) == 0:
        return _NO_KEYS, _NO_KEYS, 0
    if not canonical:
        packed = _pack_any(b[:, 0::2], b[:, 1::2])
        if packed is None:
            return None
        keys, base = packed
        return keys[:, 0].copy(), keys[:, 1].copy(), base
    ledgers = b.reshape(-1)[::2]  # lo, hi, lo, hi, ...: non-decreasing
    i = 0
    while i < len(ledgers) and i < 4 and ledgers[i] == -1:
        i += 1
    if i == 4:
        i = int(sorting.searchsorted(np.ascontiguousarray(ledgers), -1, side="right"))
    top = int(ledgers[-1])
    low = int(ledgers[i]) if i < len(ledgers) else 0
    base = base_for(low)
    lo_next, hi_next = b[:, 1] + 1, b[:, 3] + 1
    if not (fits(base, low, top, -1, -1) and next_entries_fit(lo_next, hi_next)):
        return None
    minus_one = int(ledgers[0]) == -1
    return (pack_next(b[:, 0], lo_next, base, minus_one=minus_one),
            pack_next(b[:, 2], hi_next, base, minus_one=minus_one), base)


def _common(a: Based | None, b: Based | None) -> tuple[I64, I64, I64, I64, int] | None:
    """Both sets as keys of one base (the lower; the other's keys shifted), if it holds both."""
    if a is None or b is None:
        return None
    (alo, ahi, abase), (blo, bhi, bbase) = a, b
    if abase == bbase or not len(blo):
        return alo, ahi, blo, bhi, abase
    if not len(alo):
        return alo, ahi, blo, bhi, bbase
    to = min(abase, bbase)
    xhi, xbase = (ahi, abase) if abase > to else (bhi, bbase)
    if ledger_of(int(xhi[-1]), xbase) >= to + LEDGER_SPAN:
        return None
    if abase > to:
        return rebase(alo, abase, to), rebase(ahi, abase, to), blo, bhi, to
    return alo, ahi, rebase(blo, bbase, to), rebase(bhi, bbase, to), to


# ----------------------------------------------------------------------- rangeset

_UNKNOWN, _KEYED, _UNKEYED = 0, 1, 2


#: Up to this many ranges are counted on Python ints: a cursor's few ranges are counted
#: several times in every plan, where each numpy call's fixed cost is most of the work.
_FEW_COUNTED = 16


def _count_few(rows: list[list[int]], ledgers: Ledgers | None) -> int:
    """:meth:`RangeSet.count_entries` of a few (lo, hi] bounds rows, range by range."""
    if ledgers is not None and len(ledgers.ids):
        up = ledgers.entries_up_to_one
        return sum(max(up(c, d) - up(a, e), 0) for a, e, c, d in rows)
    return sum(max(d - e if a == c else d + 1, 0) for a, e, c, d in rows)


class RangeSet:
    """An immutable, canonical set of open-closed position ranges ``(lo..hi]``.

    Invariant (checked by :meth:`is_canonical`): rows sorted by lo, lo < hi,
    and hi[i] < lo[i+1] (no overlap, no touch). Operators have named twins:
    ``|`` union, ``&`` intersection, ``-`` difference, ``in`` contains.

    Held as bounds, as based keys, or both: each is derived from the other on first use
    and kept (``_state`` says whether keys are known, or cannot hold the positions).
    """

    __slots__ = ("_b", "_base", "_hi", "_lo", "_state")

    def __init__(self, bounds: I64 | None = None, *, _canonical: bool = False) -> None:
        self._b: I64 | None = None
        self._lo: I64 = _NO_KEYS
        self._hi: I64 = _NO_KEYS
        self._base = 0
        self._state = _KEYED
        if bounds is None:
            return
        b = np.asarray(bounds, dtype=np.int64).reshape(-1, 4)
        if not len(b):
            return
        based = None if _canonical else _based_bounds(b, canonical=False)
        if based is not None:
            lo, hi = merge(based[0], based[1])
            self._set_keys(lo, hi, based[2])
            return
        if not _canonical:
            ks = keyspace(b)
            lo, hi = merge(*to_keys(ks, b))
            b = from_keys(ks, lo, hi)
        b.setflags(write=False)
        self._b = b
        self._state = _UNKNOWN

    @classmethod
    def _from_keys(cls, lo: I64, hi: I64, base: int) -> RangeSet:
        """From canonical based keys (taken, not copied)."""
        rs = cls()
        rs._set_keys(lo, hi, base)
        return rs

    def _set_keys(self, lo: I64, hi: I64, base: int) -> None:
        lo.setflags(write=False)
        hi.setflags(write=False)
        self._lo, self._hi, self._base, self._state = lo, hi, base, _KEYED

    def _keys(self) -> Based | None:
        """The based keys, or None when they cannot hold these positions."""
        if self._state == _UNKNOWN:
            assert self._b is not None
            based = _based_bounds(self._b, canonical=True)
            if based is None:
                self._state = _UNKEYED
            else:
                self._set_keys(*based)
        return (self._lo, self._hi, self._base) if self._state == _KEYED else None

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
        ledger, entry = position.ledger, position.entry
        if ledger >= 0:
            # The keys straight from the two positions: every sync makes a few of these sets.
            base = base_for(ledger)
            if fits(base, ledger, ledger, min(entry, -1), entry):
                return cls._from_keys(np.zeros(1, np.int64),  # MIN_POSITION's key
                                      np.array([pack_position(ledger, entry, base)], np.int64),
                                      base)
        return cls(
            np.array([[MIN_POSITION.ledger, MIN_POSITION.entry, position.ledger, position.entry]])
        )

    @classmethod
    def entries(cls, ledger: I64, first: I64, count: I64) -> RangeSet:
        """Runs of ``count`` entries from ``ledger:first``, as ranges."""
        if not len(ledger):
            return cls()  # most runs of a kind are none: the common case, made cheap
        ledger = np.asarray(ledger, dtype=np.int64)
        first = np.asarray(first, dtype=np.int64)
        count = np.asarray(count, dtype=np.int64)
        return cls(np.stack([ledger, first - 1, ledger, first + count - 1], axis=1))

    # -- access
    @property
    def bounds(self) -> I64:
        """(n, 4) read-only array: lo ledger, lo entry, hi ledger, hi entry."""
        if self._b is None:
            b = _EMPTY
            if len(self._lo):
                b = np.empty((len(self._lo), 4), dtype=np.int64)
                b[:, 0], b[:, 1] = unpack(self._lo, self._base)
                b[:, 2], b[:, 3] = unpack(self._hi, self._base)
            b.setflags(write=False)
            self._b = b
        return self._b

    def __len__(self) -> int:
        return len(self._lo) if self._state == _KEYED else len(self.bounds)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[tuple[Position, Position]]:
        for a, b, c, d in self.bounds.tolist():
            yield Position(a, b), Position(c, d)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return False
        if self is other:
            return True
        if len(self) != len(other):
            return False
        if not len(self):
            return True
        a, b = self._keys(), other._keys()
        if a is not None and b is not None and a[2] == b[2]:
            return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        return np.array_equal(self.bounds, other.bounds)

    def __hash__(self) -> int:
        return hash(self.bounds.tobytes())

    def __repr__(self) -> str:
        text = str(self)
        return f"RangeSet({text if len(text) < 200 else text[:200] + '...'})"

    def __str__(self) -> str:
        return format_range_bounds(self.bounds)

    def _range(self, i: int) -> tuple[Position, Position]:
        """Range ``i`` without deriving the whole bounds array."""
        if self._b is None:
            ll, le = unpack(self._lo[i:i + 1], self._base)
            hl, he = unpack(self._hi[i:i + 1], self._base)
            return Position(int(ll[0]), int(le[0])), Position(int(hl[0]), int(he[0]))
        a, b, c, d = self._b[i].tolist()
        return Position(a, b), Position(c, d)

    def is_canonical(self) -> bool:
        if not self:
            return True
        keyed = self._keys()
        if keyed is not None:
            lo, hi, _ = keyed
        else:
            ks = keyspace(self.bounds)
            lo, hi = to_keys(ks, self.bounds)
        return bool((lo < hi).all() and (hi[:-1] < lo[1:]).all())

    # -- algebra
    def _binary(self, other: RangeSet, op: str) -> RangeSet:
        both = _common(self._keys(), other._keys())
        if both is not None:
            alo, ahi, blo, bhi, base = both
            lo, hi = algebra(alo, ahi, blo, bhi, op)
            return RangeSet._from_keys(lo, hi, base)
        # Positions based keys cannot hold: exact keys over the ledgers in play.
        ks = keyspace(self.bounds, other.bounds)
        alo, ahi = to_keys(ks, self.bounds)
        blo, bhi = to_keys(ks, other.bounds)
        lo, hi = combine(alo, ahi, blo, bhi, op)
        return RangeSet(from_keys(ks, lo, hi), _canonical=True)

    def _with_one(self, r: I64, op: str) -> RangeSet:
        """self op (a..b], the row ``r`` of a canonical bounds array: cursor-sized sets meet
        single ranges (a markDeletePosition, a horizon) on every sync, which costs binary
        searches and one copy (:func:`algebra`)."""
        return self._binary(RangeSet(np.asarray(r, dtype=np.int64).reshape(1, 4),
                                     _canonical=True), op)

    def union(self, other: RangeSet) -> RangeSet:
        if not other:
            return self
        if not self:
            return other
        return self._binary(other, "or")

    def intersection(self, other: RangeSet) -> RangeSet:
        if not self or not other:
            return RangeSet()
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
        if not self or len(ledgers) == 0:
            return np.zeros(len(ledgers), dtype=bool)
        keyed = self._keys()
        if keyed is not None:
            points = _pack_any(ledgers, entries, keyed[2])
            if points is not None:
                return covers(keyed[0], keyed[1], points[0])
        b = self.bounds
        ks = KeySpace([b[:, 0], b[:, 2], ledgers], [b[:, 1], b[:, 3], entries])
        lo, hi = to_keys(ks, b)
        return covers(lo, hi, ks.pack(ledgers, entries))

    # -- ledger-aware views
    def canonical(self, ledgers: Ledgers | None) -> RangeSet:
        """The same entries with bounds moved onto existing entries, so ledger ends fold."""
        if ledgers is None or not self:
            return self
        keyed = self._keys()
        if keyed is not None:
            lo, hi, base = keyed
            to = ledgers.key_base(base)
            if to is not None and ledger_of(int(hi[-1]), base) < to + LEDGER_SPAN:
                lo, hi = rebase(lo, base, to), rebase(hi, base, to)
                # The map is monotone: bounds stay sorted, and ranges can only empty or touch.
                lo, hi = merge(ledgers.canonical_keys(lo, to), ledgers.canonical_keys(hi, to))
                return RangeSet._from_keys(lo, hi, to)
        b = self.bounds
        ll, le = ledgers.canonical(b[:, 0], b[:, 1])
        hl, he = ledgers.canonical(b[:, 2], b[:, 3])
        return RangeSet(np.stack([ll, le, hl, he], axis=1))

    def count_entries(self, ledgers: Ledgers | None = None) -> int:
        """Entries inside the ranges.

        Exact with ``ledgers`` (entries past the last known ledger are not
        counted); without, ranges that span ledgers count only the entries of
        their last ledger, so the result is a lower bound.
        """
        b = self.bounds
        if len(b) == 0:
            return 0
        if len(b) <= _FEW_COUNTED:
            return _count_few(b.tolist(), ledgers)
        if ledgers is not None and len(ledgers.ids):
            # Both ends of every range in one lookup: the low ends, then the high ends
            # (columns joined, not a strided view copied, which lets go of the lock).
            k = len(b)
            up = ledgers.entries_up_to(np.concatenate((b[:, 0], b[:, 2])),
                                       np.concatenate((b[:, 1], b[:, 3])))
            return int(np.maximum(up[k:] - up[:k], 0).sum())
        same = b[:, 0] == b[:, 2]
        n = np.where(same, b[:, 3] - b[:, 1], b[:, 3] + 1)
        return int(np.maximum(n, 0).sum())

    def iter_entries(self, ledgers: Ledgers | None = None) -> Iterator[Position]:
        """Every entry inside the ranges, in order. Per-entry: for emission and tests only.

        With ``ledgers``, only entries that exist in them (as :meth:`count_entries`
        counts); without, ranges must stay within one ledger.
        """
        if ledgers is None:
            for a, b, c, d in self.bounds.tolist():
                if a != c:
                    raise ValueError(
                        f"range ({a}:{b}..{c}:{d}] spans ledgers; its entries need the ledger list"
                    )
                for e in range(max(b + 1, 0), d + 1):
                    yield Position(a, e)
            return
        known = list(zip(ledgers.ids.tolist(), ledgers.entries.tolist(), strict=True))
        for a, b, c, d in self.bounds.tolist():
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
