"""Shared fixtures: the real test bed (two Apache Pulsar clusters), started once per run."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cursorsync_devtools.testbed import TestBed, TestBedConfig

_names = itertools.count()

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="module")
def three_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Clusters a, b and c, geo-replicated in full mesh, for one test module (three JVMs
    are stopped as soon as the module is done with them); each test uses topics of its
    own."""
    work = tmp_path_factory.mktemp("testbed3")
    with TestBed(TestBedConfig(work_dir=work, clusters=("a", "b", "c"))) as bed:
        yield bed


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Fresh topic names for this test: ``topic_name("orders")`` -> ``<test>-orders-<n>``."""
    base = request.node.name.split("[")[0].removeprefix("test_")[:40].replace("_", "-")

    def make(suffix: str = "t") -> str:
        return f"{base}-{suffix}-{next(_names)}"

    return make


def run_outside(args: list[str], cwd: Path, timeout: float = 120
                ) -> subprocess.CompletedProcess[str]:
    """A command with no PYTHONPATH (nothing from the checkout) and no CURSORSYNC_CONFIG."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CURSORSYNC_CONFIG")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv with the cursorsync wheel installed; its bin directory.

    It sees this interpreter's site-packages for the dependencies (installing pyspark and
    the rest again would take minutes and prove nothing about cursorsync); cursorsync
    itself comes from the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    built = run_outside([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q",
                         "-w", str(tmp / "dist")], cwd=tmp, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("cursorsync-*.whl")
    made = run_outside([sys.executable, "-m", "venv", "--system-site-packages",
                        str(tmp / "venv")], cwd=tmp)
    assert made.returncode == 0, made.stderr
    bin_dir = tmp / "venv" / "bin"
    installed = run_outside([str(bin_dir / "python"), "-m", "pip", "install", "-q",
                             "--no-deps", "--no-index", str(wheel)], cwd=tmp, timeout=300)
    assert installed.returncode == 0, installed.stderr
    yield bin_dir
