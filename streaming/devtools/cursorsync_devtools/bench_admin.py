"""``cursorsync-dev bench admin``: a sync batch's admin requests against a real broker.

One topic of ``partitions`` partitions on the test bed's cluster b, with a subscription on
every partition (so every partition is loaded, as a synced one is).

Target reads: the sync step's reader (:class:`~cursorsync.sync.target_reads.AdminTargets`)
reads all their cursors, one ``internalStats`` request per partition, with each thread
count in ``workers``; 1 is the one-after-another baseline. Printed per thread count: the
median seconds of ``repeat`` rounds, requests per second, and the broker's CPU time per
request (its process group's, from ``/proc``, less what it spends idle) and the reader's
(this process's). Then the same cursors in one ``partitioned-internalStats`` request, for
comparison.

Probe placement (``evidence.holes: probe``): a probe subscription placed on every
partition, one after another (the baseline) and PLACE_WORKERS at a time, each on a
subscription of its own; seconds and the broker's CPU per partition.

Source poll: ``pulsar-cursors`` polls the topic with nothing changed since its previous
poll, reading every partition's internalStats each poll (the baseline) and with its topic
stats asked first; seconds, partitions read and the broker's CPU per partition. With the
broker plugin loaded (``plugin``), beside them: what the plugin's one request per broker
(:mod:`cursorsync.pulsar.cursor_digests`) costs to tell which partitions moved, with the
topics it listed and how many it says moved (none: nothing changed); and the plugin's
reads of every partition's cursor (``spark.cursor_digests``): the sync step's reader taking
all the target cursors from it (a request per broker), and the answer with ``stats`` a
poll reads the partitions that moved from, asked for every subscription of the namespace.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from cursorsync.core.cursor import CursorState

CLUSTER = "b"
SUBSCRIPTION = "bench-targets"
#: Seconds the broker is watched with nothing asked, for its idle CPU.
IDLE_S = 3.0


def bench_admin(partitions: int = 1000, *, workers: Sequence[int] = (1, 4, 8, 16),
                repeat: int = 3, bed: Any = None, work_dir: str | None = None,
                plugin: bool = False) -> dict[str, Any]:
    """Start the test bed (unless ``bed`` is given; with the broker plugin when ``plugin``),
    read the targets and poll the cursors, return the figures."""
    from cursorsync_devtools.testbed import TestBed, TestBedConfig, broker_plugin_path

    own = bed is None
    if own:
        bed = TestBed(TestBedConfig(broker_plugin=broker_plugin_path() if plugin else None)
                      ).start()
    try:
        with tempfile.TemporaryDirectory(dir=work_dir) as polls:
            return _bench(bed, partitions, workers, repeat, Path(polls))
    finally:
        if own:
            bed.stop()


def _bench(bed: Any, partitions: int, workers: Sequence[int], repeat: int,
           polls: Path) -> dict[str, Any]:
    from cursorsync.pulsar.admin import AdminClient, AdminSettings
    from cursorsync.pulsar.topics import TopicName
    from cursorsync.sync.target_reads import AdminTargets

    topic = bed.topic(f"targets-{uuid.uuid4().hex[:8]}")
    names = bed.create_topic(topic, partitions=partitions)
    # The admin call makes the subscription on every partition, loading them; a client's
    # subscribe waits on all partitions within one operation timeout, which a loaded
    # machine overruns.
    bed.admin_call(CLUSTER, "PUT", TopicName.parse(topic).admin_path(
        f"subscription/{SUBSCRIPTION}"))
    pairs = [(n, SUBSCRIPTION) for n in names]
    pid = bed.clusters[CLUSTER].pid
    with AdminClient(AdminSettings.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER,
                                           max_workers=max(workers))) as admin:
        AdminTargets(admin).many(pairs)  # the broker's code paths warm before any is timed
    time.sleep(IDLE_S)  # the loading settles
    c0 = _cpu_s(pid)
    time.sleep(IDLE_S)
    idle = (_cpu_s(pid) - c0) / IDLE_S  # CPU seconds per second with nothing asked
    rows = []
    for w in workers:
        config = AdminSettings.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER, max_workers=w)
        with AdminClient(config) as admin:
            reader = AdminTargets(admin)
            reader.many(pairs[: 2 * w])  # connections open before the clock starts
            rows.append({"workers": w, **_timed(partial(_read_all, reader, pairs), pid, idle,
                                                repeat, partitions)})
    # The same cursors in one request per topic: the broker gathers the partitions' stats.
    with AdminClient(AdminSettings.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER)) as admin:
        whole = _timed(lambda: admin.partitioned_internal_stats(topic), pid, idle, repeat, 1)
    source_poll = {
        label: _poll(bed, topic, polls / label, age, pid, idle, repeat, partitions)
        for label, age in (("every_poll", 0), ("stats_first", 600_000))}
    result: dict[str, Any] = {}
    if bed.config.broker_plugin is not None:
        source_poll["plugin_digests"] = _digests(bed, names, pid, idle, repeat)
        source_poll["plugin_stats"] = _plugin_stats(bed, names, pid, idle, repeat)
        result["plugin_target_reads"] = _plugin_targets(bed, pairs, pid, idle, repeat)
    placement = _place_probes(bed, names, pid, idle)
    return {**result, "benchmark": "admin", "partitions": partitions, "cores": os.cpu_count(),
            "requests_per_round": partitions, "rounds": repeat, "by_workers": rows,
            "partitioned_internal_stats_seconds": whole["seconds"],
            "partitioned_internal_stats_broker_cpu_ms": whole["broker_cpu_ms_per_request"],
            "partitioned_internal_stats_reader_cpu_ms": whole["reader_cpu_ms_per_request"],
            "source_poll": source_poll, "probe_placement": placement,
            "broker_idle_cpu_ms_per_s": round(1000 * idle, 1)}


def _poll(bed: Any, topic: str, state: Path, max_age_ms: int, pid: int | None, idle: float,
          repeat: int, partitions: int) -> dict[str, float]:
    """A poll of ``topic`` after one that read it all, nothing changed in between."""
    from cursorsync.sync.cursors import CursorsOptions, PulsarCursorsStreamReader

    reader = PulsarCursorsStreamReader(CursorsOptions.parse({
        "adminUrl": bed.admin_url(CLUSTER), "cluster": CLUSTER, "topics": topic,
        "subscriptions": SUBSCRIPTION, "stateDir": str(state),
        "internalStatsMaxAgeMs": str(max_age_ms)}))
    reader.poll()
    got = _timed(reader.poll, pid, idle, repeat, partitions)
    return {"seconds": got["seconds"], "partitions_read": reader.partitions_read,
            "broker_cpu_ms_per_partition": got["broker_cpu_ms_per_request"],
            "reader_cpu_ms_per_partition": got["reader_cpu_ms_per_request"]}


def _digests(bed: Any, names: list[str], pid: int | None, idle: float, repeat: int
             ) -> dict[str, float]:
    """The plugin's answer for the bed's namespace, asked again with nothing changed: the
    topics it lists, how many of the partitions ``names`` it lists, and says moved."""
    from cursorsync.pulsar.admin import AdminClient, AdminSettings
    from cursorsync.pulsar.cursor_digests import fetch_cursor_digests, moved

    with AdminClient(AdminSettings.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER)) as admin:
        first = fetch_cursor_digests(admin, bed.namespace, [SUBSCRIPTION]).topics
        answers = []

        def ask() -> None:
            answers.append(fetch_cursor_digests(admin, bed.namespace, [SUBSCRIPTION]).topics)

        got = _timed(ask, pid, idle, repeat, len(first))
    ours = set(names)
    return {"seconds": got["seconds"], "requests": 1, "topics_listed": len(first),
            "partitions_listed": len(ours & set(first)),
            "partitions_moved": max(len(moved(first, a, [SUBSCRIPTION]) & ours)
                                    for a in answers),
            "broker_cpu_ms_per_partition": got["broker_cpu_ms_per_request"],
            "reader_cpu_ms_per_partition": got["reader_cpu_ms_per_request"]}


def _read_all(reader: Any, pairs: list[tuple[str, str]]) -> None:
    """One round of target reads of every pair; a read that failed stops the benchmark."""
    got = reader.many(pairs)
    bad = [v for v in got.values() if not isinstance(v, CursorState)]
    if bad:
        raise RuntimeError(f"a target read failed: {bad[0]!r}")


def _plugin_targets(bed: Any, pairs: list[tuple[str, str]], pid: int | None, idle: float,
                    repeat: int) -> dict[str, float]:
    """The sync step's reader taking every target cursor of ``pairs`` from the plugin."""
    from cursorsync.pulsar.admin import AdminClient, AdminSettings
    from cursorsync.sync.target_reads import AdminTargets

    with AdminClient(AdminSettings.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER)) as admin:
        reader = AdminTargets(admin, plugin=True)
        got = _timed(partial(_read_all, reader, pairs), pid, idle, repeat, len(pairs))
    if reader.requests:
        raise RuntimeError(f"{reader.requests} target cursors read without the plugin")
    return {**got, "plugin_requests_per_round": reader.plugin.reads / repeat}


def _plugin_stats(bed: Any, names: list[str], pid: int | None, idle: float, repeat: int
                  ) -> dict[str, float]:
    """The plugin's answer with ``stats`` of every durable cursor of the bed's namespace,
    which a poll asks for when many partitions moved: seconds, and CPU per topic listed."""
    from cursorsync.pulsar.admin import AdminClient, AdminSettings
    from cursorsync.pulsar.cursor_digests import cluster_digests

    with AdminClient(AdminSettings.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER)) as admin:
        listed = cluster_digests(admin, [bed.namespace], stats=True)
        got = _timed(lambda: cluster_digests(admin, [bed.namespace], stats=True), pid, idle,
                     repeat, len(listed))
    with_stats = sum(1 for n in names if listed.get(n) is not None
                     and listed[n].stats is not None)
    return {"seconds": got["seconds"], "requests": 1, "topics_listed": len(listed),
            "partitions_with_stats": with_stats,
            "broker_cpu_ms_per_partition": got["broker_cpu_ms_per_request"],
            "reader_cpu_ms_per_partition": got["reader_cpu_ms_per_request"]}


def _place_probes(bed: Any, names: list[str], pid: int | None, idle: float
                  ) -> dict[str, dict[str, float]]:
    """Probes placed on every partition of ``names`` after their last entry, one after
    another and then side by side, each way on a subscription of its own."""
    from cursorsync.core.positions import Position
    from cursorsync.pulsar.admin import AdminClient, AdminSettings
    from cursorsync.pulsar.dispatch_probe import PLACE_WORKERS, DispatchProbe

    out = {}
    with AdminClient(AdminSettings.from_urls(bed.admin_url(CLUSTER), cluster=CLUSTER)) as admin:
        places = {n: Position(0, 0) for n in names}
        for label, workers in (("one_at_a_time", 1), (f"{PLACE_WORKERS}_at_a_time",
                                                        PLACE_WORKERS)):
            probe = DispatchProbe(bed.client(CLUSTER), admin, f"bench-probe-{workers}")

            def place(probe: DispatchProbe = probe, workers: int = workers) -> None:
                probe.place_all(places, workers)

            try:
                got = _timed(place, pid, idle, 1, len(names))
            finally:
                probe.close()
            out[label] = {"seconds": got["seconds"], "partitions_per_s": got["requests_per_s"],
                          "broker_cpu_ms_per_partition": got["broker_cpu_ms_per_request"]}
    return out


def _timed(fn: Callable[[], object], pid: int | None, idle: float, repeat: int,
           requests: int) -> dict[str, float]:
    """Median seconds of ``repeat`` calls, requests per second, and the broker's CPU time
    per request beyond what it spends idle."""
    seconds, cpu, ours = [], [], []
    for _ in range(repeat):
        c0, o0, t0 = _cpu_s(pid), time.process_time(), time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        seconds.append(took)
        ours.append(time.process_time() - o0)
        cpu.append(_cpu_s(pid) - c0 - idle * took)
    s = statistics.median(seconds)
    return {"seconds": round(s, 3), "requests_per_s": round(requests / s),
            "broker_cpu_ms_per_request": round(1000 * max(0.0, statistics.median(cpu))
                                               / requests, 3),
            "reader_cpu_ms_per_request": round(1000 * statistics.median(ours) / requests, 3)}


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
