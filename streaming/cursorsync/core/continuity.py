"""Entries a source cursor covers only because their ledgers are gone.

A markDeletePosition covers every position before it, including ledgers the topic no longer
has. Normally a ledger goes only once every cursor has passed it (trimming), so what it held
was acked. But a topic deleted and created again starts on new ledgers, with ids above every
old one: its new cursor's markDeletePosition then "covers" the old topic's entries, acked or
not, and the target still holds copies of them.

Two cases ask which it was. A cursor observed before: the entries the earlier observation
showed unacked, in ledgers the later one no longer lists (:func:`vanished_unacked`). A cursor
observed for the first time: the mapped entries its markDeletePosition covers in ledgers
before the first one the source lists (:func:`unlisted_copies`). Ledger ids answer without a
clock: a cluster draws every ledger id from one increasing sequence, and a topic's managed
ledger exists before it creates any ledger. So once the source names the lowest ledger id its
topic has now (data or cursor ledger; :mod:`cursorsync.sync.step` asks it), any ledger of the
topic at or above it is the same topic's (trimmed, so acked), and a ledger below it is
unknown: an older topic's, or trimmed before every ledger the topic has now. Unknown is not
acked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import SegmentSet
from cursorsync.core.translate import safe_target_acks


def vanished_unacked(previous: CursorState, current: CursorState) -> RangeSet:
    """Entries ``previous`` showed unacked whose ledgers ``current`` no longer lists and
    which ``current`` covers. Empty when either ledger list is unknown.

    The last ledger ``previous`` lists was open: all of it counts, not only the entries
    its snapshot counted.
    """
    if previous.ledgers is None or current.ledgers is None or not len(previous.ledgers.ids):
        return RangeSet()
    ids, counts = previous.ledgers.ids, previous.ledgers.entries
    if previous.ledgers is current.ledgers or ids.tobytes() == current.ledgers.ids.tobytes():
        return RangeSet()  # the usual case: the same ledgers
    gone = ~np.isin(ids, current.ledgers.ids)
    if not gone.any():
        return RangeSet()
    # Each ledger's entries as (id:-1 .. id:count-1]; the open one's as (id:-1 .. id+1:-1],
    # all it may hold.
    hi_ledger, hi_entry = ids.copy(), counts - 1
    hi_ledger[-1], hi_entry[-1] = ids[-1] + 1, -1
    keep = gone & ((hi_entry >= 0) | (hi_ledger > ids))
    if not keep.any():
        return RangeSet()
    bounds = np.stack([ids, np.full(len(ids), -1), hi_ledger, hi_entry],
                      axis=1)[keep].astype(np.int64)
    held = RangeSet(bounds)
    return (held - previous.acked()) & current.acked()


def count_vanished(previous: CursorState, vanished: RangeSet) -> int:
    """How many entries of ``vanished`` the previous ledger list counted (its open ledger as
    far as its snapshot went: at least that many)."""
    if previous.ledgers is None or not len(previous.ledgers.ids):
        return 0
    ids, counts = previous.ledgers.ids, previous.ledgers.entries
    # A ledger after the last makes the last one closed at its snapshot count.
    closed = Ledgers(np.append(ids, ids[-1] + 1), np.append(counts, 0))
    return vanished.count_entries(closed)


def same_topic(previous: Ledgers | None, first_ledger: int | None) -> bool:
    """Whether a cursor observed with the ledger list ``previous`` was observed on the topic
    whose lowest own ledger id is ``first_ledger`` now (see the module doc): some ledger it
    listed is at or above it. False when either is unknown."""
    if previous is None or not len(previous.ids) or first_ledger is None:
        return False
    return int(previous.ids.max()) >= first_ledger


def unlisted_copies(source: CursorState, segments: SegmentSet, target: CursorState,
                    before: int) -> RangeSet:
    """Target copies, not acked on the target, of source entries that ``source`` covers in
    ledgers before ``before``: what a plan from this cursor acks on the strength of ledgers
    the source may no longer list. Segments only: the evidence that names source entries."""
    rows = segments.rows
    if not len(rows) or int(rows[0, 0]) >= before:
        return RangeSet()  # the usual case: nothing mapped that early (rows sorted by source)
    covered = source.acked() & RangeSet.up_to(Position(before, -1))
    if not covered:
        return RangeSet()
    return safe_target_acks(covered, segments) - target.acked()


#: A ledger id above any: every ledger is before it.
_ANY_LEDGER = 2**62


@dataclass(frozen=True)
class Uncovered:
    """What a cursor covers only because ledgers are gone, and no ledger id shows those
    ledgers to be its topic's: unknown, so not acked."""

    #: Entries the previous observation showed unacked, in ledgers now gone.
    vanished: int = 0
    #: Target copies, not acked there, of entries the cursor covers in ledgers before any
    #: that an observation of its topic listed.
    copies: RangeSet = field(default_factory=RangeSet)

    def __bool__(self) -> bool:
        return bool(self.vanished or self.copies)


def uncovered(previous: CursorState | None, current: CursorState, segments: SegmentSet,
              target: CursorState, first_owned: int | None = None) -> Uncovered:
    """What ``current`` covers only because ledgers are gone (see the module doc), judged
    on the two observations, and on ``first_owned`` when the source was asked: the lowest
    ledger id its topic owns now.

    Without ``first_owned`` the observations alone speak: when ``previous`` listed a
    ledger at or above the first one ``current`` lists, both saw one topic, and what went
    between them went by trimming; ledgers before the first either lists are unknown.
    Nothing is found in the usual case, so the source is asked only when something is.
    """
    listed = _first(current.ledgers)
    before = None if previous is None else _first(previous.ledgers)
    continued = previous is not None and same_topic(previous.ledgers, listed)
    vanished = 0
    if previous is not None and not continued and not same_topic(previous.ledgers,
                                                                 first_owned):
        gone = vanished_unacked(previous, current)
        vanished = max(count_vanished(previous, gone), 1) if gone else 0
    bound = listed
    if continued and listed is not None and before is not None:
        bound = min(listed, before)
    if first_owned is not None and (listed is None or same_topic(current.ledgers,
                                                                 first_owned)):
        bound = first_owned if bound is None else min(bound, first_owned)
    copies = unlisted_copies(current, segments, target, _ANY_LEDGER if bound is None else bound)
    return Uncovered(vanished, copies)


def _first(ledgers: Ledgers | None) -> int | None:
    return None if ledgers is None or not len(ledgers.ids) else int(ledgers.ids[0])
