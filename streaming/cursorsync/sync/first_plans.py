"""Which cursors the sync step plans a first time in a batch, when many have no plan yet.

After a start every cursor needs a first plan (about 0.4 ms of translation and a target
request each), and a start with 100,000 partitions would spend one batch of a minute or
more on them while nothing is synced. At most ``per_batch`` are planned a batch instead:
those whose source moved since their previous observation (after a start, the newest
state the tables hold), or that have none, go first; the others in turn, from where the
last batch stopped. The cursors planned already go on being synced every batch.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping

from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.sync.plans import states_equal

Key = tuple[PartitionKey, str]


class FirstPlans:
    """The turn of the never planned cursors, kept from batch to batch."""

    def __init__(self, per_batch: int | None) -> None:
        #: None: every cursor is planned in the batch that observes it.
        self.per_batch = per_batch
        #: Where the next batch's unchanged cursors start.
        self._resume: Key | None = None

    def deferred(self, latest: list[ObservedCursor], planned: Callable[[Key], bool],
                 previous: Mapping[Key, ObservedCursor]) -> set[Key]:
        """The cursors of ``latest`` (sorted, one observation each) not ``planned`` yet that
        wait for a later batch."""
        cap = self.per_batch
        if cap is None:
            return set()
        new = [o for o in latest if not planned((o.key, o.subscription))]
        if len(new) <= cap:
            self._resume = None
            return set()
        keys = [(o.key, o.subscription) for o in new]
        start = bisect.bisect_left(keys, self._resume) if self._resume else 0
        moved: list[Key] = []
        still: list[Key] = []
        for o in new[start:] + new[:start]:
            prev = previous.get((o.key, o.subscription))
            (still if prev is not None and states_equal(prev.state, o.state) else moved).append(
                (o.key, o.subscription))
        turn = moved + still
        # The unchanged ones go on in turn next time from the first left out.
        self._resume = turn[cap] if cap >= len(moved) or not still else still[0]
        return set(turn[cap:])
