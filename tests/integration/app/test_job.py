"""The job's queries in Spark: a query stopped while writing its first offsets restarts."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.spark
def test_a_query_stopped_while_writing_its_first_offsets_restarts(tmp_path: Path) -> None:
    """What such a stop leaves (the first offsets' temporary file, never renamed) makes
    Spark 4 refuse to start the query again, for good; with the job's setting it starts."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    from cursorsync.app.session import RESTARTABLE_CONF

    spark = (SparkSession.builder.master("local[1]").appName("cursorsync-test-restart")
             .config("spark.ui.enabled", "false").getOrCreate())
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"x": 1}\n')
    offsets = tmp_path / "ck" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.5f1d0b7e-0000-4000-8000-000000000000.tmp").write_bytes(b"")
    seen: list[int] = []

    def run() -> None:
        q = (spark.readStream.schema("x long").json(str(tmp_path / "in")).writeStream
             .foreachBatch(lambda df, _: seen.append(df.count()))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        finished = q.awaitTermination(120)
        assert finished, f"the query did not finish within 120 s: {q.status}"

    key = "spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart"
    try:
        spark.conf.set(key, "true")  # Spark's default (another test's session may differ)
        with pytest.raises(StreamingQueryException,
                           match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
            run()
        for k, v in RESTARTABLE_CONF.items():
            spark.conf.set(k, v)
        run()
        assert seen == [1]
    finally:
        spark.conf.unset(key)
