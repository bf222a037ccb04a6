"""Identity alignment: pair a partition's source and target entries by digest, never guessing.

Each side's entries wait, oldest first, until they pair or are given up. A pair is made
only from a digest that is unambiguous:

* it occurs once among the source's waiting entries and once among the target's;
* no entry with that digest left the waiting ones before, paired or given up
  (:class:`Memory`): a digest seen again after one of its entries left can no longer be
  told apart (identical messages, a copy the replicator sent again, a partner that aged
  out of the window while its twin waits);
* its two entries come from one producer (their streams agree, where both are known).

Order is a check, not a guess. The replicator keeps the order of what one cluster
sends, and one producer writes to one cluster, so within one producer's stream the
pairs must keep the same order on both sides; pairs that cross another pair of the same
stream are all dropped. Entries of a stream before its last pair on a side can no
longer pair (their partners would lie before that pair's, already read) and are given
up. Between streams nothing about order follows: with three or more clusters, or a
target that also produces, the streams of different clusters interleave differently on
each side. Entries the window no longer holds are given up too.

The memory is small because of that order: per producer stream it keeps a watermark
(the latest publish time that left) and the digests that left at it. This is sound
because the digest covers the publish time (the configuration requires it for identity
evidence), so entries with one digest share it.

What no identity evidence can tell apart: identical messages (one digest and one
producer name) of which some reached one side only (kept from the other by
``replicate_to`` or TTL), or which come from two clusters whose producers share a name
(their order then differs by side). Once each side shows the digest once, two of them
may pair; they carry the same content in every field the digest covers.

Pure: numpy and the standard library.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cursorsync.core import sorting

#: The stream of an entry whose producer is not known (it pairs, but has no order of its
#: own to check against other streams).
NO_STREAM = -1
#: Publish time not known: such an entry is older than any horizon.
NO_TIME = -1


def stream_of(producer_name: str | None) -> int:
    """The stream key of a producer name (64 bits of its hash); NO_STREAM for None."""
    if producer_name is None:
        return NO_STREAM
    h = hashlib.blake2b(producer_name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big", signed=True) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass(frozen=True)
class Waiting:
    """One side's entries waiting to pair, oldest first."""

    ledger: npt.NDArray[np.int64]
    entry: npt.NDArray[np.int64]
    digest: Sequence[bytes]
    stream: npt.NDArray[np.int64]
    publish: npt.NDArray[np.int64]

    @classmethod
    def of(cls, ledger: Sequence[int], entry: Sequence[int], digest: Sequence[bytes],
           stream: Sequence[int] | None = None,
           publish: Sequence[int] | None = None) -> Waiting:
        n = len(ledger)
        return cls(np.asarray(ledger, np.int64).reshape(n), np.asarray(entry, np.int64).reshape(n),
                   list(digest),
                   np.full(n, NO_STREAM, np.int64) if stream is None
                   else np.asarray(stream, np.int64).reshape(n),
                   np.full(n, NO_TIME, np.int64) if publish is None
                   else np.asarray(publish, np.int64).reshape(n))

    def __len__(self) -> int:
        return len(self.ledger)


#: Producer streams a partition's memory keeps at most; the ones with the oldest
#: watermarks go first, and the horizon rises to the latest of theirs.
STREAMS_REMEMBERED = 4096


@dataclass(frozen=True)
class Memory:
    """What left a partition's waiting entries (paired or given up), as far as pairing
    later entries needs it.

    Per producer stream, its watermark (the latest publish time of an entry of it that
    left, on either side) and the digests that left at exactly that time. One producer's
    entries reach each side in its order, and entries with one digest share a publish
    time, so an entry that repeats a digest that left is never published after its
    stream's watermark: it is blocked. An entry published before the watermark is out of
    its stream's order (a copy sent again, or a producer clock that went back): blocked
    too. Streams the memory dropped are covered by the horizon: their entries published
    at or before it are blocked. Entries without a publish time (kept by an older state)
    are remembered by digest; past ``capacity`` of those, none of them pairs.
    """

    streams: Mapping[int, tuple[int, frozenset[bytes]]] = field(default_factory=dict)
    horizon: int | None = None
    untimed: frozenset[bytes] = frozenset()
    blind: bool = False

    def blocks(self, digest: Sequence[bytes], stream: npt.NDArray[np.int64],
               publish: npt.NDArray[np.int64]) -> np.ndarray:
        """Which entries can never pair (see the class doc)."""
        out = np.zeros(len(digest), bool)
        if not (self.streams or self.horizon is not None or self.untimed or self.blind):
            return out
        known = self.streams
        for i, (d, k, p) in enumerate(zip(digest, stream.tolist(), publish.tolist(),
                                          strict=True)):
            if p == NO_TIME:
                out[i] = self.blind or d in self.untimed
            elif (mark := known.get(k)) is not None:
                out[i] = p < mark[0] or (p == mark[0] and d in mark[1])
            else:
                out[i] = self.horizon is not None and p <= self.horizon
        return out

    def remember(self, digest: Sequence[bytes], stream: npt.NDArray[np.int64],
                 publish: npt.NDArray[np.int64], capacity: int) -> Memory:
        """This memory once the given entries left the waiting ones."""
        if not len(digest):
            return self
        streams = dict(self.streams)
        untimed = set(self.untimed)
        for d, k, p in zip(digest, stream.tolist(), publish.tolist(), strict=True):
            if p == NO_TIME:
                untimed.add(d)
                continue
            mark = streams.get(k)
            if mark is None or p > mark[0]:
                streams[k] = (p, frozenset((d,)))
            elif p == mark[0] and d not in mark[1]:
                streams[k] = (p, mark[1] | {d})
        horizon = self.horizon
        if len(streams) > STREAMS_REMEMBERED:
            by_mark = sorted(streams.items(), key=lambda kv: kv[1][0])
            cut = len(streams) - STREAMS_REMEMBERED
            latest = max(mark[0] for _, mark in by_mark[:cut])
            horizon = latest if horizon is None else max(horizon, latest)
            streams = dict(by_mark[cut:])
        blind = self.blind or len(untimed) > capacity
        return Memory(streams, horizon, frozenset() if blind else frozenset(untimed), blind)


@dataclass(frozen=True)
class Aligned:
    """What one alignment decided: the pairs (indexes into the source and the target
    waiting entries), the entries given up on each side, and the memory after it."""

    source: npt.NDArray[np.intp]
    target: npt.NDArray[np.intp]
    source_gone: npt.NDArray[np.bool_]
    target_gone: npt.NDArray[np.bool_]
    memory: Memory

    @property
    def source_kept(self) -> npt.NDArray[np.bool_]:
        """Source entries still waiting: neither paired nor given up."""
        keep = ~self.source_gone
        keep[self.source] = False
        return keep

    @property
    def target_kept(self) -> npt.NDArray[np.bool_]:
        keep = ~self.target_gone
        keep[self.target] = False
        return keep


def align(source: Waiting, target: Waiting, memory: Memory, *, window: int,
          capacity: int | None = None) -> Aligned:
    """Pair what is unambiguous, give up what can no longer pair (see the module doc).

    ``window``: entries a side keeps waiting at most (the oldest beyond it are given up);
    ``capacity``: digests of entries without a publish time the memory keeps (default:
    ``window``).
    """
    cap = window if capacity is None else capacity
    s_block = memory.blocks(source.digest, source.stream, source.publish)
    t_block = memory.blocks(target.digest, target.stream, target.publish)
    ps, pt = _unique_pairs(source.digest, target.digest, s_block, t_block)
    known = (source.stream[ps] != NO_STREAM) & (target.stream[pt] != NO_STREAM)
    same = ~known | (source.stream[ps] == target.stream[pt])
    ps, pt = ps[same], pt[same]
    ok = _uncrossed(ps, pt, source.stream[ps]) & _uncrossed(pt, ps, target.stream[pt])
    ps, pt = ps[ok], pt[ok]

    s_gone = s_block | _before_last_pair(source.stream, ps)
    t_gone = t_block | _before_last_pair(target.stream, pt)
    s_gone[ps] = False
    t_gone[pt] = False
    s_gone |= _beyond(window, s_gone, ps, len(source))
    t_gone |= _beyond(window, t_gone, pt, len(target))
    s_left = s_gone.copy()
    s_left[ps] = True
    t_left = t_gone.copy()
    t_left[pt] = True
    left = ([source.digest[i] for i in np.flatnonzero(s_left).tolist()]
            + [target.digest[i] for i in np.flatnonzero(t_left).tolist()])
    memory = memory.remember(left, np.concatenate([source.stream[s_left], target.stream[t_left]]),
                             np.concatenate([source.publish[s_left], target.publish[t_left]]), cap)
    return Aligned(ps, pt, s_gone, t_gone, memory)


def _unique_pairs(src: Sequence[bytes], tgt: Sequence[bytes], s_block: np.ndarray,
                  t_block: np.ndarray) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Index pairs of digests that occur once on each side (blocked entries count as
    occurrences, and never pair), sorted by source index."""
    empty = np.empty(0, np.intp)
    if not len(src) or not len(tgt):
        return empty, empty
    s = np.asarray(src, dtype=object)
    t = np.asarray(tgt, dtype=object)
    _, s_inv, s_cnt = np.unique(s, return_inverse=True, return_counts=True)
    _, t_inv, t_cnt = np.unique(t, return_inverse=True, return_counts=True)
    s_idx = np.flatnonzero((s_cnt[s_inv] == 1) & ~s_block)
    t_idx = np.flatnonzero((t_cnt[t_inv] == 1) & ~t_block)
    _, si, ti = np.intersect1d(s[s_idx], t[t_idx], assume_unique=True, return_indices=True)
    ps, pt = s_idx[si], t_idx[ti]
    order = sorting.argsort(ps)
    return ps[order].astype(np.intp), pt[order].astype(np.intp)


def _uncrossed(mine: np.ndarray, theirs: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """Pairs that cross no other pair of their stream: ordered by ``mine``, ``theirs``
    must rise within each stream. Pairs of an unknown stream are checked together."""
    ok = np.ones(len(mine), bool)
    if len(mine) < 2:
        return ok
    order = sorting.lexsort((mine, stream))
    st, th = stream[order], theirs[order]
    for lo, hi in _groups(st):
        if hi - lo < 2:
            continue
        seg = th[lo:hi]
        run_max = np.maximum.accumulate(seg)
        run_min_rev = np.minimum.accumulate(seg[::-1])[::-1]
        before = np.concatenate(([True], run_max[:-1] < seg[1:]))
        after = np.concatenate((run_min_rev[1:] > seg[:-1], [True]))
        ok[order[lo:hi]] = before & after
    return ok


def _groups(sorted_keys: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal keys in a sorted array."""
    if not len(sorted_keys):
        return []
    cut = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    starts = np.concatenate(([0], cut))
    ends = np.append(cut, len(sorted_keys))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _before_last_pair(stream: np.ndarray, paired: np.ndarray) -> np.ndarray:
    """Entries of a side that lie before the last paired entry of their own stream."""
    out = np.zeros(len(stream), bool)
    if not len(paired):
        return out
    keys = stream[paired]
    for key in sorting.unique(keys).tolist():
        last = int(paired[keys == key].max())
        out[:last] |= stream[:last] == key
    return out


def _beyond(window: int, gone: np.ndarray, paired: np.ndarray, n: int) -> np.ndarray:
    """The oldest entries still waiting beyond ``window`` of them."""
    waiting = ~gone
    waiting[paired] = False
    idx = np.flatnonzero(waiting)
    out = np.zeros(n, bool)
    if len(idx) > window:
        out[idx[: len(idx) - window]] = True
    return out


__all__ = ["NO_STREAM", "NO_TIME", "STREAMS_REMEMBERED", "Aligned", "Memory", "Waiting", "align",
           "stream_of"]
