"""A local Spark session with the Delta jars, for the delta-spark backend's tests: import
``delta_spark_session`` into a test module to use the fixture there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cursorsync.tables.delta_spark import DELTA_SPARK_CONF, delta_spark_status
from cursorsync_devtools.testbed.delta_jars import ensure_delta_jars
from cursorsync_devtools.testbed.distribution import SetupError
from tests.support.shared import RESOURCES
from tests.support.spark_jvm import shut_down_jvm


def _spark_session(extra: dict[str, str]):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[1]")
        .appName("cursorsync-test-tables")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "1")
    )
    for k, v in extra.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


#: Small-table settings for one core: Delta replays its log in 50 tasks by default, and
#: VACUUM lists a table's directories in 10,000 (about a minute on local[1]).
_DELTA_TEST_CONF = {
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "1",
}


def _delta_jars() -> list[Path]:
    """The Delta jars from the cache; a failed fetch fails the test with Maven's reason."""
    try:
        return ensure_delta_jars()
    except SetupError as e:
        failure = str(e)
    pytest.fail(f"delta-spark: {failure}", pytrace=False)


@contextmanager
def _delta_session() -> Iterator[object]:
    jars = _delta_jars()
    shut_down_jvm()
    spark = _spark_session({**DELTA_SPARK_CONF, **_DELTA_TEST_CONF,
                            "spark.jars": ",".join(map(str, jars))})
    try:
        status = delta_spark_status(spark)
        if not status.available:
            pytest.fail(f"delta-spark: {status.reason} (spark.jars: {jars})", pytrace=False)
        yield spark
    finally:
        spark.stop()
        shut_down_jvm()


@pytest.fixture
def delta_spark_session() -> object:
    """A local session with the Delta jars from Maven Central, in a JVM of its own, shared
    by the modules that use it (a case asking for it by ``request.getfixturevalue`` carries
    ``pytest.mark.shares("delta_spark_session")``)."""
    return RESOURCES.get("delta_spark_session", _delta_session)
