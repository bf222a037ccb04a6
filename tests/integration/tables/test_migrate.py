"""Table schema versions on delta-spark: a table delta-spark wrote with an earlier schema
file, opened by this one; migrations change the log with delta-rs and Spark reads on
(delta-rs's own cases: tests/unit/tables/test_migrate.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cursorsync.tables import SCHEMAS_ENV, RowFilter, open_store
from cursorsync.tables.migrate import VERSION_PROPERTY, TableVersionError, migrate
from tests.support.table_rows import TOPICS, make_progress
from tests.unit.tables.test_migrate import add_column, bump, retype, schema_files

pytestmark = pytest.mark.spark


def written_by_spark_before_versions(spark: object, root: str) -> None:
    store = open_store("delta-spark", root, spark=spark)  # type: ignore[arg-type]
    store._ensure("sync_progress")
    assert store.append("sync_progress", make_progress(TOPICS[0], "billing"),
                        app_id="sync", batch_id=3)


def test_delta_spark_table_gains_nullable_columns_when_it_opens(
    delta_spark_session: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "tables")
    written_by_spark_before_versions(delta_spark_session, root)
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v2", "sync_progress", bump(add_column("broker")))))

    store = open_store("delta-spark", root, spark=delta_spark_session)  # type: ignore[arg-type]
    store.ensure("sync_progress")
    assert DeltaTable(f"{root}/sync_progress").metadata().configuration[VERSION_PROPERTY] == "2"
    rows = store.read("sync_progress")
    assert rows.column("subscription").to_pylist() == ["billing"]
    assert rows.column("broker").to_pylist() == [None]
    new = make_progress(TOPICS[0], "audit").append_column("broker", pa.array(["b-1"]))
    assert store.append("sync_progress", new, app_id="sync", batch_id=4)
    assert store.read("sync_progress", RowFilter.of(subscription="audit")).column(
        "broker").to_pylist() == ["b-1"]
    assert store.last_batch("sync") == 4


def test_delta_spark_table_needing_a_rewrite_is_refused_until_migrated(
    delta_spark_session: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "tables")
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v1", "sync_progress", retype("lag_ms", "int"))))
    written_by_spark_before_versions(delta_spark_session, root)
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(tmp_path, "v2", "sync_progress", bump())))

    store = open_store("delta-spark", root, spark=delta_spark_session)  # type: ignore[arg-type]
    with pytest.raises(TableVersionError, match=r"table sync_progress at .* is at version 1 .*"
                       r"lag_ms: type int32 -> int64.*`cursorsync migrate -c FILE`"):
        store.ensure("sync_progress")
    migrate(open_store("delta-rs", root), "sync_progress")
    store.ensure("sync_progress")
    rows = store.read("sync_progress")
    assert rows.column("lag_ms").to_pylist() == [250]
    assert rows.column("subscription").to_pylist() == ["billing"]
    assert not store.append("sync_progress", make_progress(TOPICS[0], "billing"),
                            app_id="sync", batch_id=3)
    assert store.append("sync_progress", make_progress(TOPICS[0], "audit"),
                        app_id="sync", batch_id=4)
    assert store.read("sync_progress").num_rows == 2
