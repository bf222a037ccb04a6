"""The collector paused while batches run: across the two sinks' threads, it resumes once
neither is in a batch, and cycles a batch leaves are collected after it."""

from __future__ import annotations

import gc
import threading
import weakref

from cursorsync import gc_pause


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_paused_while_any_batch_runs_and_the_cycles_collected_after() -> None:
    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other_batch() -> None:
        with gc_pause.paused():
            inside.set()
            leave.wait(10)

    other = threading.Thread(target=other_batch)
    with gc_pause.paused():
        assert not gc.isenabled()
        other.start()
        assert inside.wait(10)
        node = _Node()
        ref = weakref.ref(node)
        del node
    assert not gc.isenabled(), "the other batch still runs"
    assert ref() is not None, "nothing collected while a batch runs"
    leave.set()
    other.join(10)
    assert gc.isenabled()
    assert ref() is None, "the cycle is collected once both are out"


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_error_in_a_batch_resumes_the_collector() -> None:
    try:
        with gc_pause.paused():
            raise RuntimeError("batch failed")
    except RuntimeError:
        pass
    assert gc.isenabled()
