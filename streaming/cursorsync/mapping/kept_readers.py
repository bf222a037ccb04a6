"""Readers a worker process keeps open between the ranges it reads.

Opening a reader costs a round trip and a non-durable cursor on the broker (34-42 ms a
range on the test bed, idle, against about 1 ms to read the same ten entries on a reader
already open): with a thousand partitions of a few new entries each, opening is most of a
mapping batch. So a reader that read a small range to its end is kept, and the next range
of its topic that starts at or after where it stopped is read on it.

A kept reader goes on reading where it stopped: it has delivered every message it will
ever deliver up to ``at`` (the end of its last range), and ``pending`` holds the message
it delivered past that end, if any. A range may start after ``at`` (another worker read the
ranges in between): the entries reader drops what lies before the start, and gives the
reader up for a new one when that is more than :data:`FORWARD_MAX` messages. A range that
starts before ``at`` (a batch read again) gets a new reader.

Memory: up to ``limit`` readers per worker process (every client's together), each
holding up to :data:`KEPT_QUEUE` messages in its receiver queue; a reader unused for
:data:`IDLE_CLOSE_S` is closed. No Pulsar import here: the pool holds whatever the caller
gives it and closes it with ``close()``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

#: The receiver queue of a reader opened to be kept (messages): a kept reader sits with a
#: full queue between ranges, so this bounds what each one holds.
KEPT_QUEUE = 100
#: The largest range (entries) read on a kept reader; a larger one, or one of unknown size,
#: gets a reader of its own with the configured queue, closed after it.
KEEP_RANGE_MAX = 1000
#: Messages before a range's start a kept reader may drop to reach it.
FORWARD_MAX = 2 * KEPT_QUEUE
#: A kept reader unused this long is closed. Far longer than a mapping trigger: a
#: partition's ranges go to whichever worker is free, so a worker's reader of it waits a
#: trigger or more between uses (at 1,000 partitions on the test bed triggers of 25-60 s
#: closed most readers before their next range when this was a minute).
IDLE_CLOSE_S = 600.0


@dataclass
class KeptReader:
    """A reader between two ranges: everything it delivers is after ``at``, and
    ``pending`` (if not None) is the message it delivered past ``at`` and that is not read
    yet."""

    reader: Any
    at: tuple[int, int]
    pending: Any = None
    used_at: float = 0.0


class KeptReaders:
    """The kept readers of one worker process, by (connection settings, topic partition).

    Thread-safe: a task reads several ranges at once, each on a thread of its own. A
    reader taken is the taker's until it is kept again or closed.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[Hashable, str], KeptReader] = OrderedDict()
        self._clock = clock
        #: Since the process started: ranges read on a kept reader, and readers closed
        #: (read to a range's end and not kept; ahead of a range, too far behind one, idle,
        #: over the limit; or a read that failed).
        self.taken = 0
        self.closed = 0

    def __len__(self) -> int:
        return len(self._kept)

    def take(self, settings: Hashable, topic: str, start: tuple[int, int]) -> KeptReader | None:
        """The kept reader of ``topic`` if it stopped at or before ``start``; one that
        stopped after it is closed (its messages up to ``start`` are gone)."""
        self.close_idle()
        with self._lock:
            kept = self._kept.pop((settings, topic), None)
            if kept is not None and kept.at <= start:
                self.taken += 1
                return kept
        if kept is not None:
            self.close(kept)
        return None

    def drop(self, settings: Hashable, topic: str) -> None:
        """Close the kept reader of ``topic``, if any: another reader is reading past it."""
        with self._lock:
            kept = self._kept.pop((settings, topic), None)
        if kept is not None:
            self.close(kept)

    def keep(self, settings: Hashable, topic: str, kept: KeptReader, limit: int) -> None:
        """Keep ``kept`` for the next range of ``topic``; the least recently used reader is
        closed when that makes more than ``limit`` (0: ``kept`` is closed at once)."""
        kept.used_at = self._clock()
        over: list[KeptReader] = []
        with self._lock:
            old = self._kept.pop((settings, topic), None)
            if old is not None:
                over.append(old)
            if limit > 0:
                self._kept[(settings, topic)] = kept
            else:
                over.append(kept)
            while len(self._kept) > max(limit, 0):
                over.append(self._kept.popitem(last=False)[1])
        for reader in over:
            self.close(reader)

    def forget(self, settings: Hashable) -> list[KeptReader]:
        """Give up every reader of ``settings`` (their client is being closed, which closes
        them): the readers, not closed here."""
        with self._lock:
            keys = [k for k in self._kept if k[0] == settings]
            return [self._kept.pop(k) for k in keys]

    def close_idle(self) -> None:
        """Close every reader unused for IDLE_CLOSE_S."""
        now = self._clock()
        idle: list[KeptReader] = []
        with self._lock:
            while self._kept:
                key, first = next(iter(self._kept.items()))
                if now - first.used_at < IDLE_CLOSE_S:
                    break  # kept in order of use: the rest are younger
                idle.append(self._kept.pop(key))
        for reader in idle:
            self.close(reader)

    def close_all(self) -> None:
        with self._lock:
            every = list(self._kept.values())
            self._kept.clear()
        for reader in every:
            self.close(reader)

    def close(self, kept: KeptReader) -> None:
        """Close ``kept``'s reader (counted in ``closed``)."""
        self.closed += 1
        with contextlib.suppress(Exception):  # its data is not needed; best effort
            kept.reader.close()
