"""Positions packed into one order-preserving integer key each.

Range algebra (:mod:`cursorsync.core.ranges`) and the translation's segment
joins run on these keys, so a comparison of two positions is one integer
comparison in a vectorised numpy pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
Keys = npt.NDArray[Any]  # int64, or object (Python ints) when ids are too wide to pack

#: No ranges: the (0, 4) bounds array.
EMPTY_BOUNDS = np.empty((0, 4), dtype=np.int64)



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
            np.unique(np.concatenate(heads)) if heads else np.empty(0, dtype=np.int64)
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
        ranks = np.searchsorted(self.ledgers, ledgers)
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
