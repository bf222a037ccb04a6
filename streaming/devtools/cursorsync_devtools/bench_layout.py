"""``cursorsync-dev bench layout``: what a Spark row per entry costs the JVM against
``layout=arrow``.

The mapping query's rows go from a Python data source into Spark and straight
back out to the driver as Arrow (the sink's ``toArrow``). This benchmark runs
exactly that path on synthetic evidence rows (no broker: the reading cost is
not what is compared), in one Spark session, the two layouts alternated
``repeat`` times, and prints the JVM's CPU time and the wall time of each plus
the packed/rows ratios of their medians. Both layouts must hand the driver the
same rows; that is checked, not assumed.

JVM CPU comes from ``/proc`` (Linux); elsewhere it is reported as None.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from cursorsync.mapping.entries_options import (
    ARROW_BATCH_ROWS,
    EVIDENCE_COLUMNS,
    output_schema,
    schema_of,
)
from cursorsync.mapping.entries_rows import pack_batches, unpack_batches
from cursorsync_devtools.testbed.cpu import own_cpu_s, read_stat

SOURCE_NAME = "cursorsync-bench-rows"
LAYOUTS = ("rows", "arrow")


def evidence_batch(partition: int, start: int, count: int) -> pa.RecordBatch:
    """Rows shaped like the bench's: 4 partitions, a stamp on 4 entries of 5, digests."""
    schema = to_arrow_schema(schema_of(EVIDENCE_COLUMNS), timezone="UTC")
    entries = range(start, start + count)
    return pa.RecordBatch.from_arrays([
        pa.array(["B"] * count), pa.array(["persistent://public/default/bulk"] * count),
        pa.array([partition % 4] * count, pa.int32()), pa.array([7] * count, pa.int64()),
        pa.array(entries, pa.int64()), pa.array([-1] * count, pa.int32()),
        pa.array([1] * count, pa.int32()),
        pa.array([None if e % 5 else "bench-producer" for e in entries], pa.string()),
        pa.array([None if e % 5 else 1_700_000_000_000 + e for e in entries], pa.int64()),
        pa.array([f"3:{e}" if e % 5 else None for e in entries], pa.string()),
        pa.array([e.to_bytes(16, "big") for e in entries], pa.binary()),
        pa.array([None] * count, pa.string()),  # no chunked message
    ], schema=schema)


class _Partition(InputPartition):
    def __init__(self, index: int, rows: int) -> None:
        super().__init__(index)
        self.rows = rows


class _Reader(DataSourceReader):
    def __init__(self, rows: int, tasks: int, packed: bool) -> None:
        self.rows, self.tasks, self.packed = rows, tasks, packed

    def partitions(self) -> list[InputPartition]:
        share, extra = divmod(self.rows, self.tasks)
        return [_Partition(i, share + (i < extra)) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Partition)
        batches = (evidence_batch(partition.value, off, min(ARROW_BATCH_ROWS,
                                                            partition.rows - off))
                   for off in range(0, partition.rows, ARROW_BATCH_ROWS))
        return pack_batches(batches, "B") if self.packed else batches


class BenchRowsDataSource(DataSource):
    """Synthetic evidence rows in either layout (options rows, partitions, layout)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return output_schema(EVIDENCE_COLUMNS, self.options.get("layout") == "arrow")

    def reader(self, schema: StructType) -> _Reader:
        return _Reader(int(self.options["rows"]), int(self.options["partitions"]),
                       self.options.get("layout") == "arrow")


def _cpu_of(pid: int) -> float | None:
    stat = read_stat(Path(f"/proc/{pid}/stat"))
    if stat is None:
        return None
    fields = stat[1]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _collect(spark: Any, layout: str, rows: int, partitions: int) -> pa.Table:
    df = (spark.read.format(SOURCE_NAME).option("rows", str(rows))
          .option("partitions", str(partitions)).option("layout", layout).load())
    table = df.toArrow()
    return unpack_batches(table, EVIDENCE_COLUMNS) if layout == "arrow" else table


def run_layout(spark: Any, *, rows: int = 100_000, partitions: int = 8,
               repeat: int = 5) -> dict[str, Any]:
    """Alternate the layouts ``repeat`` times after one warm-up each; the figures."""
    spark.dataSource.register(BenchRowsDataSource)
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    key = [("partition", "ascending"), ("entry", "ascending")]
    first = {layout: _collect(spark, layout, rows, partitions) for layout in LAYOUTS}
    if not first["arrow"].sort_by(key).equals(first["rows"].sort_by(key)):
        raise AssertionError("the two layouts handed the driver different rows")
    runs: dict[str, list[dict[str, float | None]]] = {layout: [] for layout in LAYOUTS}
    for _ in range(repeat):
        for layout in LAYOUTS:
            jvm0, own0, t0 = _cpu_of(jvm_pid), own_cpu_s(), time.perf_counter()
            got = _collect(spark, layout, rows, partitions)
            wall = time.perf_counter() - t0
            jvm1 = _cpu_of(jvm_pid)
            if got.num_rows != rows:
                raise AssertionError(f"layout {layout}: {got.num_rows} rows, not {rows}")
            runs[layout].append({
                "wall_s": round(wall, 3),
                "jvm_cpu_s": None if jvm0 is None or jvm1 is None else round(jvm1 - jvm0, 3),
                "driver_cpu_s": round(own_cpu_s() - own0, 3)})

    def median(layout: str, figure: str) -> float | None:
        values = [r[figure] for r in runs[layout]]
        return None if None in values else statistics.median(v for v in values if v is not None)

    out: dict[str, Any] = {"benchmark": "layout", "rows": rows, "partitions": partitions,
                           "repeat": repeat, "runs": runs}
    for figure in ("wall_s", "jvm_cpu_s", "driver_cpu_s"):
        a, r = median("arrow", figure), median("rows", figure)
        out[f"median_{figure}"] = {"rows": r, "arrow": a}
        out[f"ratio_{figure}"] = round(a / r, 3) if a is not None and r else None
    return out
