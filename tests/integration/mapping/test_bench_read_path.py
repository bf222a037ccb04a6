"""``cursorsync-dev bench read-path`` on the real test bed: both reads cover the backlog on
each cluster, and the read path gives one row per entry there."""

from __future__ import annotations

import pytest

from cursorsync_devtools.testbed import TestBed


@pytest.mark.integration
def test_bench_read_path_reads_every_entry_both_ways(testbed: TestBed) -> None:
    """A plain Reader reads every message (it raises on a timeout short of them) and the
    job's read path yields a row per entry: on a, every entry is digested (identity scope
    all); on b, every entry is stamped or digested."""
    from cursorsync_devtools.bench_read_path import bench_read_path

    r = bench_read_path(300, repeat=2, bed=testbed)
    assert r["entries"] == 300 and r["messages"] > 300 and r["repeat"] == 2
    assert set(r["clusters"]) == {"a", "b"}
    for figures in r["clusters"].values():
        assert figures["rows"] == 300
        assert 0 < figures["reader_us_per_entry_best"] <= figures["reader_us_per_entry_median"]
        assert 0 < figures["read_path_us_per_entry_best"] <= (
            figures["read_path_us_per_entry_median"])
        assert figures["ratio_best"] == pytest.approx(
            figures["read_path_us_per_entry_best"] / figures["reader_us_per_entry_best"],
            abs=0.01)
