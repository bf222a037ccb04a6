"""``cursorsync-dev bench read-path``: what the mapping's executors spend per entry read,
beside a plain Reader over the same entries.

A backlog (a topic of one partition, a share of it batches) is produced on the test bed's
cluster a and replicated to b. Then, in this one process and alternating ``repeat``
times on each cluster: a plain pulsar-client Reader reads every message and only counts
them (the baseline: what the client and broker deliver), and the job's own read path
reads the same entries as one Spark task of the mapping query would
(``PulsarEntriesStreamReader.read`` with the options the job gives that side: Arrow
record batches, packed). Printed per cluster: this process's CPU time per entry of each
(best and median of the rounds), their ratio, and the rows the read path gave.

No Spark: the figure is the Python workers' share of a mapping batch, which ``bench
e2e`` shows beside the brokers' and Spark's. Nothing is asserted about time.
"""

from __future__ import annotations

import statistics
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from cursorsync_devtools.testbed.cpu import own_cpu_s

CLUSTERS = ("a", "b")
T = TypeVar("T")
#: How long a plain Reader waits for a message before the run fails.
READ_TIMEOUT_MS = 30_000


def bench_read_path(entries: int = 50_000, *, repeat: int = 3, batched_fraction: float = 0.2,
                    batch_size: int = 5, bed: Any = None, seed: int = 1) -> dict[str, Any]:
    """Start the test bed (unless ``bed`` is given), produce the backlog, read it both ways
    on each cluster ``repeat`` times; the figures."""
    from cursorsync_devtools.testbed import TestBed

    own = bed is None
    if own:
        bed = TestBed().start()
    try:
        return _bench(bed, entries, repeat, batched_fraction, batch_size, seed)
    finally:
        if own:
            bed.stop()


def _bench(bed: Any, entries: int, repeat: int, batched_fraction: float, batch_size: int,
           seed: int) -> dict[str, Any]:
    from cursorsync.app.streams import entries_options
    from cursorsync.mapping.entries import PulsarEntriesStreamReader
    from cursorsync.mapping.entries_options import EntriesOptions
    from cursorsync.mapping.entries_tasks import BEFORE_ALL, EntriesTask
    from cursorsync_devtools.bench_e2e import retention_subscriptions
    from cursorsync_devtools.demo import demo_config
    from cursorsync_devtools.testbed.produce import Plan, entries_of, produce

    name = f"read-path-{uuid.uuid4().hex[:8]}"
    parts = bed.create_topic(name, 1)
    retention_subscriptions(bed, name)
    backlog = produce(bed, Plan.of(parts, entries, batched_fraction=batched_fraction,
                                   batch_size=batch_size, seed=seed))
    bed.wait_replicated([name], timeout_s=600)
    topic, produced = parts[0], len(entries_of(backlog))
    with tempfile.TemporaryDirectory() as root:
        config = demo_config(bed, Path(root), topics=[name], subscriptions=["sync-shared"])
    sides: dict[str, Literal["source", "target"]] = {"a": "source", "b": "target"}
    readers = {c: PulsarEntriesStreamReader(EntriesOptions.parse(entries_options(config, s)))
               for c, s in sides.items()}
    try:
        # The whole backlog, as one range: the task a Spark executor would read.
        tasks = {c: EntriesTask(tuple(r.ranges({topic: BEFORE_ALL},
                                               {topic: bed.last_entry(c, topic)})))
                 for c, r in readers.items()}
        rounds: dict[str, dict[str, list[float]]] = {c: {"reader": [], "read_path": []}
                                                    for c in CLUSTERS}
        rows: dict[str, int] = {}
        for _ in range(repeat):
            for cluster in CLUSTERS:
                seconds, _ = _cpu_s(_plain_reader, bed, cluster, topic, len(backlog))
                rounds[cluster]["reader"].append(seconds)
                seconds, rows[cluster] = _cpu_s(_read_path_rows, readers[cluster],
                                                tasks[cluster])
                rounds[cluster]["read_path"].append(seconds)
    finally:
        for r in readers.values():
            r.stop()
    return {"entries": produced, "messages": len(backlog), "repeat": repeat,
            "batched_fraction": batched_fraction, "batch_size": batch_size,
            "clusters": {c: _figures(rounds[c], produced, rows[c]) for c in CLUSTERS}}


def _cpu_s(work: Callable[..., T], *args: Any) -> tuple[float, T]:
    """This process's CPU-seconds over ``work(*args)``, and what it returned."""
    t0 = own_cpu_s()
    out = work(*args)
    return own_cpu_s() - t0, out


def _plain_reader(bed: Any, cluster: str, topic: str, messages: int) -> None:
    """Every message from the earliest on a Reader, only counted."""
    import pulsar

    reader = bed.client(cluster).create_reader(topic, pulsar.MessageId.earliest)
    try:
        for _ in range(messages):
            reader.read_next(READ_TIMEOUT_MS)
    finally:
        reader.close()


def _read_path_rows(reader: Any, task: Any) -> int:
    """Rows of one task read as an executor reads it (the job's options pack each record
    batch into a row that counts its rows)."""
    return sum(batch.column("rows")[0].as_py() for batch in reader.read(task))


def _figures(cpu: dict[str, list[float]], entries: int, rows: int) -> dict[str, Any]:
    def us(values: list[float], pick: Callable[[list[float]], float]) -> float:
        return round(pick(values) / entries * 1e6, 1)

    best = {k: us(v, min) for k, v in cpu.items()}
    return {"reader_us_per_entry_best": best["reader"],
            "reader_us_per_entry_median": us(cpu["reader"], statistics.median),
            "read_path_us_per_entry_best": best["read_path"],
            "read_path_us_per_entry_median": us(cpu["read_path"], statistics.median),
            "ratio_best": round(best["read_path"] / best["reader"], 2) if best["reader"] else None,
            "rows": rows}
