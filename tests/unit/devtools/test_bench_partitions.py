"""``bench partitions``' runs: their labels and the config each one runs with."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


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


def test_digests_only_runs_each_mode_with_the_plugin_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--digests-only``: the plugin loaded and one run per mode, with
    ``spark.cursor_digests``; ``--cursor-digests``: the baseline first, then that run."""
    from cursorsync_devtools import bench_partitions, testbed

    made: list[dict[str, Any]] = []

    class Bed:
        config = SimpleNamespace(tenant="t", namespace="ns")

        def __init__(self, config: Any) -> None:
            made.append(config)

        def start(self) -> Bed:
            return self

        def admin_call(self, *a: Any, **k: Any) -> None:
            return None

        def stop(self) -> None:
            return None

    monkeypatch.setattr(testbed, "TestBed", Bed)
    monkeypatch.setattr(testbed, "TestBedConfig", lambda **k: k)
    monkeypatch.setattr(testbed, "broker_plugin_path", lambda: tmp_path / "plugin.nar")
    watched: list[bool] = []
    monkeypatch.setattr(bench_partitions, "_run", lambda *a, digests, watch_builtin, **k: (
        watched.append(watch_builtin), {"digests": digests})[1])
    only = bench_partitions.bench_partitions(10, holes=("probe",), digests_only=True,
                                             work_dir=str(tmp_path))
    assert only["runs"] == {"probe-digests": {"digests": True}} and only["cursor_digests"]
    pair = bench_partitions.bench_partitions(10, holes=("probe",), cursor_digests=True,
                                             work_dir=str(tmp_path))
    assert list(pair["runs"]) == ["probe", "probe-digests"]
    assert all(c["broker_plugin"] == tmp_path / "plugin.nar" for c in made)
    # The built-in's cursors followed only after the sync caught up unless asked.
    assert watched == [False] * 3 and not pair["watch_builtin"]
    watched.clear()
    bench_partitions.bench_partitions(10, holes=("probe",), digests_only=True,
                                      work_dir=str(tmp_path), watch_builtin=True)
    assert watched == [True]
