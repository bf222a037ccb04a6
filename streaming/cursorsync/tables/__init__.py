"""The Delta table layer: schemas from ``schemas/*.json``, one store interface, two backends.

>>> store = open_store("delta-rs", "/data/cursorsync")        # doctest: +SKIP
>>> store.append("mappings", rows, app_id="mapping-query", batch_id=7)  # doctest: +SKIP
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.errors import ConfigError
from cursorsync.tables.rows import (
    cursor_state_rows,
    cursor_states,
    mapping_rows,
    mappings_rows,
    sync_progress_rows,
    topic_mappings,
)
from cursorsync.tables.schema import (
    SCHEMAS_ENV,
    TABLES,
    Field,
    TableName,
    TableSchema,
    TableSchemaError,
    load_schema,
    schemas_dir,
    topic_bucket,
)
from cursorsync.tables.store import RowFilter, TableStore, prepare_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Backend = Literal["delta-rs", "delta-spark"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)


def open_store(
    backend: Backend,
    path: str,
    *,
    spark: SparkSession | None = None,
    storage_options: dict[str, str] | None = None,
) -> TableStore:
    """A :class:`TableStore` for the tables under ``path``.

    ``delta-rs`` needs nothing else; ``delta-spark`` needs ``spark``, a session
    with the Delta jars and confs (it raises
    :class:`~cursorsync.tables.delta_spark.DeltaSparkUnavailableError` saying
    what is missing). ``storage_options`` are delta-rs object-store options.
    """
    if backend == "delta-rs":
        from cursorsync.tables.delta_rs import DeltaRsStore

        return DeltaRsStore(path, storage_options=storage_options)
    if backend == "delta-spark":
        if spark is None:
            raise ConfigError("the delta-spark backend needs a SparkSession (spark=...)")
        from cursorsync.tables.delta_spark import DeltaSparkStore

        return DeltaSparkStore(path, spark, storage_options=storage_options)
    raise ConfigError(
        f"{backend!r} is not a valid backend. Valid values are: {', '.join(BACKENDS)}"
    )


def open_reader(path: str, *, storage_options: dict[str, str] | None = None) -> TableStore:
    """A delta-rs store to read the tables under ``path``, whichever backend writes them.

    Reading needs no Spark: delta-rs reads what delta-spark wrote. Hadoop's
    ``s3a://`` is spelled ``s3://`` for delta-rs.
    """
    if path.startswith("s3a://"):
        path = "s3://" + path[len("s3a://"):]
    return open_store("delta-rs", path, storage_options=storage_options)


__all__ = [
    "BACKENDS",
    "SCHEMAS_ENV",
    "TABLES",
    "Backend",
    "Field",
    "ObservedCursor",
    "PartitionKey",
    "RowFilter",
    "SyncRecord",
    "TableName",
    "TableSchema",
    "TableSchemaError",
    "TableStore",
    "cursor_state_rows",
    "cursor_states",
    "load_schema",
    "mapping_rows",
    "mappings_rows",
    "open_reader",
    "open_store",
    "prepare_rows",
    "schemas_dir",
    "sync_progress_rows",
    "topic_bucket",
    "topic_mappings",
]
