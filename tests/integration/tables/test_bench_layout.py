"""``cursorsync-dev bench layout``, tiny: both layouts hand the driver the same rows, figures
out."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = [pytest.mark.spark]


def test_tiny_layout_run_checks_the_rows_and_reports_both_layouts() -> None:
    from pyspark.sql import SparkSession

    from cursorsync_devtools.bench_layout import evidence_batch, run_layout

    spark: Any = (SparkSession.builder.master("local[1]").appName("cursorsync-test-layout")
                  .config("spark.ui.enabled", "false").getOrCreate())
    out = run_layout(spark, rows=5_000, partitions=3, repeat=1)
    json.dumps(out)  # what --json prints
    assert out["rows"] == 5_000 and out["repeat"] == 1
    assert [len(out["runs"][k]) for k in ("rows", "arrow")] == [1, 1]
    for figure in ("wall_s", "jvm_cpu_s", "driver_cpu_s"):
        assert set(out[f"median_{figure}"]) == {"rows", "arrow"}
    assert out["ratio_wall_s"] > 0
    # The synthetic rows look like the bench's: a stamp on 4 entries of 5, a digest each.
    batch = evidence_batch(1, 10, 5).to_pydict()
    assert batch["source_position"] == [None, "3:11", "3:12", "3:13", "3:14"]
    assert len(set(batch["entry_identity"])) == 5


def test_rows_that_differ_between_layouts_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is real: a packed path that loses a row is reported, not timed."""
    from pyspark.sql import SparkSession

    import cursorsync_devtools.bench_layout as bl

    real = bl.unpack_batches
    monkeypatch.setattr(bl, "unpack_batches", lambda t, c: real(t, c).slice(1))
    spark: Any = SparkSession.builder.master("local[1]").getOrCreate()
    with pytest.raises(AssertionError, match="different rows"):
        bl.run_layout(spark, rows=500, partitions=2, repeat=1)
