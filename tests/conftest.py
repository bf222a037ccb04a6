"""Shared fixtures: the real test bed (two Apache Pulsar clusters), started once per run."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cursorsync_devtools.testbed import TestBed, TestBedConfig

_names = itertools.count()


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Clusters a and b, geo-replicated both ways; each test uses topics of its own
    (see ``topic_name``). Its logs stay under pytest's temporary directory."""
    work = Path(os.environ.get("CURSORSYNC_TESTBED_DIR") or tmp_path_factory.mktemp("testbed"))
    with TestBed(TestBedConfig(work_dir=work)) as bed:
        yield bed


@pytest.fixture
def own_testbed(tmp_path: Path) -> Iterator[TestBed]:
    """A pair of clusters for this test alone: for tests that crash a broker, so nothing
    a crash leaves behind (ledgers in recovery, a bookie coming back) reaches other tests.
    Cursors persist their position on the rate limit alone (no periodic flush), so a
    crash loses what a real crash loses at worst: the replicator sends entries again."""
    slow_flush = {"managedLedgerCursorPositionFlushSeconds": "3600"}
    config = TestBedConfig(work_dir=tmp_path / "testbed",
                           settings={"a": slow_flush, "b": slow_flush})
    with TestBed(config) as bed:
        yield bed


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Fresh topic names for this test: ``topic_name("orders")`` -> ``<test>-orders-<n>``."""
    base = request.node.name.split("[")[0].removeprefix("test_")[:40].replace("_", "-")

    def make(suffix: str = "t") -> str:
        return f"{base}-{suffix}-{next(_names)}"

    return make
