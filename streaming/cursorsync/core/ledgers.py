"""The ledgers of a topic partition with their entry counts: which positions are entries."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from cursorsync.core import sorting
from cursorsync.core.keys import I64, base_for, fits, pack
from cursorsync.core.positions import Position


@dataclass(frozen=True, slots=True)
class Ledgers:
    """The ledgers of a topic partition with their entry counts, oldest first.

    From internalStats ``ledgers`` (the open ledger's count from
    ``lastConfirmedEntry``). Ledgers absent between two listed ones do not
    exist. The list is a snapshot: the last listed ledger is taken as open
    (it may have grown since), so positions inside it, like positions past
    it, are unknown and left alone by :meth:`canonical`.
    """

    ids: I64
    entries: I64
    #: Derived arrays, made on first use: a plan asks the same list many times. None until
    #: then (and again after :meth:`forget`): most lists a job holds are of idle cursors.
    _memo: dict[object, object] | None = field(default=None, init=False, repr=False,
                                               compare=False)

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, int]]) -> Ledgers:
        rows = sorted(pairs)
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        entries = np.array([r[1] for r in rows], dtype=np.int64)
        if (entries < 0).any():
            raise ValueError("a ledger cannot have a negative entry count")
        return cls(ids, entries)

    def __post_init__(self) -> None:
        self.ids.setflags(write=False)  # a value: the memo holds what is derived from it
        self.entries.setflags(write=False)
        if len(self.ids) != len(self.entries):
            raise ValueError("ledger ids and entry counts differ in length")
        if len(self.ids) > 1 and (np.diff(self.ids) <= 0).any():
            raise ValueError("ledger ids must be strictly increasing")

    def __eq__(self, other: object) -> bool:
        """The same ledgers with the same entry counts (the arrays compared by value)."""
        if not isinstance(other, Ledgers):
            return NotImplemented
        return self is other or (self.ids.tobytes() == other.ids.tobytes()
                                 and self.entries.tobytes() == other.entries.tobytes())

    def canonical(self, ledgers: I64, entries: I64) -> tuple[I64, I64]:
        """Map each position to the last existing entry at or before it.

        Entries e satisfy a < e <= b exactly when c(a) < e <= c(b), so ranges
        keep their entry sets while touching ranges across ledger ends meet.
        Positions before every entry map to (first non-empty ledger, -1).
        Positions in the last listed ledger (but its ``-1``, the end of the
        ledger before it) and past it stay as they are: an entry the snapshot
        does not show may exist there, and clamping over it would join ranges
        that an unacked entry separates.
        """
        nonempty = self.entries > 0
        ids = self.ids[nonempty]
        last = self.entries[nonempty] - 1
        if len(ids) == 0:
            return ledgers, entries
        out_l = ledgers.copy()
        out_e = entries.copy()
        known = ledgers <= self.ids[-1]
        i = sorting.searchsorted(ids, ledgers, side="right") - 1
        ic = np.maximum(i, 0)
        in_ledger = known & (i >= 0) & (ids[ic] == ledgers)
        # Inside a non-empty ledger: clamp past its end; -1 means "end of the previous one".
        clamp = in_ledger & (entries >= last[ic])
        out_e[clamp] = last[ic][clamp]
        before = in_ledger & (entries < 0)
        prev = i - 1
        has_prev = before & (prev >= 0)
        out_l[has_prev] = ids[prev[has_prev]]
        out_e[has_prev] = last[prev[has_prev]]
        # In a ledger that has no entries (or does not exist): end of the previous non-empty one.
        gap = known & ~in_ledger
        gap_prev = gap & (i >= 0)
        out_l[gap_prev] = ids[ic[gap_prev]]
        out_e[gap_prev] = last[ic[gap_prev]]
        # Before every entry.
        first = (known & (i < 0)) | (before & (prev < 0))
        out_l[first] = ids[0]
        out_e[first] = -1
        # The open ledger: what the snapshot counts is no bound.
        open_ = (ledgers == self.ids[-1]) & (entries >= 0)
        out_l[open_] = ledgers[open_]
        out_e[open_] = entries[open_]
        return out_l, out_e

    def key_base(self, base: int) -> int | None:
        """The base (<= ``base``) whose keys hold every listed ledger's entries and ``-1``, or
        None when no base does (ids below 0, spans or entry counts too wide)."""
        if not len(self.ids):
            return base
        to = min(base, base_for(int(self.ids[0])))
        top_entry = int(self.entries.max()) - 1
        return to if fits(to, int(self.ids[0]), int(self.ids[-1]), -1, top_entry) else None

    def canonical_keys(self, keys: I64, base: int) -> I64:
        """:meth:`canonical` of sorted based keys (:mod:`cursorsync.core.keys`), ``base`` from
        :meth:`key_base`: a binary search per ledger, not per key, then two passes."""
        if len(keys) == 0:
            return keys
        table = self._key_table(base)
        if table is None:
            return keys
        starts, ends, before, top = table
        # Keys from starts[j] to starts[j + 1] are in ledger j or in the gap after it: the
        # last entry at or before each is the key itself or the ledger's last entry.
        at = sorting.searchsorted(keys, starts, side="left")
        out = np.empty_like(keys)
        out[:at[0]] = before
        spans = np.diff(np.append(at, len(keys)))
        np.minimum(keys[at[0]:], np.repeat(ends, spans), out=out[at[0]:])
        # The open ledger (from its entry 0) and beyond stay as they are.
        t = int(sorting.searchsorted(keys, top, side="left"))
        out[t:] = keys[t:]
        return out

    def _key_table(self, base: int) -> tuple[I64, I64, int, int] | None:
        """For :meth:`canonical_keys` in ``base``: the keys of each non-empty ledger's first
        and last entry, of the position before them all, and of the open ledger's start."""
        memo = self._memo.get(("keys", base)) if self._memo is not None else None
        if memo is None:
            nonempty = self.entries > 0
            ids = self.ids[nonempty]
            if len(ids) == 0:
                return None
            memo = (pack(ids, np.zeros_like(ids), base, minus_one=False),
                    pack(ids, self.entries[nonempty] - 1, base, minus_one=False),
                    int(pack(ids[:1], np.array([-1]), base, minus_one=False)[0]),
                    int(pack(self.ids[-1:], np.zeros(1, np.int64), base, minus_one=False)[0]))
            self._remember(("keys", base), memo)
        return memo  # type: ignore[return-value]

    def _cumulative(self) -> I64:
        """Entries before each listed ledger, then the total."""
        cum = self._memo.get("cum") if self._memo is not None else None
        if cum is None:
            cum = np.concatenate(([0], np.cumsum(self.entries)))
            self._remember("cum", cum)
        return cum  # type: ignore[return-value]

    def _remember(self, key: object, value: object) -> None:
        if self._memo is None:
            object.__setattr__(self, "_memo", {})
        assert self._memo is not None
        self._memo[key] = value

    def forget(self) -> None:
        """Drops what was derived from the list (made again on use): for a list kept long
        while nothing asks it."""
        object.__setattr__(self, "_memo", None)

    def entries_up_to(self, ledgers: I64, entries: I64) -> I64:
        """How many existing entries lie at or before each position (past the last ledger: all)."""
        cum = self._cumulative()
        i = sorting.searchsorted(self.ids, ledgers, side="right") - 1
        ic = np.maximum(i, 0)
        exact = (i >= 0) & (self.ids[ic] == ledgers)
        within = np.clip(entries + 1, 0, self.entries[ic])
        n = np.where(exact, cum[ic] + within, cum[i + 1])
        return n.astype(np.int64)

    def entries_up_to_one(self, ledger: int, entry: int) -> int:
        """:meth:`entries_up_to` of one position, on Python ints (no array call's fixed cost)."""
        lists = self._memo.get("lists") if self._memo is not None else None
        if lists is None:
            lists = (self.ids.tolist(), self.entries.tolist(), self._cumulative().tolist())
            self._remember("lists", lists)
        ids: list[int]
        counts: list[int]
        cum: list[int]
        ids, counts, cum = lists  # type: ignore[misc]
        i = bisect_right(ids, ledger) - 1
        if i >= 0 and ids[i] == ledger:
            return int(cum[i] + min(max(entry + 1, 0), counts[i]))
        return int(cum[i + 1])

    def last_position(self) -> Position | None:
        nonempty = np.flatnonzero(self.entries > 0)
        if len(nonempty) == 0:
            return None
        k = int(nonempty[-1])
        return Position(int(self.ids[k]), int(self.entries[k]) - 1)
