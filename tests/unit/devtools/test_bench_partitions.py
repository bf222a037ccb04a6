"""``bench partitions``' runs: their labels and the config each one runs with."""

from __future__ import annotations

from pathlib import Path


def test_kept_reader_runs_are_labelled_and_set_both_clusters(tmp_path: Path) -> None:
    """``bench partitions --kept-readers``: the baseline run opens a reader per range
    (``kept_readers: 0`` on both clusters), the other keeps the config's."""
    from cursorsync_devtools import bench_partitions
    from cursorsync_devtools.demo import demo_config

    class Bed:
        def service_url(self, name: str) -> str:
            return f"pulsar://{name}:6650"

        def admin_url(self, name: str) -> str:
            return f"http://{name}:8080"

        def topic(self, name: str) -> str:
            return f"persistent://t/ns/{name}"

    labels = [bench_partitions._label("probe", False, False, kept) for kept in (False, True)]
    assert labels == ["probe-per-range", "probe-kept"]
    assert bench_partitions._label("probe", False, True) == "probe-digests"
    off = demo_config(Bed(), tmp_path, topics=["x"], subscriptions=["s"], kept_readers=0)
    default = demo_config(Bed(), tmp_path, topics=["x"], subscriptions=["s"])
    assert (off.source.kept_readers, off.target.kept_readers) == (0, 0)
    assert default.source.kept_readers == default.target.kept_readers == 2048
