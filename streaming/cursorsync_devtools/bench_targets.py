"""``cursorsync bench target-reads``: a sync batch's target reads against a real broker.

One topic of ``partitions`` partitions on the test bed's cluster b, with a subscription on
every partition (so every partition is loaded, as a synced one is). The sync step's
reader (:class:`~cursorsync.sync.target_reads.AdminTargets`) reads all their cursors, one
``internalStats`` request per partition, with each thread count in ``workers``; 1 is the
one-after-another baseline. Printed per thread count: the median seconds of ``repeat``
rounds, requests per second, and the broker's CPU time per request (its process group's,
from ``/proc``, less what it spends idle). Then the same cursors in one
``partitioned-internalStats`` request, for comparison.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cursorsync.core.cursor import CursorState

CLUSTER = "b"
SUBSCRIPTION = "bench-targets"
#: Seconds the broker is watched with nothing asked, for its idle CPU.
IDLE_S = 3.0


def bench_target_reads(partitions: int = 1000, *, workers: Sequence[int] = (1, 4, 8, 16),
                       repeat: int = 3, bed: Any = None) -> dict[str, Any]:
    """Start the test bed (unless ``bed`` is given), read the targets, return the figures."""
    from cursorsync_devtools.testbed import TestBed

    own = bed is None
    bed = TestBed().start() if own else bed
    try:
        return _bench(bed, partitions, workers, repeat)
    finally:
        if own:
            bed.stop()


def _bench(bed: Any, partitions: int, workers: Sequence[int], repeat: int) -> dict[str, Any]:
    import pulsar

    from cursorsync.pulsar.admin import AdminClient, AdminConfig
    from cursorsync.sync.target_reads import AdminTargets

    topic = bed.topic(f"targets-{uuid.uuid4().hex[:8]}")
    names = bed.create_topic(topic, partitions=partitions)
    # A subscription on the partitioned topic creates it on every partition, loading them.
    bed.client(CLUSTER).subscribe(topic, SUBSCRIPTION,
                                  consumer_type=pulsar.ConsumerType.Shared).close()
    pairs = [(n, SUBSCRIPTION) for n in names]
    pid = bed.clusters[CLUSTER].pid
    time.sleep(IDLE_S)  # the loading settles
    c0 = _cpu_s(pid)
    time.sleep(IDLE_S)
    idle = (_cpu_s(pid) - c0) / IDLE_S  # CPU seconds per second with nothing asked
    rows = []
    for w in workers:
        config = AdminConfig.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER, max_workers=w)
        with AdminClient(config) as admin:
            reader = AdminTargets(admin)
            reader.many(pairs[: 2 * w])  # connections open before the clock starts

            def one_round(reader: AdminTargets = reader) -> None:
                got = reader.many(pairs)
                bad = [v for v in got.values() if not isinstance(v, CursorState)]
                if bad:
                    raise RuntimeError(f"a target read failed: {bad[0]!r}")

            rows.append({"workers": w, **_timed(one_round, pid, idle, repeat, partitions)})
    # The same cursors in one request per topic: the broker gathers the partitions' stats.
    with AdminClient(AdminConfig.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER)) as admin:
        whole = _timed(lambda: admin.partitioned_internal_stats(topic), pid, idle, repeat, 1)
    return {"benchmark": "target-reads", "partitions": partitions,
            "requests_per_round": partitions, "rounds": repeat, "by_workers": rows,
            "partitioned_internal_stats_seconds": whole["seconds"],
            "partitioned_internal_stats_broker_cpu_ms": whole["broker_cpu_ms_per_request"],
            "broker_idle_cpu_ms_per_s": round(1000 * idle, 1)}


def _timed(fn: Callable[[], object], pid: int | None, idle: float, repeat: int,
           requests: int) -> dict[str, float]:
    """Median seconds of ``repeat`` calls, requests per second, and the broker's CPU time
    per request beyond what it spends idle."""
    seconds, cpu = [], []
    for _ in range(repeat):
        c0, t0 = _cpu_s(pid), time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        seconds.append(took)
        cpu.append(_cpu_s(pid) - c0 - idle * took)
    s = statistics.median(seconds)
    return {"seconds": round(s, 3), "requests_per_s": round(requests / s),
            "broker_cpu_ms_per_request": round(1000 * max(0.0, statistics.median(cpu))
                                               / requests, 3)}


def _cpu_s(pid: int | None) -> float:
    """User and system CPU seconds of the process group led by ``pid`` (the broker's JVM
    and its launcher)."""
    if pid is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # After the command: state, ppid, pgrp, ... utime (12th), stime (13th).
        if int(fields[2]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / tick
