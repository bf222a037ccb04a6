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

The first FREEZES full collections also freeze what survives them (``gc.freeze``): the
modules of Spark, Arrow, Pulsar and the job's own long-lived state, which every later full
collection would walk again while it holds the interpreter, pausing both sinks and every
other thread of the driver (100-220 ms each on the test bed, every 5-6 s). What is frozen
is still freed when its last reference goes; only a cycle among it is kept.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Batches after which a full collection runs (counted over both queries).
FULL_EVERY = 20
#: Full collections after which what survives is frozen (see the module's docstring).
FREEZES = 2

_lock = threading.Lock()
_running = 0
_finished = 0
_full_due = False
_was_enabled = True
_freezes_left = FREEZES


@contextmanager
def paused() -> Iterator[None]:
    """The collector paused while any caller is inside; collections once all are out."""
    global _running, _finished, _full_due, _was_enabled, _freezes_left
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
            freeze = full and _freezes_left > 0
            if full:
                _full_due = False
            if freeze:
                _freezes_left -= 1
            if collect:
                gc.enable()
        if collect:
            gc.collect(2 if full else 1)
            if freeze:
                gc.freeze()
