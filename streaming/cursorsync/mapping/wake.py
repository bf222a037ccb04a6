"""Mapping batches on request: work the builder left for later (skipped target ids waiting
for their check) needs a batch, and Spark runs one only when a source's offset moves.

The mapping sink requests one under its query's key; the target's ``pulsar-entries``
source, reading with the same key (option ``wakeKey``), then adds one to the ``tick`` of
its next offset, and the batch that follows may have no rows. Both run on the driver, in
the job's process.
"""

from __future__ import annotations

import threading

_requested: set[str] = set()
_lock = threading.Lock()


def request(key: str) -> None:
    """Ask the source reading under ``key`` for one more batch."""
    with _lock:
        _requested.add(key)


def take(key: str) -> bool:
    """Whether a batch was requested under ``key`` since the last call (and clear it)."""
    with _lock:
        if key in _requested:
            _requested.discard(key)
            return True
        return False
