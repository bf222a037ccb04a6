"""What the store checks before it writes: rows prepared or refused, arguments, row filters
as SQL, a backend's requirements, a table that cannot be written."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest

from cursorsync.errors import ConfigError
from cursorsync.tables import (
    RowFilter,
    TableSchemaError,
    load_schema,
    open_store,
    prepare_rows,
    topic_bucket,
)
from cursorsync.tables.store import TableWriteError
from tests.support.table_rows import NOW, TOPICS, make_mappings, make_progress

# --------------------------------------------------------------- row checks


def test_prepare_rows_fills_derived_columns_and_casts() -> None:
    schema = load_schema("sync_progress")
    rows = make_progress(TOPICS[0], "s")
    out = prepare_rows(schema, rows, 9)
    assert out.schema.equals(schema.arrow())
    r = out.to_pylist()[0]
    assert (r["schema_version"], r["batch_id"]) == (1, 9)
    assert r["topic_bucket"] == topic_bucket(TOPICS[0], schema.topic_buckets)
    # Naive timestamps are taken as UTC.
    naive = rows.set_column(rows.schema.get_field_index("emitted_at"), "emitted_at",
                            pa.array([datetime(2026, 1, 2, 3, 4, 5)], pa.timestamp("us")))
    assert prepare_rows(schema, naive, 9).column("emitted_at")[0].as_py() == NOW


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.append_column("extra", pa.array([1])), r"no columns \['extra'\]"),
    (lambda t: t.drop_columns(["outcome"]), "column outcome is required"),
    (lambda t: t.drop_columns(["topic"]), "column topic is required"),
    (lambda t: t.set_column(t.schema.get_field_index("acks_sent"), "acks_sent",
                            pa.array([None], pa.int64())), "acks_sent is not nullable"),
    (lambda t: t.set_column(t.schema.get_field_index("outcome"), "outcome",
                            pa.array(["great"])), "'great' is not a valid outcome"),
    (lambda t: t.append_column("batch_id", pa.array([8])), "batch_id must be the append's"),
    (lambda t: t.append_column("topic_bucket", pa.array([99])), "leave it out"),
    (lambda t: t.set_column(t.schema.get_field_index("lag_ms"), "lag_ms",
                            pa.array(["soon"])), "lag_ms of type string does not convert"),
])
def test_prepare_rows_refuses_bad_rows(
    change: Callable[[pa.Table], pa.Table], message: str
) -> None:
    with pytest.raises(TableSchemaError, match=message):
        prepare_rows(load_schema("sync_progress"), change(make_progress(TOPICS[0], "s")), 9)


def test_append_checks_arguments(tmp_path: Path) -> None:
    store = open_store("delta-rs", str(tmp_path))
    with pytest.raises(ValueError, match="app_id"):
        store.append("mappings", make_mappings(TOPICS[:1]), app_id="", batch_id=0)
    with pytest.raises(ValueError, match="batch_id"):
        store.append("mappings", make_mappings(TOPICS[:1]), app_id="m", batch_id=-1)
    with pytest.raises(TableSchemaError, match="not a valid table"):
        store.read("offsets")  # type: ignore[arg-type]
    assert not store.exists("mappings")  # nothing was created by the refusals


def test_row_filter_as_datafusion_sql() -> None:
    schema = load_schema("cursor_states")
    sql = RowFilter.of(topic="it's", subscription=["a\\b"], max_batch_id=3).sql(
        schema, dialect="datafusion")
    bucket = topic_bucket("it's", schema.topic_buckets)
    assert sql == (f'"topic_bucket" IN ({bucket}) AND "topic" IN (\'it\'\'s\') AND '
                   '"subscription" IN (\'a\\b\') AND "batch_id" <= 3')


def test_row_filter_as_spark_sql() -> None:
    schema = load_schema("cursor_states")
    sql = RowFilter.of(topic="it's", subscription=["a", "b"], min_batch_id=3).sql(schema)
    bucket = topic_bucket("it's", schema.topic_buckets)
    assert sql == (f"`topic_bucket` IN ({bucket}) AND `topic` IN ('it\\'s') AND "
                   "`subscription` IN ('a', 'b') AND `batch_id` >= 3")
    assert RowFilter().sql(schema) is None
    with pytest.raises(TableSchemaError, match="cannot filter table mappings on subscription"):
        RowFilter.of(subscription="s").arrow_expression(load_schema("mappings"))


def test_open_store_names_its_requirements(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a valid backend\. Valid values are: delta-rs"):
        open_store("iceberg", str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a SparkSession"):
        open_store("delta-spark", str(tmp_path))


def test_a_table_that_cannot_be_written_is_named(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine failing a commit (a full disk here) is one clear error naming the table
    and where it lives."""
    import cursorsync.tables.delta_rs as delta_rs

    store = open_store("delta-rs", str(tmp_path / "tables"))
    store.ensure_all()

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(delta_rs, "write_deltalake", full)
    with pytest.raises(TableWriteError, match=r"cannot write table sync_progress at .*/tables/"
                       r"sync_progress: .*No space left on device"):
        store.append("sync_progress", make_progress(TOPICS[0], "s"), app_id="x", batch_id=0)
