"""Thread kinds of a process's CPU, read from the real /proc."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import pytest

from cursorsync_devtools.testbed.cpu import (
    CpuSampler,
    DriverThreads,
    _driver_kind,
    thread_kinds_cpu_s,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

PR_SET_NAME = 15


def _named_spin(name: bytes, spent: threading.Event, stop: threading.Event) -> None:
    """Name this OS thread as a JVM would (prctl), spend 50 ms of CPU (``spent``), then
    go on spinning until ``stop``."""
    ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    while not stop.is_set():
        if time.thread_time() >= 0.05:
            spent.set()


def test_a_threads_time_counts_in_the_kind_its_name_starts() -> None:
    """A thread named as the broker's web threads are counts as its admin API; one named
    as C2's compiler thread as the JIT; other kinds stay 0."""
    before = thread_kinds_cpu_s(os.getpid())
    stop = threading.Event()
    spent = {name: threading.Event() for name in (b"pulsar-web-41-3", b"C2 CompilerThre")}
    threads = [threading.Thread(target=_named_spin, args=(name, done, stop))
               for name, done in spent.items()]
    for t in threads:
        t.start()
    try:
        assert all(done.wait(30) for done in spent.values())
        # Read while both still run: an exited thread takes its time with it.
        during = thread_kinds_cpu_s(os.getpid())
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert set(during) == {"jit", "gc", "admin api"}
    assert during["admin api"] > before["admin api"]
    assert during["jit"] > before["jit"]
    assert during["gc"] == before["gc"] == 0.0


def test_broker_threads_per_broker_and_their_difference() -> None:
    sampler = CpuSampler({"a": os.getpid(), "b": None})
    first = sampler.broker_threads()
    assert list(first) == ["broker a"]
    diff = CpuSampler.diff_threads({"broker a": {"jit": 1.0, "gc": 0.5, "admin api": 2.0}},
                                   {"broker a": {"jit": 3.5, "gc": 0.5, "admin api": 2.25}})
    assert diff == {"broker a": {"admin api": 0.25, "gc": 0.0, "jit": 2.5}}


def _spin_for(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def test_driver_threads_count_by_the_python_name_a_thread_has_now() -> None:
    """A live thread's CPU counts in the kind its name gives it now (the sinks name the thread
    Spark calls them on); a thread that ended is in ``exited threads``; nothing is lost."""
    spent = DriverThreads()
    # Not a sink's name: a sink called on this process's main thread (other unit tests)
    # names that thread so, and its time would count there.
    ended = threading.Thread(target=_spin_for, args=(0.2,), name="hole-check_0")
    ended.start()
    ended.join()
    go_on, done = threading.Event(), threading.Event()

    def renamed() -> None:
        _spin_for(0.2)
        threading.current_thread().name = "cursorsync-mapping"  # as a sink renames it
        done.set()
        go_on.wait(30)

    live = threading.Thread(target=renamed, name="Thread-7 (run)")
    live.start()
    try:
        assert done.wait(30)
        kinds = spent.spent()
    finally:
        go_on.set()
        live.join()
    # /proc counts whole clock ticks (10 ms): a few may be missing.
    assert kinds["mapping sink"] >= 0.15
    assert kinds["mapping checks"] == 0.0  # the thread that ran as it ended: its time went
    # with it
    assert kinds["exited threads"] >= 0.15
    assert set(kinds) == {"sync sink", "mapping sink", "sync lookups and reads",
                          "mapping checks", "harness", "other python", "native",
                          "exited threads"}


def test_driver_kinds_by_name_start() -> None:
    assert _driver_kind("cursorsync-sync") == "sync sink"
    assert _driver_kind("marker-lookups_0") == "sync lookups and reads"
    assert _driver_kind("probe-place_3") == "mapping checks"
    assert _driver_kind("acker-sync-shared") == "harness"
    assert _driver_kind("Thread-3 (run)") == "other python"
    assert _driver_kind(None) == "native"


def test_sampled_driver_threads_keep_the_time_of_a_thread_that_ended() -> None:
    """Read every 20 ms, a thread that spun 0.3 s, idled (readings are taken) and ended keeps
    its time in its kind."""
    spent = DriverThreads(every_s=0.02)

    def spin_then_idle() -> None:
        _spin_for(0.3)
        time.sleep(0.5)

    ended = threading.Thread(target=spin_then_idle, name="marker-lookups_0")
    ended.start()
    ended.join()
    time.sleep(0.1)  # a reading or more after it ended
    kinds = spent.spent()
    assert kinds["sync lookups and reads"] >= 0.25  # whole 10 ms ticks in /proc
    assert kinds["exited threads"] < 0.1
