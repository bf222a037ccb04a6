"""Which skipped target ids the broker filtered out of dispatch, read off a probe cursor.

As a broker dispatches entries to a subscription, it acks on that subscription's cursor
the ones it filters out: markers, aborted transactions' messages and transaction
markers, entries whose metadata cannot be read. No consumer of any subscription is
ever given one, so each may be acked on the target. A probe subscription whose
consumer acks only cumulatively, up to a position it knows (``own``), holds as acked
past that position exactly the entries the broker filtered: one cursor read answers for
every id a target reader skipped, where a raw-entry read answers for one.

Only a run's leading filtered ids are claimed, as with a per-id check: the sync acks a
skipped run only from the entry before it, so nothing after a run's first other id could
be acked anyway. What follows that id is left to the per-id check, unless the id is
known not to exist (past its ledger's last entry): then the rest of the run does not
exist either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs


@dataclass(frozen=True)
class Split:
    """Candidate runs split by a probe cursor."""

    #: Each run's leading filtered ids.
    filtered: Runs
    #: The rest of each run that did not end in a known absent id: for a per-id check.
    left: Runs
    #: Ids dropped as known absent (past a ledger's last entry).
    absent: int


def split_filtered(candidates: Runs, acked: RangeSet, own: Position,
                   sizes: Mapping[int, int]) -> Split:
    """Split ``candidates`` (runs of skipped ids of one partition) by the probe cursor's
    acked set: an id is filtered when it is acked, after ``own`` and stored. ``sizes``:
    entry counts of the ledgers the cursor read came with (an id at or past its ledger's
    count is absent; a ledger not listed is unknown, so its ids are never filtered)."""
    rows = candidates.rows
    if not len(rows):
        return Split(Runs(), Runs(), 0)
    counts = rows[:, 2]
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    ledger = np.repeat(rows[:, 0], counts)
    entry = np.repeat(rows[:, 1], counts) + (np.arange(counts.sum()) - np.repeat(starts, counts))
    size = np.array([sizes.get(int(lg), -1) for lg in rows[:, 0]], np.int64)
    known = np.repeat(size, counts)
    exists = (known >= 0) & (entry < known)
    after = (ledger > own.ledger) | ((ledger == own.ledger) & (entry > own.entry))
    filtered = acked.contains_arrays(ledger, entry) & after & exists
    taken, left, absent = [], [], 0
    for i, (lg, first, count) in enumerate(rows.tolist()):
        mine = filtered[starts[i]:starts[i] + count]
        k = int(np.argmin(mine)) if not mine.all() else count
        if k:
            taken.append((lg, first, k))
        if k == count:
            continue
        if 0 <= size[i] <= first + k:  # the first other id does not exist, nor what follows
            absent += count - k
        else:
            left.append((lg, first + k, count - k))
    return Split(Runs.of(*taken), Runs.of(*left), absent)


__all__ = ["Split", "split_filtered"]
