"""CPU-seconds per process group, from /proc: where a benchmark's CPU goes.

Everything runs on the same few cores here (both brokers, Spark, the driver),
so a rate alone does not say whose time it measures. Groups:

* ``broker a``, ``broker b``: each standalone JVM and its descendants;
* ``spark jvm``: the JVM pyspark launched for this process;
* ``python workers``: that JVM's descendants (Spark's Python workers, the
  Python data sources' planner processes);
* ``driver``: this process and its other descendants (the measurements, the
  baseline's reader processes, and the workload's process, which a benchmark that runs
  one tells apart by the CPU it reports: :mod:`cursorsync_devtools.testbed.apart`).

A process that exits is reaped by its parent, whose ``cutime``/``cstime`` then
hold its time; that time counts in the group of the process's children, so
nothing moves between groups when processes come and go: the Spark JVM's
reaped children count as Python workers, everyone else's in their parent's
group. Empty where /proc is missing.

Within a broker, :meth:`CpuSampler.broker_threads` splits its time by what its threads
do (:data:`THREAD_KINDS`): a freshly started JVM spends much of its first minutes
compiling (the JIT), and the admin API's threads are where the job's requests land.
Within this process (the job's driver, when a benchmark runs the job here),
:class:`DriverThreads` splits it by the Python threads' names
(:data:`DRIVER_KINDS`): how much of a core each query's sink had, beside the rest.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Mapping
from pathlib import Path

#: A JVM thread's kind by the start of its name (Linux keeps its first 15 bytes): the JIT's
#: compiler threads, the garbage collector's, and the broker's web (admin API) threads.
THREAD_KINDS = (("jit", ("C1 CompilerThre", "C2 CompilerThre")),
                ("gc", ("GC Thread", "G1 ", "VM Thread")),
                ("admin api", ("pulsar-web-",)))


#: A driver thread's kind by the start of its Python name: each query's sink (the sinks name
#: the thread Spark calls them on), the sync's background lookups and target reads, the
#: mapping's checks, and a benchmark's own threads (its main thread runs the measurements;
#: the workload has a process of its own). A thread Python did not start is ``native`` (the
#: pulsar client's I/O threads, delta-rs' runtime); one that ended is only in ``exited
#: threads``.
DRIVER_KINDS = (("sync sink", ("cursorsync-sync",)),
                ("mapping sink", ("cursorsync-mapping",)),
                ("sync lookups and reads", ("marker-lookup", "tail-check", "target-reads",
                                            "emitter-open")),
                ("mapping checks", ("probe-place", "hole-check", "ledger-lists",
                                    "anchor-read")),
                ("harness", ("MainThread", "acker-", "watch-", "cursor-poller",
                             "direct-memory", "cpu-sampler")))


def read_stat(path: Path) -> tuple[str, list[str]] | None:
    """A ``/proc`` ``stat`` file: the command (thread) name, and the fields after it (state
    first: ppid is [1], utime [11], stime [12], cutime [13], cstime [14]); None when it
    is gone (the process or thread ended between listing and reading)."""
    try:
        raw = path.read_text()
    except OSError:
        return None
    return raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()


def threads_cpu_s(pid: int, tick: int) -> dict[int, tuple[str, float]]:
    """The live threads of process ``pid``: tid -> (its OS name, its CPU-seconds so far)."""
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        stat = read_stat(task / "stat")
        if stat is not None:
            name, f = stat
            out[int(task.name)] = (name, (int(f[11]) + int(f[12])) / tick)
    return out


def kind_of(name: str, kinds: tuple[tuple[str, tuple[str, ...]], ...]) -> str | None:
    """The first of ``kinds`` (kind, name prefixes) whose prefixes start ``name``."""
    for kind, prefixes in kinds:
        if name.startswith(prefixes):
            return kind
    return None


def thread_kinds_cpu_s(pid: int, tick: int | None = None) -> dict[str, float]:
    """CPU-seconds of the live threads of process ``pid`` per :data:`THREAD_KINDS` kind
    (a kind with no thread: 0.0). A thread that has exited took its time with it: the
    figures are at least what those kinds spent."""
    out = dict.fromkeys((kind for kind, _ in THREAD_KINDS), 0.0)
    for name, cpu in threads_cpu_s(pid, tick or os.sysconf("SC_CLK_TCK")).values():
        kind = kind_of(name, THREAD_KINDS)
        if kind is not None:
            out[kind] += cpu
    return out


class DriverThreads:
    """This process's CPU-seconds since construction, per :data:`DRIVER_KINDS` kind,
    ``other python`` and ``native``; each thread counted from its first reading to its last
    (a thread that changed kind counts in the kind of its last). With ``every_s``, a thread
    of its own reads them that often, so a thread that ends between the first and the last
    reading keeps the time it had at the one before it ended (a pool's workers, a closed
    client's I/O threads); ``exited threads`` is the rest of the process's time. Only the
    sampling thread touches the readings until :meth:`spent` has stopped it."""

    def __init__(self, every_s: float | None = None) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self._own = own_cpu_s()
        self._first = {tid: cpu for tid, (_, cpu) in self._read().items()}
        self._last: dict[int, tuple[str, float]] = {}
        self._done = dict.fromkeys((*(kind for kind, _ in DRIVER_KINDS), "other python",
                                    "native"), 0.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if every_s is not None:
            self._thread = threading.Thread(target=self._sample_every, args=(every_s,),
                                            name="cpu-sampler", daemon=True)
            self._thread.start()

    def _read(self) -> dict[int, tuple[str, float]]:
        """tid -> (its kind now, its CPU-seconds so far)."""
        names = {t.native_id: t.name for t in threading.enumerate()}
        return {tid: (_driver_kind(names.get(tid)), cpu)
                for tid, (_, cpu) in threads_cpu_s(os.getpid(), self.tick).items()}

    def _sample(self) -> None:
        for tid, (kind, cpu) in self._read().items():
            before = self._last.get(tid)
            if before is not None and cpu < before[1]:
                # A new thread under an ended one's id: the ended one's time is kept.
                self._done[before[0]] += before[1] - self._first.pop(tid, 0.0)
            self._last[tid] = (kind, cpu)

    def _sample_every(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self._sample()

    def spent(self) -> dict[str, float]:
        """CPU-seconds per kind since construction (the sampling, if any, stops)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        own = own_cpu_s() - self._own
        out = dict(self._done)
        for tid, (kind, cpu) in self._last.items():
            out[kind] += cpu - self._first.get(tid, 0.0)
        out["exited threads"] = max(0.0, own - sum(out.values()))
        return {kind: round(s, 2) for kind, s in out.items()}


def _driver_kind(name: str | None) -> str:
    if name is None:
        return "native"
    return kind_of(name, DRIVER_KINDS) or "other python"


#: How often the benchmarks read the driver's threads (:class:`DriverThreads`): a thread
#: that ends keeps the time it had at the last reading.
DRIVER_THREADS_EVERY_S = 5.0


def own_cpu_s() -> float:
    """This process's CPU-seconds so far (user and system, every thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def spark_jvm_pid() -> int | None:
    """The pid of the JVM pyspark launched in this process, if it did launch one."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return None if proc is None else int(proc.pid)


class CpuSampler:
    """Samples cumulative CPU-seconds per group; :meth:`diff` of two samples is a phase's."""

    def __init__(self, brokers: Mapping[str, int | None]) -> None:
        self.roots = {pid: f"broker {name}" for name, pid in brokers.items() if pid}
        self.tick = os.sysconf("SC_CLK_TCK")

    def _processes(self) -> dict[int, tuple[int, float, float]]:
        """pid -> (parent pid, its own CPU-seconds, its reaped children's)."""
        out: dict[int, tuple[int, float, float]] = {}
        for d in Path("/proc").glob("[0-9]*"):
            stat = read_stat(d / "stat")
            if stat is None:
                continue
            f = stat[1]
            out[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / self.tick,
                                (int(f[13]) + int(f[14])) / self.tick)
        return out

    def sample(self) -> dict[str, float]:
        procs = self._processes()
        roots = dict(self.roots)
        jvm = spark_jvm_pid()
        if jvm is not None:
            roots[jvm] = "spark jvm"
        roots[os.getpid()] = "driver"
        groups: dict[str, float] = {}
        for pid, (_, own, reaped) in procs.items():
            group = _group(pid, procs, roots, jvm)
            if group is None:
                continue
            children = "python workers" if pid == jvm else group
            groups[group] = groups.get(group, 0.0) + own
            groups[children] = groups.get(children, 0.0) + reaped
        return groups

    def broker_threads(self) -> dict[str, dict[str, float]]:
        """Per broker, :func:`thread_kinds_cpu_s` of its JVM."""
        return {name: thread_kinds_cpu_s(pid, self.tick) for pid, name in self.roots.items()}

    @staticmethod
    def diff_threads(before: Mapping[str, Mapping[str, float]],
                     after: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
        """Two :meth:`broker_threads` samples' difference, per broker and kind."""
        return {name: CpuSampler.diff(before.get(name, {}), kinds)
                for name, kinds in sorted(after.items())}

    @staticmethod
    def diff(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
        return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 2)
                for k in sorted(set(before) | set(after))}


def _group(pid: int, procs: Mapping[int, tuple[int, float, float]], roots: Mapping[int, str],
           jvm: int | None) -> str | None:
    """The group of the nearest root among ``pid`` and its ancestors (None: not ours)."""
    at = pid
    for _ in range(64):
        if at in roots:
            return "python workers" if at == jvm and pid != jvm else roots[at]
        parent = procs.get(at, (0, 0.0, 0.0))[0]
        if parent <= 1:
            return None
        at = parent
    return None
