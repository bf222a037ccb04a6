"""The collector paused while batches run: across the two sinks' threads, it resumes once
neither is in a batch, and cycles a batch leaves are collected after it."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

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


def test_the_first_full_collections_freeze_what_survives_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_pause, "_finished", 0)
    monkeypatch.setattr(gc_pause, "_full_due", False)
    monkeypatch.setattr(gc_pause, "_freezes_left", 2)
    gc.unfreeze()
    kept = [_Node() for _ in range(100)]
    try:
        for _ in range(gc_pause.FULL_EVERY - 1):
            with gc_pause.paused():
                pass
        assert gc.get_freeze_count() == 0, "no full collection yet"
        with gc_pause.paused():
            pass
        first = gc.get_freeze_count()
        assert first >= len(kept), "what survived the full collection is frozen"
        node = _Node()
        ref = weakref.ref(node)
        del node
        for _ in range(2 * gc_pause.FULL_EVERY):
            with gc_pause.paused():
                pass
        assert ref() is None, "a cycle made after the freeze is still collected"
        assert gc_pause._freezes_left == 0
        frozen = gc.get_freeze_count()
        for _ in range(gc_pause.FULL_EVERY):
            with gc_pause.paused():
                pass
        assert gc.get_freeze_count() == frozen, "no more freezes after FREEZES"
    finally:
        gc.unfreeze()
        del kept
