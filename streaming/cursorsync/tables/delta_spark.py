"""The cluster backend: delta-spark on a SparkSession with the Delta jars.

Needs the Delta JVM jars on the Spark driver's classpath and the session confs
in :data:`DELTA_SPARK_CONF`. The jars are ``io.delta:delta-spark_<spark
major.minor>_<scala>:<version>`` (``delta-spark_4.2_2.13`` for pyspark 4.2.0) and
``io.delta:delta-storage:<version>``, the version matching the ``delta-spark``
Python package: named in the job's Spark conf as ``spark.jars.packages`` (Spark
resolves them from Maven Central) or ``spark.jars`` (local copies). pyspark
puts them on the driver's classpath when it launches the JVM, so they belong
in the conf of the process's first SparkSession.
:func:`delta_spark_status` says whether a session has both; :func:`find_delta_jars`
looks for local jar copies to name in its message.
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
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
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
    # A table's state is rebuilt from its last checkpoint and the few commits after it (a
    # few files once compacted): 50 tasks by default, mostly scheduling. On a cluster that
    # is seconds per table, each time a query first writes or reads one.
    "spark.databricks.delta.snapshotPartitions": "4",
}
#: Classes that must load for delta-spark to work: the SQL extension and the Python API's peer.
_DELTA_CLASSES = (DELTA_EXTENSION, "io.delta.tables.DeltaTable")
DELTA_JARS_ENV = "CURSORSYNC_DELTA_JARS"
#: A Maven-layout or Ivy jar name of delta-spark (any Spark and Scala suffix) or delta-storage.
_DELTA_JAR = re.compile(
    r"(?:io\.delta_)?(?P<artifact>delta-spark_[0-9._]+|delta-storage)-(?P<version>[0-9][^-]*)\.jar"
)


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
                f"(set spark.jars.packages to {delta_package()}, or spark.jars, in the "
                "conf of the process's first SparkSession; local jars: "
                f"{', '.join(map(str, find_delta_jars())) or 'none'})",
            )
    return DeltaSparkStatus(True, "delta-spark extension, catalog and classes present")


def delta_package() -> str:
    """The Maven coordinate of the Delta jars matching the installed pyspark and delta-spark
    packages (the one ``delta.pip_utils`` names), for ``spark.jars.packages``."""
    import pyspark

    spark = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark}_2.13:{metadata.version('delta-spark')}"


def find_delta_jars() -> tuple[Path, ...]:
    """Local delta-spark and delta-storage jars of one version, for ``spark.jars``; ()
    when there is no such pair.

    Looks in ``$CURSORSYNC_DELTA_JARS`` (os.pathsep-separated directories, e.g. the
    two directories of a Maven repository holding them), ``$SPARK_HOME/jars``,
    pyspark's own jars and the Ivy caches ``spark.jars.packages`` fills, in that
    order. Takes jar names as Maven (``delta-spark_4.2_2.13-4.4.0.jar``,
    ``delta-storage-4.4.0.jar``) and Ivy (``io.delta_`` before them) spell them.
    """
    dirs: list[str] = []
    env = os.environ.get(DELTA_JARS_ENV)
    if env:
        dirs.extend(d for d in env.split(os.pathsep) if d)
    if os.environ.get("SPARK_HOME"):
        dirs.append(os.path.join(os.environ["SPARK_HOME"], "jars"))
    try:
        import pyspark

        dirs.append(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    except ImportError:
        pass
    home = os.path.expanduser("~")
    dirs.extend(os.path.join(home, d, "jars") for d in (".ivy2", ".ivy2.5.2"))
    spark_jars: list[tuple[str, Path]] = []
    storage_jars: dict[str, Path] = {}
    for d in dirs:
        for p in sorted(glob.glob(os.path.join(glob.escape(d), "*.jar"))):
            m = _DELTA_JAR.fullmatch(os.path.basename(p))
            if m is None:
                continue
            if m["artifact"] == "delta-storage":
                storage_jars.setdefault(m["version"], Path(p))
            else:
                spark_jars.append((m["version"], Path(p)))
    for version, jar in spark_jars:
        if version in storage_jars:
            return (jar, storage_jars[version])
    return ()


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
                _delta_rs_uri(self.uri(table)), storage_options=self._storage or None
            )
        except TableNotFoundError:
            return None

    def delta_log(self, table: TableName) -> DeltaTable | None:
        return self._log(table)

    def _path(self, table: TableName) -> str:
        return "`" + self.uri(table).replace("`", "``") + "`"

    def exists(self, table: TableName) -> bool:
        from delta.tables import DeltaTable as SparkDeltaTable

        return bool(SparkDeltaTable.isDeltaTable(self._spark, self.uri(table)))

    def _ensure(self, table: TableName) -> None:
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
        # From the log's metadata with delta-rs: DESCRIBE DETAIL builds the table's whole
        # state in a Spark job (50 tasks), seconds per table on a cluster at start-up.
        log = self._log(table)
        return list(log.metadata().partition_columns) if log is not None else []

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

    def _relative(self, table: TableName, path: str) -> str:
        """``path`` below the table's root, as delta-rs and the Delta log name files
        (VACUUM lists qualified paths: ``file:/...`` for a local root)."""
        root = self.uri(table).rstrip("/")
        for prefix in (root, f"file:{root}", f"file://{root}"):
            if path.startswith(prefix + "/"):
                return path[len(prefix) + 1:]
        return path

    def _replace_old(self, schema: TableSchema, time_column: str, before: datetime,
                     rows: pa.Table) -> None:
        cutoff = before.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        df = self._spark.createDataFrame(rows.cast(schema.arrow()))
        (df.write.format("delta").mode("overwrite")
         .option("replaceWhere", f"{time_column} < TIMESTAMP '{cutoff}'")
         .save(self.uri(schema.name)))

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
        """A dry run lists the files relative to the table's root, as delta-rs does."""
        key = "spark.databricks.delta.retentionDurationCheck.enabled"
        before = self._spark.conf.get(key, "true") or "true"
        retain = f" RETAIN {int(retention_hours)} HOURS" if retention_hours is not None else ""
        try:
            if not enforce_retention_duration:
                self._spark.conf.set(key, "false")
            df = self._spark.sql(
                f"VACUUM delta.{self._path(table)}{retain}{' DRY RUN' if dry_run else ''}"
            )
            return [self._relative(table, r[0]) for r in df.collect()] if dry_run else []
        finally:
            self._spark.conf.set(key, before)
