"""``cursorsync-dev bench partitions``: one job syncing a topic of many partitions on the real
test bed, failover counted, once per way of classifying skipped target ids.

The demo's flow (:func:`cursorsync_devtools.demo.demo`) on one partitioned topic of
``partitions`` partitions, a Shared subscription carried by cursorsync beside its built-in
twin, run once for each ``evidence.holes`` mode (``verified`` first: the baseline) on one
test bed, each on topics of its own. Printed per mode: the failover counts, per-batch time
of both queries (the job's own histogram), sync lag p50 and p99 (``sync_progress`` rows
that sent acks), the admin requests made to classify skipped ids (by kind, and per second
of the run), ``mappings`` rows per mapped entry, as the batches wrote them, and the
brokers' direct memory at its highest (:mod:`cursorsync_devtools.testbed.direct_memory`);
a run that ends early gives its error and that peak. The workload runs in a process of its
own, as a user's clients do; ``cpu_s`` gives its CPU as ``workload``, apart from the driver's.

With ``batch_index_acks`` the brokers keep batch-index acks, load cursorsync's broker plugin,
and the workload's consumers ack by batch index; each mode then runs twice, the job without
carrying partly acked batches (the baseline) and with (``<mode>-batches``). With
``cursor_digests`` the brokers load the plugin and each run is made twice again: the job
without ``spark.cursor_digests`` (the baseline: topic stats and an internalStats per
partition read), and with it (``...-digests``: the source polls, the sync's target reads and
the probe reads asking the plugin). With ``kept_readers`` each run is made twice again: the
mapping's workers opening a reader per range (``kept_readers: 0``, the baseline) and keeping
them between ranges (the default, ``...-kept``).

The brokers are started for the benchmark, so the first run on them also pays for their
JIT compiling the code every request takes (about a quarter of their CPU in a
1,000-partition run; ``broker_threads_cpu_s`` shows it per run), which brokers that have
run for a while do not. With ``warm_up`` the first mode runs once more before the others
on topics of its own (``warm-up``): its figures are printed, not compared.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

#: The modes compared by default: the baseline first.
HOLES = ("verified", "probe")
#: The label of the run that warms the brokers up.
WARM_UP = "warm-up"
#: Progress updates each query keeps, for Spark's phases of every batch of a run.
PROGRESS_UPDATES = 2000


def bench_partitions(partitions: int = 1000, *, entries_per_partition: int = 20,
                     produce_seconds: float = 30.0, work_dir: str | None = None,
                     timeout_s: float = 900.0, holes: Sequence[str] = HOLES,
                     batch_index_acks: bool = False, cursor_digests: bool = False,
                     kept_readers: bool = False, memory_scale: int | None = None,
                     warm_up: bool = False, digests_only: bool = False,
                     watch_builtin: bool = False) -> dict[str, Any]:
    """Run the workload and the job on ``partitions`` partitions for each mode of
    ``holes`` (twice each with ``batch_index_acks``, and again with ``cursor_digests`` and
    with ``kept_readers``), on
    one test bed; return the figures per run. ``digests_only``: the runs with
    ``cursor_digests`` alone, no baseline beside them (for a width whose baseline does not
    finish). ``memory_scale``: the brokers' heap and
    direct memory that many times the bed's default (default: :func:`bed_size`'s).
    ``warm_up``: a run of ``holes[0]`` first, on brokers as fresh as the others' would be
    without it (``runs["warm-up"]``). ``watch_builtin``: the harness follows the
    built-in's cursors through the whole run (an ``internalStats`` of every partition of b
    each poll, in the job's process), as the demo does for when they last moved; without
    it, only after the sync caught up, to count the built-in's failover once they are
    still: the figures are the job's and the brokers', not the harness's polls."""
    from cursorsync_devtools.testbed import TestBed, TestBedConfig, broker_plugin_path
    from cursorsync_devtools.testbed.direct_memory import BED_SETTINGS

    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cursorsync-wide-"))
    on = {**BED_SETTINGS, **({"acknowledgmentAtBatchIndexLevelEnabled": "true"}
                             if batch_index_acks else {})}
    bed = TestBed(TestBedConfig(
        work_dir=root / "pulsar", settings={"a": on, "b": on},
        broker_plugin=(broker_plugin_path() if batch_index_acks or cursor_digests
                       or digests_only else None),
        **bed_size(partitions, memory_scale))).start()
    try:
        # Consumed ledgers stay on a for the run: a subscription first synced after its
        # topic's first ledgers were trimmed halts until resumed (docs/operation.md, "A
        # source topic deleted and created again"), which is not what this measures.
        bed.admin_call("a", "POST", f"/admin/v2/namespaces/{bed.config.tenant}/"
                       f"{bed.config.namespace}/retention",
                       json={"retentionTimeInMinutes": 240, "retentionSizeInMB": -1})
        runs = {}
        if warm_up:
            runs[WARM_UP] = _run(bed, root / WARM_UP, partitions, entries_per_partition,
                                 produce_seconds, timeout_s, holes[0],
                                 batch_index_acks=batch_index_acks, label=WARM_UP,
                                 watch_builtin=watch_builtin)
        for mode in holes:
            for carry in (False, True) if batch_index_acks else (False,):
                for digests in ((True,) if digests_only else (False, True)
                                if cursor_digests else (False,)):
                    for kept in (False, True) if kept_readers else (None,):
                        label = _label(mode, carry, digests, kept)
                        runs[label] = _run(bed, root / label, partitions,
                                           entries_per_partition, produce_seconds, timeout_s,
                                           mode, batch_index_acks=batch_index_acks,
                                           carry=carry, digests=digests, kept=kept,
                                           watch_builtin=watch_builtin)
    finally:
        bed.stop()
        if not work_dir:
            shutil.rmtree(root, ignore_errors=True)
    return {"benchmark": "partitions", "partitions": partitions, "baseline": holes[0],
            "batch_index_acks": batch_index_acks,
            "cursor_digests": cursor_digests or digests_only, "digests_only": digests_only,
            "kept_readers": kept_readers, "warm_up": warm_up,
            "watch_builtin": watch_builtin, "runs": runs}


def bed_size(partitions: int, memory_scale: int | None = None) -> dict[str, Any]:
    """The bed's settings for ``partitions`` partitions (twice as many topics with the
    built-in's twin): its defaults up to 1,000, which hold them; beyond, each broker's
    heap and direct memory, and its clients' operation timeout (a consumer of every
    partition waits for the broker to load them all), grown with the partitions.
    ``memory_scale`` sets the memory's growth instead."""
    scale = -(-partitions // 1000)
    size: dict[str, Any] = {} if partitions <= 1000 else {"operation_timeout_s": 60 * scale}
    memory = scale if memory_scale is None and partitions > 1000 else memory_scale
    if memory is not None:
        size["memory"] = (f"-Xms{256 * memory}m -Xmx{640 * memory}m "
                          f"-XX:MaxDirectMemorySize={384 * memory}m")
    return size


def clients_shared(partitions: int) -> int:
    """How many partitions' publishers share a client: one each up to 1,000 partitions (the
    figures measured so far), then as many as keeps the harness's clients at 1,000."""
    return max(1, -(-partitions // 1000))


def _label(holes: str, carry: bool, digests: bool, kept: bool | None = None) -> str:
    return (holes + ("-batches" if carry else "") + ("-digests" if digests else "")
            + ("-kept" if kept else "-per-range" if kept is False else ""))


def _run(bed: Any, root: Path, partitions: int, entries_per_partition: int,
         produce_seconds: float, timeout_s: float, holes: str, *,
         batch_index_acks: bool = False, carry: bool = False, digests: bool = False,
         kept: bool | None = None, label: str | None = None,
         watch_builtin: bool = False) -> dict[str, Any]:
    from cursorsync.tables import open_store
    from cursorsync_devtools.bench_e2e import PROGRESS_KEPT
    from cursorsync_devtools.demo import demo
    from cursorsync_devtools.testbed.cpu import (
        DRIVER_THREADS_EVERY_S,
        CpuSampler,
        DriverThreads,
    )
    from cursorsync_devtools.testbed.direct_memory import DirectMemoryWatch
    from cursorsync_devtools.testbed.workload import WorkloadSpec

    label = label or _label(holes, carry, digests, kept)
    spec = WorkloadSpec(partitioned_topic=f"wide-{label}", partitions=partitions,
                        plain_topic=f"wide-plain-{label}", chunked_topic=None,
                        batch_index_acks=batch_index_acks,
                        entries_per_partition=entries_per_partition,
                        produce_seconds=produce_seconds, subscription_types=("Shared",),
                        foreign_per_partition=0,
                        partitions_per_client=clients_shared(partitions))
    cpu = CpuSampler({name: c.pid for name, c in bed.clusters.items()})
    before, threads_before = cpu.sample(), cpu.broker_threads()
    driver = DriverThreads(every_s=DRIVER_THREADS_EVERY_S)
    report, failed = None, ""
    with DirectMemoryWatch({name: bed.admin_url(name) for name in bed.clusters}) as memory:
        try:
            report = demo(bed=bed, work_dir=str(root), keep=True, spec=spec,
                          spark_conf={PROGRESS_KEPT: str(PROGRESS_UPDATES)},
                          timeout_s=timeout_s, holes=holes, carry_batches=carry,
                          cursor_digests=digests,
                          kept_readers=0 if kept is False else None,
                          watch_builtin=watch_builtin)
        except Exception as err:  # never caught up, a broker gone: the other modes still run
            failed = (str(err).splitlines() or [type(err).__name__])[0]
    driver_threads = driver.spent()  # its sampling stops, whatever became of the run
    if report is None:  # a figure too, with how near its limit the bed's memory was
        return {"holes": holes, "failed": failed, "direct_mb_peak": memory.peaks()}
    used = CpuSampler.diff(before, cpu.sample())
    # The workload's process is the driver's child, reaped into its figure: told apart.
    used["workload"] = report.workload_cpu_s
    used["driver"] = used.get("driver", 0.0) - report.workload_cpu_s
    threads = CpuSampler.diff_threads(threads_before, cpu.broker_threads())
    store = open_store("delta-rs", str(root / "tables"))
    progress = store.read("sync_progress", columns=["lag_ms", "acks_sent", "outcome"])
    sent = progress.filter(pc.greater(progress.column("acks_sent"), 0))
    lags = np.asarray(sent.column("lag_ms").to_numpy(), float) / 1000
    kinds = store.read("mappings", columns=["kind"]).column("kind")
    segments = int(pc.sum(pc.equal(kinds, "segment")).as_py() or 0)
    ours, builtin = report.cursorsync["Shared"], report.builtin["Shared"]
    messages = ours["messages"]
    return {
        "holes": holes, "carry_batches": carry, "cursor_digests": digests,
        "kept_readers": kept, "topics": report.topics, "messages": messages,
        "losses": ours["losses"], "duplicates": ours["duplicates"],
        "duplicates_partial_batch": ours["partial_batch"],
        "builtin_duplicates": builtin["duplicates"], "builtin_losses": builtin["losses"],
        "sync_caught_up_s": round(report.sync_caught_up_s, 1),
        "batches": report.batch_seconds,
        # Where a batch's time goes (mean seconds per batch; "step:..." is inside "step").
        "batch_phases_mean_s": report.phase_seconds,
        # Of which the batch's own thread on a core (the rest waits: brokers, threads, CPU).
        "batch_phases_cpu_mean_s": report.phase_cpu_seconds,
        # Spark's phases of the batches (p50 / p90 ms): latestOffset is the sources' new
        # offsets (the mapping's last message ids, the sync's source poll).
        "spark_phases_ms": report.spark_phases,
        "sync_lag_p50_s": round(float(np.percentile(lags, 50)), 2) if len(lags) else None,
        "sync_lag_p99_s": round(float(np.percentile(lags, 99)), 2) if len(lags) else None,
        "skipped_id_requests": report.skipped_id_requests,
        "skipped_id_requests_per_s": {
            kind: round(n / report.seconds, 1) for kind, n in report.skipped_id_requests.items()
        } if report.seconds else {},
        "mapping_rows": len(kinds), "segment_rows": segments,
        "segment_rows_per_entry": round(segments / messages, 4) if messages else None,
        "seconds": round(report.seconds, 1),
        # The workload's messages, acks and seconds (from its start to its last ack).
        "workload": report.workload,
        # The whole run's (workload, sync, failover): the brokers' share is the load
        # cursorsync adds to theirs, beside the other mode's in the same run.
        "cpu_s": {group: round(s, 1) for group, s in used.items()},
        # Parts of each broker's: its JIT compiling, its garbage collector, its admin API.
        "broker_threads_cpu_s": {name: {kind: round(s, 1) for kind, s in kinds.items()}
                                 for name, kinds in threads.items()},
        # Parts of this process's (the driver's): each query's sink, the sync's lookups, the
        # harness (the workload, the failover count), the clients' native threads.
        "driver_threads_cpu_s": {kind: round(s, 1) for kind, s in driver_threads.items()},
        # Read every 20 s: a bed near its limit shows here before it runs out.
        "direct_mb_peak": memory.peaks(),
    }
