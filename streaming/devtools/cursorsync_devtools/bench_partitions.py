"""``cursorsync-dev bench partitions``: one job syncing a topic of many partitions on the real
test bed, failover counted.

The demo's flow (:func:`cursorsync_devtools.demo.demo`) on one partitioned topic of
``partitions`` partitions, a Shared subscription carried by cursorsync beside its built-in
twin. Printed: the failover counts, per-batch time of both queries (the job's own
histogram), sync lag p50 and p99 (``sync_progress`` rows that sent acks), and ``mappings``
rows per mapped entry, as the batches wrote them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc


def bench_partitions(partitions: int = 1000, *, entries_per_partition: int = 20,
                     produce_seconds: float = 30.0, work_dir: str | None = None,
                     timeout_s: float = 900.0) -> dict[str, Any]:
    """Run the workload and the job on ``partitions`` partitions; return the figures."""
    from cursorsync.tables import open_store
    from cursorsync_devtools.demo import demo
    from cursorsync_devtools.testbed.workload import WorkloadSpec

    spec = WorkloadSpec(partitioned_topic="wide", partitions=partitions, plain_topic="wide-plain",
                        chunked_topic=None, entries_per_partition=entries_per_partition,
                        produce_seconds=produce_seconds, subscription_types=("Shared",),
                        foreign_per_partition=0)
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cursorsync-wide-"))
    try:
        report = demo(work_dir=str(root), keep=True, spec=spec, timeout_s=timeout_s)
        store = open_store("delta-rs", str(root / "tables"))
        progress = store.read("sync_progress", columns=["lag_ms", "acks_sent", "outcome"])
        sent = progress.filter(pc.greater(progress.column("acks_sent"), 0))
        lags = np.asarray(sent.column("lag_ms").to_numpy(), float) / 1000
        kinds = store.read("mappings", columns=["kind"]).column("kind")
        segments = int(pc.sum(pc.equal(kinds, "segment")).as_py() or 0)
    finally:
        if not work_dir:
            shutil.rmtree(root, ignore_errors=True)
    ours, builtin = report.cursorsync["Shared"], report.builtin["Shared"]
    messages = ours["messages"]
    return {
        "benchmark": "partitions", "partitions": partitions,
        "topics": report.topics, "messages": messages,
        "losses": ours["losses"], "duplicates": ours["duplicates"],
        "duplicates_partial_batch": ours["partial_batch"],
        "builtin_duplicates": builtin["duplicates"], "builtin_losses": builtin["losses"],
        "sync_caught_up_s": round(report.sync_caught_up_s, 1),
        "batches": report.batch_seconds,
        "sync_lag_p50_s": round(float(np.percentile(lags, 50)), 2) if len(lags) else None,
        "sync_lag_p99_s": round(float(np.percentile(lags, 99)), 2) if len(lags) else None,
        "mapping_rows": len(kinds), "segment_rows": segments,
        "segment_rows_per_entry": round(segments / messages, 4) if messages else None,
        "seconds": round(report.seconds, 1),
    }
