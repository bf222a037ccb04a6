"""A workload in a process of its own, as a user's producers and consumers are.

The benchmarks and the demo run the job's driver in their own process; a workload run
there too (its producers' callbacks, its consumers' acks, all in Python) takes the
driver's interpreter from the job's sinks for as long as it runs, which no deployment
does. :func:`in_own_process` runs it in a spawned interpreter (a fork of a process that
holds a JVM gateway and client threads is unsafe) and returns its result with the CPU
time it took, so a benchmark can tell the workload's CPU from the driver's.
"""

from __future__ import annotations

import logging
import multiprocessing
import resource
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Apart(Generic[T]):
    """What a function run in a process of its own returned, and its CPU-seconds (the
    process's and its children's, user and system)."""

    value: T
    cpu_s: float


def in_own_process(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Apart[T]:
    """``fn(*args, **kwargs)`` in a new interpreter; its arguments and result travel by
    pickle (``fn`` importable by name). Its exception is raised here."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=_log_like,
                             initargs=(logging.getLogger().getEffectiveLevel(),)) as pool:
        return pool.submit(_measured, fn, args, kwargs).result()


def _log_like(level: int) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s [workload] "
                        "%(name)s: %(message)s")


def _measured(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Apart[T]:
    value = fn(*args, **kwargs)
    return Apart(value, _cpu_s())


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
