"""Seconds per phase of one batch (of either query, and of the mapping's build): where the
batch's time goes (``cursorsync_batch_phase_seconds``), and how much of it the batch's own
thread spent on a core (``cursorsync_batch_phase_cpu_seconds_total``). The rest is
waiting: on brokers, on threads the phase started, or for a core or the interpreter that
others hold."""

from __future__ import annotations

import time


class Phases:
    """A stopwatch: :meth:`step` ends the phase running since the last step (or the start),
    timing its wall seconds and the calling thread's CPU seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._at = time.perf_counter()
        self._cpu_at = time.thread_time()

    def step(self, name: str) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.seconds[name] = now - self._at
        self.cpu[name] = cpu - self._cpu_at
        self._at, self._cpu_at = now, cpu

    def skip(self) -> None:
        """Starts the next phase here, leaving the time since the last step out."""
        self._at, self._cpu_at = time.perf_counter(), time.thread_time()

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.3f}" for k, v in self.seconds.items())


__all__ = ["Phases"]
