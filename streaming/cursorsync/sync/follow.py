"""The sync follows the mapping: an ack whose entry is not mapped yet waits for the next
sync batch, and the next poll of the source comes only a trigger interval later. While the
last sync batch left acked source entries unmapped, each mapping batch that commits asks the
``pulsar-cursors`` source to poll again now (:mod:`cursorsync.wake`, ``sync-wake``); the
source takes such a request at most every half interval, so it polls at most twice as
often as without it, and only while acks wait."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cursorsync import wake

#: The request file, under the job's checkpoint directory.
SYNC_WAKE = "sync-wake"
#: Of the poll interval: the least time between a poll and one a request brings forward.
WAKE_MIN_GAP = 0.5


class FollowMapping:
    """Asks for a poll when the mapping commits while ``waiting()`` says the sync waits for
    it (the sync sink's last batch left acked source entries unmapped)."""

    def __init__(self, path: str | Path, waiting: Callable[[], bool]) -> None:
        self.path = Path(path)
        self.waiting = waiting
        #: Requests only grow, across restarts too.
        self.number = wake.requested(self.path)

    def mapping_committed(self) -> None:
        """A mapping batch committed: ask for a poll if the sync waits for the mapping."""
        if self.waiting():
            self.number += 1
            wake.request(self.path, self.number)


__all__ = ["SYNC_WAKE", "WAKE_MIN_GAP", "FollowMapping"]
