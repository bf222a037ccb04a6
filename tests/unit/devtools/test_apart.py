"""A workload run in a process of its own: its result, its CPU, its failure, and the test
bed it reaches from there (on a real bed and job: tests/e2e, through the demo)."""

from __future__ import annotations

import os
import pickle
import time

import pytest

from cursorsync_devtools.testbed import TestBed, TestBedConfig
from cursorsync_devtools.testbed.apart import in_own_process


def _busy(seconds: float) -> int:
    """Spins on a core for ``seconds``; returns the process's id."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return os.getpid()


def _fails() -> None:
    raise ValueError("the workload's own error")


def test_a_function_runs_in_another_process_and_its_cpu_is_told() -> None:
    before = time.process_time()
    apart = in_own_process(_busy, 0.5)
    assert apart.value != os.getpid()
    assert apart.cpu_s >= 0.5
    # Not this process's time: it only waited.
    assert time.process_time() - before < 0.4


def test_its_failure_is_raised_here() -> None:
    with pytest.raises(ValueError, match="the workload's own error"):
        in_own_process(_fails)


def test_a_bed_copy_reaches_the_same_clusters_and_owns_none_of_them() -> None:
    bed = TestBed(TestBedConfig())  # a temporary work dir, which its stop() removes
    for n, c in enumerate(bed.clusters.values()):
        c.broker_port, c.web_port = 16650 + n, 18080 + n
    copy = pickle.loads(pickle.dumps(bed))
    assert {n: (c.service_url, c.admin_url) for n, c in copy.clusters.items()} == {
        n: (c.service_url, c.admin_url) for n, c in bed.clusters.items()}
    assert all(c.pid is None for c in copy.clusters.values())
    assert copy.namespace == bed.namespace
    copy.stop()  # its clients and connections only
    assert bed.work_dir.is_dir()
    bed.stop()
    assert not bed.work_dir.exists()
