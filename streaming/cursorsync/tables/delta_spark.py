"""The cluster backend: delta-spark on a SparkSession with the Delta jars.

Needs the Delta JVM jars on the Spark classpath (``spark.jars.packages``
``io.delta:delta-spark_2.13:<version>`` resolved from Maven, or ``spark.jars``
pointing at local copies) and the session confs in :data:`DELTA_SPARK_CONF`.
:func:`delta_spark_status` says whether a session has both; :func:`find_delta_jars`
looks for local jar copies (Maven is unreachable in some environments).
Set those confs only when the jars are there: observed with pyspark 4.2.0, a
session whose ``spark_catalog`` is DeltaCatalog without the jars fails every
query ("Cannot find catalog plugin class for catalog 'spark_catalog'"), even
``spark.range(3).count()``; a missing extension class alone is only a warning.

Idempotency is delta-spark's own: the writer options ``txnAppId`` /
``txnVersion`` make Delta skip a version it has already recorded for that
app id, and its conflict checker fails one of two concurrent commits with
the same app id. delta-spark has no public API that tells whether a write
was skipped, so before writing the store reads the recorded version from
the Delta log with delta-rs (same protocol, read only) and returns False
for a batch already written. Under a race the check can pass in both
writers: Delta still lands one copy, but both appends may return True.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cursorsync.tables.schema import (
    TableName,
    TableSchema,
    TableSchemaError,
    _sql_string,
    check_table_name,
    load_schema,
)
from cursorsync.tables.store import RowFilter, TableStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
#: Session confs delta-spark needs (set them when building the session).
DELTA_SPARK_CONF: dict[str, str] = {
    "spark.sql.extensions": DELTA_EXTENSION,
    "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
}
#: Classes that must load for delta-spark to work: the SQL extension and the Python API's peer.
_DELTA_CLASSES = (DELTA_EXTENSION, "io.delta.tables.DeltaTable")
DELTA_JARS_ENV = "CURSORSYNC_DELTA_JARS"


class DeltaSparkUnavailableError(TableSchemaError):
    """The SparkSession cannot run delta-spark (jars or confs missing)."""


@dataclass(frozen=True, slots=True)
class DeltaSparkStatus:
    available: bool
    reason: str


def delta_spark_status(spark: SparkSession) -> DeltaSparkStatus:
    """Whether ``spark`` has the Delta extension and catalog configured and the classes load."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_EXTENSION not in extensions.split(","):
        return DeltaSparkStatus(False, f"spark.sql.extensions does not include {DELTA_EXTENSION}")
    catalog = spark.conf.get("spark.sql.catalog.spark_catalog", "") or ""
    if catalog != DELTA_CATALOG:
        return DeltaSparkStatus(
            False, f"spark.sql.catalog.spark_catalog is {catalog!r}, not {DELTA_CATALOG}"
        )
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return DeltaSparkStatus(False, "not a classic (JVM) SparkSession: cannot check Delta jars")
    from py4j.protocol import Py4JError

    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for name in _DELTA_CLASSES:
        try:
            loader.loadClass(name)
        except Py4JError:
            return DeltaSparkStatus(
                False,
                f"class {name} does not load: the Delta jars are not on the Spark classpath "
                "(set spark.jars.packages or spark.jars; local jars: "
                f"{find_delta_jars() or 'none'})",
            )
    return DeltaSparkStatus(True, "delta-spark extension, catalog and classes present")


def find_delta_jars() -> tuple[Path, ...]:
    """Local delta-spark and delta-storage jars, for ``spark.jars``; () when none are found.

    Looks in ``$CURSORSYNC_DELTA_JARS`` (os.pathsep-separated directories),
    ``$SPARK_HOME/jars``, pyspark's own jars and the Ivy caches Spark uses.
    """
    dirs: list[str] = []
    env = os.environ.get(DELTA_JARS_ENV)
    if env:
        dirs.extend(env.split(os.pathsep))
    if os.environ.get("SPARK_HOME"):
        dirs.append(os.path.join(os.environ["SPARK_HOME"], "jars"))
    try:
        import pyspark

        dirs.append(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    except ImportError:
        pass
    home = os.path.expanduser("~")
    dirs.extend(os.path.join(home, d, "jars") for d in (".ivy2", ".ivy2.5.2"))
    found: dict[str, Path] = {}
    for d in dirs:
        for pattern in ("delta-spark_*.jar", "io.delta_delta-spark_*.jar",
                        "delta-storage-*.jar", "io.delta_delta-storage-*.jar"):
            for p in sorted(glob.glob(os.path.join(d, pattern))):
                kind = "spark" if "delta-spark" in p else "storage"
                found.setdefault(kind, Path(p))
    if set(found) != {"spark", "storage"}:
        return ()
    return (found["spark"], found["storage"])


def _delta_rs_uri(uri: str) -> str:
    """delta-rs spells Hadoop's s3a:// as s3://."""
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


class DeltaSparkStore(TableStore):
    """Delta tables written and read through a SparkSession with delta-spark."""

    backend: ClassVar[str] = "delta-spark"

    def __init__(
        self, root: str, spark: SparkSession, *, storage_options: dict[str, str] | None = None
    ) -> None:
        """``storage_options`` are delta-rs's, used only to read txn versions from the log."""
        status = delta_spark_status(spark)
        if not status.available:
            raise DeltaSparkUnavailableError(f"delta-spark backend unavailable: {status.reason}")
        if "://" not in root:
            root = os.path.abspath(root)
        super().__init__(root)
        self._spark = spark
        self._storage = dict(storage_options or {})

    def _log(self, table: TableName) -> DeltaTable | None:
        try:
            return DeltaTable(
                _delta_rs_uri(self.uri(table)), storage_options=self._storage or None,
                without_files=True,
            )
        except TableNotFoundError:
            return None

    def _path(self, table: TableName) -> str:
        return "`" + self.uri(table).replace("`", "``") + "`"

    def exists(self, table: TableName) -> bool:
        from delta.tables import DeltaTable as SparkDeltaTable

        return bool(SparkDeltaTable.isDeltaTable(self._spark, self.uri(table)))

    def ensure(self, table: TableName) -> None:
        schema = load_schema(check_table_name(table))
        parts = ", ".join(f"`{c}`" for c in schema.partition_by)
        self._spark.sql(
            f"CREATE TABLE IF NOT EXISTS delta.{self._path(table)} ({schema.spark_ddl()}) "
            f"USING delta {f'PARTITIONED BY ({parts})' if parts else ''} "
            # No custom TBLPROPERTIES: delta-rs (which reads txn versions here) may refuse them.
            f"COMMENT {_sql_string(f'{schema.doc} (schema version {schema.version})')}"
        )
        diffs = schema.differences(self.stored_schema(table))
        stored_parts = self.partition_columns(table)
        if stored_parts != list(schema.partition_by):
            diffs.append(f"partition columns {stored_parts} != {list(schema.partition_by)}")
        if diffs:
            raise TableSchemaError(
                f"table {table} at {self.uri(table)} does not match schema file "
                f"version {schema.version}: {'; '.join(diffs)}"
            )

    def stored_schema(self, table: TableName) -> pa.Schema:
        df = self._spark.read.format("delta").load(self.uri(table))
        return df.limit(0).toArrow().schema

    def partition_columns(self, table: TableName) -> list[str]:
        row = self._spark.sql(f"DESCRIBE DETAIL delta.{self._path(table)}").first()
        return list(row["partitionColumns"]) if row is not None else []

    def _append(self, schema: TableSchema, rows: pa.Table, app_id: str, batch_id: int) -> bool:
        if not self.exists(schema.name):
            self.ensure(schema.name)
        seen = self.table_batch(schema.name, app_id)
        if seen is not None and seen >= batch_id:
            return False
        df = self._spark.createDataFrame(rows)
        (
            df.write.format("delta")
            .mode("append")
            .option("txnAppId", app_id)
            .option("txnVersion", str(batch_id))
            .save(self.uri(schema.name))
        )
        return True

    def read(
        self,
        table: TableName,
        filter: RowFilter | None = None,
        *,
        columns: list[str] | None = None,
    ) -> pa.Table:
        schema = load_schema(check_table_name(table))
        if not self.exists(table):
            return self._cast_read(schema, schema.arrow().empty_table(), columns)
        df = self._spark.read.format("delta").load(self.uri(table))
        condition = filter.sql(schema) if filter is not None else None
        if condition:
            df = df.where(condition)
        return self._cast_read(schema, df.toArrow(), columns)

    def table_batch(self, table: TableName, app_id: str) -> int | None:
        log = self._log(table)
        return None if log is None else log.transaction_version(app_id)

    def compact(self, table: TableName) -> dict[str, Any]:
        row = self._spark.sql(f"OPTIMIZE delta.{self._path(table)}").first()
        return row.asDict(recursive=True) if row is not None else {}

    def vacuum(
        self,
        table: TableName,
        retention_hours: int | None = None,
        dry_run: bool = True,
        *,
        enforce_retention_duration: bool = True,
    ) -> list[str]:
        key = "spark.databricks.delta.retentionDurationCheck.enabled"
        before = self._spark.conf.get(key, "true") or "true"
        retain = f" RETAIN {int(retention_hours)} HOURS" if retention_hours is not None else ""
        try:
            if not enforce_retention_duration:
                self._spark.conf.set(key, "false")
            df = self._spark.sql(
                f"VACUUM delta.{self._path(table)}{retain}{' DRY RUN' if dry_run else ''}"
            )
            return [r[0] for r in df.collect()] if dry_run else []
        finally:
            self._spark.conf.set(key, before)
