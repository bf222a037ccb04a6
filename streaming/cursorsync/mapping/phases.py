"""Seconds per phase of one mapping batch, and of its build: where the batch's time goes
(``cursorsync_batch_phase_seconds``)."""

from __future__ import annotations

import time


class Phases:
    """A stopwatch: :meth:`step` ends the phase running since the last step (or the start)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._at = time.perf_counter()

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self._at
        self._at = now

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.3f}" for k, v in self.seconds.items())


__all__ = ["Phases"]
