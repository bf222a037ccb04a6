"""The mapping batch's stopwatch: wall seconds and the calling thread's CPU seconds."""

from __future__ import annotations

import threading
import time

from cursorsync.phases import Phases


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_phase_of_work_counts_its_cpu_and_a_phase_of_waiting_does_not() -> None:
    clock = Phases()
    _spin(0.05)
    clock.step("work")
    time.sleep(0.1)
    clock.step("wait")
    assert set(clock.seconds) == set(clock.cpu) == {"work", "wait"}
    assert clock.cpu["work"] >= 0.05
    assert clock.seconds["work"] >= clock.cpu["work"] - 0.01
    assert clock.seconds["wait"] >= 0.1
    assert clock.cpu["wait"] < 0.05


def test_another_threads_work_is_not_the_phases_cpu() -> None:
    clock = Phases()
    helper = threading.Thread(target=_spin, args=(0.1,))
    helper.start()
    helper.join()  # the phase waits on a thread that works
    clock.step("joined")
    assert clock.seconds["joined"] >= 0.1
    assert clock.cpu["joined"] < 0.05
