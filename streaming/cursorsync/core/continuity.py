"""Entries a source cursor covers only because their ledgers are gone.

A markDeletePosition covers every position before it, including ledgers the topic no longer
has. Normally a ledger goes only once every cursor has passed it (trimming), so what it held
was acked. But a topic deleted and created again starts on new ledgers, with ids above every
old one: its new cursor's markDeletePosition then "covers" the old topic's entries, acked or
not, and the target still holds copies of them. Comparing two observations of one cursor
finds the entries at stake: those the earlier one showed unacked, in ledgers the later one
no longer lists. Whether they went by trimming (acked) or with the topic (not acked) is a
question for the broker (:mod:`cursorsync.sync.step` asks it).
"""

from __future__ import annotations

import numpy as np

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.ranges import RangeSet


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
