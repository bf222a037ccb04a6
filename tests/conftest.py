"""Shared fixtures: the real test bed (two Apache Pulsar clusters), started once per run."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from cursorsync.app.logs import NOISY_LOGGERS
from cursorsync_devtools.testbed import TestBed, TestBedConfig, broker_plugin_path
from tests.support.admin_stub import StubAdmin
from tests.support.paths import ROOT
from tests.support.processes import run_outside
from tests.support.shared import RESOURCES, grouped, names_used

#: Fixtures kept in the support package, for every test module.
pytest_plugins = ["tests.support.delta_spark"]

_names = itertools.count()

# No per-example deadline: on a shared 2-core machine a slow example says nothing about
# the code, and hypothesis would fail it as flaky.
settings.register_profile("cursorsync", deadline=None)
settings.load_profile("cursorsync")


SLOW = os.environ.get("CURSORSYNC_SLOW") == "1"


#: Fixtures whose resource several modules share (see tests.support.shared).
SHARED = ("three_testbed", "index_testbed", "delta_spark_session")
#: Module id -> the shared resources its tests use.
_MODULE_USES: dict[str, set[str]] = {}


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (soaks, long benchmarks, facts with test beds of their own)
    run only with ``CURSORSYNC_SLOW=1``: CI's time goes to the safety tests. The modules
    sharing a resource run one after another."""
    if not SLOW:
        skip = pytest.mark.skip(reason="marked slow: runs with CURSORSYNC_SLOW=1")
        for item in items:
            if item.get_closest_marker("slow"):
                item.add_marker(skip)
    _MODULE_USES.clear()
    for item in items:
        _MODULE_USES.setdefault(_module(item), set()).update(names_used(
            getattr(item, "fixturenames", ()),
            (m.args[0] for m in item.iter_markers("shares")), SHARED))
    rank = {m: i for i, m in enumerate(grouped(list(_MODULE_USES.items()), SHARED))}
    items.sort(key=lambda item: rank[_module(item)])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's own teardown, close the shared resources the next test's module does
    not use."""
    try:
        return (yield)
    finally:
        RESOURCES.keep_only(set() if nextitem is None
                            else _MODULE_USES.get(_module(nextitem), set()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    RESOURCES.keep_only(set())


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
def three_testbed(tmp_path_factory: pytest.TempPathFactory) -> TestBed:
    """Clusters a, b and c, geo-replicated in full mesh, shared by the modules that use
    them (tests.support.shared); each test uses topics of its own."""
    return RESOURCES.get("three_testbed", lambda: TestBed(TestBedConfig(
        work_dir=tmp_path_factory.mktemp("testbed3"), clusters=("a", "b", "c"))))


@pytest.fixture(scope="module")
def index_testbed(tmp_path_factory: pytest.TempPathFactory) -> TestBed:
    """Clusters a and b with batch-index acknowledgement on (4.1's default) and
    cursorsync's broker plugin loaded, shared by the modules that use them."""
    on = {"acknowledgmentAtBatchIndexLevelEnabled": "true"}
    return RESOURCES.get("index_testbed", lambda: TestBed(TestBedConfig(
        work_dir=tmp_path_factory.mktemp("index-acks"), settings={"a": on, "b": on},
        broker_plugin=broker_plugin_path())))


@pytest.fixture
def admin() -> Iterator[StubAdmin]:
    """A stub Pulsar admin server (tests.support.admin_stub), stopped after the test."""
    s = StubAdmin().start()
    yield s
    s.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Fresh topic names for this test: ``topic_name("orders")`` -> ``<test>-orders-<n>``."""
    base = request.node.name.split("[")[0].removeprefix("test_")[:40].replace("_", "-")

    def make(suffix: str = "t") -> str:
        return f"{base}-{suffix}-{next(_names)}"

    return make


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheels built from the checkout: ``cursorsync`` (the product) and
    ``cursorsync-devtools`` (streaming/devtools).

    Built from a copy without the checkout's build output: setuptools ships whatever an
    earlier build left in build/lib, modules since moved or deleted included."""
    dist = tmp_path_factory.mktemp("wheels")
    source = dist / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "spark-warehouse", "work"))
    built = {}
    for name, tree, pattern in (("cursorsync", source, "cursorsync-*.whl"),
                                ("cursorsync-devtools", source / "streaming" / "devtools",
                                 "cursorsync_devtools-*.whl")):
        out = dist / name
        r = run_outside([sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "-q",
                         "-w", str(out)], cwd=dist, timeout=300)
        assert r.returncode == 0, r.stderr
        (built[name],) = out.glob(pattern)
    return built


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]
               ) -> Iterator[Path]:
    """A virtualenv with the cursorsync wheel and the development tools' installed; its bin
    directory.

    It sees this interpreter's site-packages for the dependencies (installing pyspark and
    the rest again would take minutes and prove nothing about cursorsync); cursorsync and
    its development tools themselves come from the wheels."""
    tmp = tmp_path_factory.mktemp("wheel")
    made = run_outside([sys.executable, "-m", "venv", "--system-site-packages",
                        str(tmp / "venv")], cwd=tmp)
    assert made.returncode == 0, made.stderr
    bin_dir = tmp / "venv" / "bin"
    installed = run_outside([str(bin_dir / "python"), "-m", "pip", "install", "-q",
                             "--no-deps", "--no-index", *map(str, wheels.values())],
                            cwd=tmp, timeout=300)
    assert installed.returncode == 0, installed.stderr
    yield bin_dir


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging (each command line's global options) changes process-wide state;
    put it back after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {n: logging.getLogger(n).level for n in NOISY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in noisy.items():
        logging.getLogger(name).setLevel(lvl)
    logging.captureWarnings(False)
