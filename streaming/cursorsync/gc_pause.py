"""Python's cyclic garbage collector, paused while a batch runs.

A driver that carries many partitions holds millions of long-lived objects (mappings,
packed cursors, plans), and a batch allocates hundreds of thousands more. The collector
then runs full collections in the middle of batches, each walking every live object to
free almost nothing: nearly everything a batch drops is freed by reference counting. At
30,000 partitions that was a third of the time to parse a batch's cursor rows
(``cursorsync-dev bench plan``). So the collector is paused for each batch: a young
collection runs after it (the cycles a batch leaves are young), and a full one after
every FULL_EVERY batches. The two queries' sinks run in threads of their own; the
collector resumes once neither is in a batch.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Batches after which a full collection runs (counted over both queries).
FULL_EVERY = 20

_lock = threading.Lock()
_running = 0
_finished = 0
_full_due = False
_was_enabled = True


@contextmanager
def paused() -> Iterator[None]:
    """The collector paused while any caller is inside; collections once all are out."""
    global _running, _finished, _full_due, _was_enabled
    with _lock:
        if _running == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            _finished += 1
            _full_due = _full_due or _finished % FULL_EVERY == 0
            collect = _running == 0 and _was_enabled
            full = collect and _full_due
            if full:
                _full_due = False
            if collect:
                gc.enable()
        if collect:
            gc.collect(2 if full else 1)
