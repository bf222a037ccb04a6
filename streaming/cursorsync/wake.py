"""Batches on request, between the job's two queries: Spark runs a batch only when a
source's offset moves, and a Python data source's driver side runs in a process of its own,
not in the job's, so a request is a file.

The asking side writes a request number into a file under the job's checkpoint (numbers
only grow); the source given that file reads the largest number it has seen, and a larger
one makes it move its offset:

- ``mapping-wake``: the mapping sink asks the target's ``pulsar-entries`` source for a
  batch while skipped target ids wait for their check (the batch may have no rows);
- ``sync-wake``: while the sync waits for source acks' entries to be mapped, each mapping
  batch that commits asks the ``pulsar-cursors`` source to poll again now rather than at
  its next interval (:class:`cursorsync.sync.follow.FollowMapping`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from cursorsync.files import replace_text


def request(path: str | Path, number: int) -> None:
    """Ask the source watching ``path`` for a batch: ``number`` must exceed earlier ones."""
    replace_text(Path(path), str(int(number)))  # the source never reads half a number


def requested(path: str | Path) -> int:
    """The last request number written to ``path``; 0 when there is none."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path(path).read_text().strip() or 0)
    return 0
