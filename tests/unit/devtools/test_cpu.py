"""Thread kinds of a process's CPU, read from the real /proc."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import pytest

from cursorsync_devtools.testbed.cpu import CpuSampler, thread_kinds_cpu_s

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
