"""The phases of a benchmark's run: wall and CPU-seconds of each, by process group
(:class:`~cursorsync_devtools.testbed.cpu.CpuSampler`), by broker thread kind and by driver
thread kind; a phase that fails is named in the error."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cursorsync.errors import CursorSyncError
from cursorsync_devtools.testbed.cpu import DRIVER_THREADS_EVERY_S, CpuSampler, DriverThreads


class BenchError(CursorSyncError):
    """A phase of the benchmark could not complete; the message names it and says why."""


class Phases:
    """Wall and CPU-seconds per phase; a phase that fails is named in the error."""

    def __init__(self, cpu: CpuSampler, say: Callable[[str], None]) -> None:
        self.cpu = cpu
        self.say = say
        self.done: list[dict[str, Any]] = []
        #: CPU-seconds of the current phase's workload process (:meth:`workload`).
        self._workload_cpu_s = 0.0

    def workload(self, cpu_s: float) -> None:
        """The current phase ran a workload in a process of its own that took ``cpu_s``:
        the driver reaps it, so its time is told apart from the driver's."""
        self._workload_cpu_s += cpu_s

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.say(name)
        before, t0 = self.cpu.sample(), time.monotonic()
        threads, driver = self.cpu.broker_threads(), DriverThreads(every_s=DRIVER_THREADS_EVERY_S)
        self._workload_cpu_s = 0.0
        try:
            yield
        except BenchError as err:
            raise BenchError(f"phase {name}: {err}") from err
        except Exception as err:
            raise BenchError(f"phase {name} could not complete: {err}") from err
        finally:
            spent = driver.spent()  # its sampling stops, whatever became of the phase
        used = CpuSampler.diff(before, self.cpu.sample())
        if self._workload_cpu_s:
            used["workload"] = round(self._workload_cpu_s, 2)
            used["driver"] = round(used.get("driver", 0.0) - self._workload_cpu_s, 2)
        self.done.append({"phase": name, "seconds": round(time.monotonic() - t0, 2),
                          "cpu_s": used,
                          # Parts of each broker's: JIT, GC, admin API.
                          "broker_threads_cpu_s": CpuSampler.diff_threads(
                              threads, self.cpu.broker_threads()),
                          # Parts of this process's: each query's sink, the rest.
                          "driver_threads_cpu_s": spent})
