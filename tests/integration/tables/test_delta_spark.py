"""The delta-spark store in a local Spark session: replayed txn versions skipped, a session
without the Delta jars detected, Spark's DDL and the Arrow rows agree with the schema files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cursorsync.tables import (
    TABLES,
    RowFilter,
    load_schema,
    prepare_rows,
)
from tests.support.delta_spark import _spark_session
from tests.support.table_rows import TOPICS, make_cursor_states


@pytest.mark.spark
def test_delta_spark_skips_a_replayed_txn_version(
    delta_spark_session: object, tmp_path: Path
) -> None:
    """Pin the delta-spark behaviour the store relies on (see delta_spark.py): unlike
    delta-rs, Delta skips a write whose ``txnVersion`` is not above the recorded one, and
    delta-rs reads the version delta-spark recorded."""
    spark = delta_spark_session
    uri = str(tmp_path / "raw")
    df = spark.range(2)  # type: ignore[attr-defined]

    def write(version: int) -> None:
        (df.write.format("delta").mode("append").option("txnAppId", "app")
         .option("txnVersion", str(version)).save(uri))

    write(5)
    write(5)  # a replay: skipped
    write(3)  # an older version: skipped, the recorded version stays
    dt = DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 2
    assert dt.transaction_version("app") == 5
    assert dt.version() == 0  # the skipped writes committed nothing
    write(6)
    dt = DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 4
    assert dt.transaction_version("app") == 6


_WITHOUT_JARS = """
import json, sys
from pyspark.sql import SparkSession
from cursorsync.tables import open_store
from cursorsync.tables.delta_spark import DELTA_SPARK_CONF, delta_spark_status

builder = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
           .config("spark.driver.host", "127.0.0.1")
           .config("spark.driver.bindAddress", "127.0.0.1"))
for k, v in DELTA_SPARK_CONF.items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
try:
    status = delta_spark_status(spark)
    try:
        spark.range(3).count()
        query = None
    except Exception as e:
        query = str(e)
    try:
        open_store("delta-spark", sys.argv[1], spark=spark)
        refused = None
    except Exception as e:
        refused = f"{type(e).__name__}: {e}"
    print(json.dumps({"available": status.available, "reason": status.reason,
                      "query": query, "refused": refused}))
finally:
    spark.stop()
"""


@pytest.mark.spark
def test_delta_spark_detects_a_session_without_delta_jars(tmp_path: Path) -> None:
    """Delta confs set, classes absent: the store refuses the session, naming the jars.

    A process of its own: the Delta jars the other tests put on a JVM's classpath stay there.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_JARS, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["available"] is False
    assert "io.delta.sql.DeltaSparkSessionExtension does not load" in got["reason"]
    assert got["refused"] is not None
    assert got["refused"].startswith("DeltaSparkUnavailableError: delta-spark backend unavailable")
    assert "Delta jars are not on the Spark" in got["refused"]
    # Why the confs go with the jars only: the missing catalog plugin fails every query.
    assert got["query"] is not None and "spark_catalog" in got["query"], got["query"]


@pytest.mark.spark
def test_spark_ddl_and_arrow_rows_agree_with_the_schema_files() -> None:
    """What the delta-spark backend feeds Spark (DDL, Arrow rows, SQL filters) without Delta."""
    from pyspark.sql import SparkSession

    shared = SparkSession.getActiveSession()  # the delta-spark fixture's, when it runs first
    spark = shared or _spark_session({})
    try:
        for table in TABLES:
            schema = load_schema(table)
            empty = spark.createDataFrame([], schema=schema.spark_ddl())
            assert schema.differences(empty.toArrow().schema) == [], table
        schema = load_schema("cursor_states")
        rows = prepare_rows(schema, make_cursor_states(TOPICS[0], ["a", "b"]), 3)
        df = spark.createDataFrame(rows)
        assert schema.differences(df.toArrow().schema) == []
        picked = df.where(RowFilter.of(topic=TOPICS[0], subscription="b").sql(schema))
        assert picked.toArrow().column("subscription").to_pylist() == ["b"]
    finally:
        if shared is None:
            spark.stop()
