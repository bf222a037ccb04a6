"""Snapshot anchors: what Pulsar's replicated-subscription snapshots say about the two copies
of a topic partition, and the two ways the sync uses it.

A SNAPSHOT marker on the source pairs ``S``, where the target's answer to a snapshot request
landed on the source, with ``T``, the target's last position when it answered. Replication
keeps a partition's order and copies an entry only after the source has stored it, so a
target entry at or before ``T`` that came from the source was stored on the source before
the answer was: its source entry is before ``S``. Nothing is said about source entries
before ``S`` (their copies may land after ``T``).

* **Acks.** Once the source's markDeletePosition is at or past ``S``, every source entry
  before ``S`` is acked, so every target entry at or before ``T`` that came from the source
  may be acked: the target follows the source to the newest such anchor, never past it.
  Which target entries came from the source is not the anchor's to say; the caller passes
  them (entries known to be copies, mapped or not).
* **Cross-check.** A segment that maps a source entry at or after ``S`` to a target entry
  at or before ``T`` contradicts the anchor: one of the two is wrong, and the topic's plan
  is refused rather than guessed. A check is only as good as the anchors already read, so
  with snapshot evidence on, a segment is trusted only up to the newest anchor's ``T``
  (:meth:`cursorsync.core.segments.TopicMapping.vouched`): nothing is acked that no anchor
  has checked yet.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cursorsync.core import sorting
from cursorsync.core.keys import I64
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet

#: Anchors compared with the segments at once in :meth:`Anchors.contradictions`.
_BLOCK = 512


class Anchors:
    """The anchors of one topic partition: rows ``(S ledger, S entry, T ledger, T entry)``,
    sorted and without duplicates."""

    __slots__ = ("_a",)

    def __init__(self, rows: I64 | None = None) -> None:
        a = np.empty((0, 4), np.int64) if rows is None else np.asarray(rows, np.int64)
        a = a.reshape(-1, 4)
        if len(a):
            if (a[:, 1] < 0).any() or (a[:, 3] < 0).any():
                raise ValueError(f"an anchor names an entry before 0: {a.tolist()[:5]}")
            a = np.unique(a, axis=0)
        a.setflags(write=False)
        self._a: I64 = a

    @classmethod
    def canonical(cls, rows: I64) -> Anchors:
        """Rows already sorted and without duplicates (another Anchors' rows), kept as
        they are."""
        anchors = cls.__new__(cls)
        rows.setflags(write=False)
        anchors._a = rows
        return anchors

    @classmethod
    def of(cls, *pairs: tuple[Position, Position]) -> Anchors:
        return cls(np.array([(s.ledger, s.entry, t.ledger, t.entry) for s, t in pairs],
                            np.int64).reshape(-1, 4))

    @property
    def rows(self) -> I64:
        return self._a

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Iterator[tuple[Position, Position]]:
        return iter([(Position(a, b), Position(c, d)) for a, b, c, d in self._a.tolist()])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Anchors) and np.array_equal(self._a, other._a)

    def __hash__(self) -> int:
        return hash(self._a.tobytes())

    def __repr__(self) -> str:
        return f"Anchors({[f'{s}->{t}' for s, t in self]})"

    def union(self, other: Anchors) -> Anchors:
        if not len(other):
            return self
        if not len(self):
            return other
        return Anchors(np.concatenate([self._a, other._a]))

    def newest_target(self) -> Position | None:
        """The furthest target position any anchor names (None: no anchor)."""
        a = self._a
        if not len(a):
            return None
        top = a[sorting.lexsort((a[:, 3], a[:, 2]))[-1]]
        return Position(int(top[2]), int(top[3]))

    def licensed(self, source_mark_delete: Position) -> Position | None:
        """The furthest target position the anchors let the target's markDeletePosition
        reach for this source markDeletePosition (None: no anchor is at or before it)."""
        a = self._a
        ok = _le(a[:, 0], a[:, 1], source_mark_delete.ledger, source_mark_delete.entry)
        if not ok.any():
            return None
        t = a[ok][:, 2:]
        best = t[sorting.lexsort((t[:, 1], t[:, 0]))[-1]]
        return Position(int(best[0]), int(best[1]))

    def acks(self, source_mark_delete: Position, copies: RangeSet) -> RangeSet:
        """The target entries among ``copies`` (entries that came from the source) the
        anchors license for this source markDeletePosition."""
        top = self.licensed(source_mark_delete)
        if top is None or not copies:
            return RangeSet()
        return copies & RangeSet.up_to(top)

    def contradictions(self, segments: I64, *, after_target: Position | None = None,
                       limit: int = 10) -> list[str]:
        """Anchor-segment pairs that cannot both be right, described (at most ``limit``).

        ``segments`` are segment rows ``(sl, se, tl, te, count)``, each within one ledger on
        either side. With ``after_target``, only anchors and segments reaching past it are
        compared: what lies at or before it on the target is acked and settled already.
        """
        a, g = self._a, np.asarray(segments, np.int64).reshape(-1, 5)
        if not len(a) or not len(g):
            return []
        if after_target is not None:
            al, ae = after_target.ledger, after_target.entry
            a = a[~_le(a[:, 2], a[:, 3], al, ae)]
            g = g[~_le(g[:, 2], g[:, 3] + g[:, 4] - 1, al, ae)]
            if not len(a) or not len(g):
                return []
        sl, se, tl, te, n = (g[:, i:i + 1] for i in range(5))
        found: list[str] = []
        for start in range(0, len(a), _BLOCK):
            blk = a[start:start + _BLOCK]
            s_l, s_e, t_l, t_e = (blk[:, i][None, :] for i in range(4))
            # Offsets k of the segment's entries: target at or before T for k <= k_t;
            # source at or after S for k >= k_s.
            k_t = np.where(tl < t_l, n - 1, np.where(tl == t_l, t_e - te, -1))
            k_s = np.where(sl > s_l, 0, np.where(sl == s_l, s_e - se, n))
            bad = np.maximum(k_s, 0) <= np.minimum(k_t, n - 1)
            for gi, ai in zip(*np.nonzero(bad), strict=True):
                seg = g[gi].tolist()
                s_l_, s_e_, t_l_, t_e_ = blk[ai].tolist()
                k = max(int(k_s[gi, ai]), 0)
                found.append(
                    f"segment {seg[0]}:{seg[1]}+{seg[4]}->{seg[2]}:{seg[3]} maps source "
                    f"{seg[0]}:{seg[1] + k} to target {seg[2]}:{seg[3] + k}, but snapshot "
                    f"anchor {s_l_}:{s_e_}->{t_l_}:{t_e_} says every target entry at or "
                    f"before {t_l_}:{t_e_} came from a source entry before {s_l_}:{s_e_}")
                if len(found) >= limit:
                    return found
        return found


def _le(ledger: np.ndarray, entry: np.ndarray, pl: int | np.ndarray,
        pe: int | np.ndarray) -> np.ndarray:
    """Positions (ledger, entry) at or before (pl, pe), elementwise."""
    out: np.ndarray = (ledger < pl) | ((ledger == pl) & (entry <= pe))
    return out


__all__ = ["Anchors"]
