"""The one interface every Delta backend implements, and what they share.

A :class:`TableStore` owns a root directory (or object-store prefix) holding
one Delta table per schema file: ``<root>/mappings``, ``<root>/cursor_states``,
``<root>/sync_progress``.

Idempotency contract: ``append(table, rows, app_id=..., batch_id=...)``
writes the rows and records ``(app_id, batch_id)`` as a Delta ``txn`` action in
the same commit, atomically. A later append with the same ``app_id`` and a
``batch_id`` at or below the recorded one writes nothing and returns False:
the replay of a Spark micro-batch after a restart never duplicates rows. The
watermark is per table: a batch that wrote ``cursor_states`` and crashed
before ``sync_progress`` replays into ``sync_progress`` only.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from cursorsync.errors import CursorSyncError
from cursorsync.tables.schema import (
    TABLES,
    TableName,
    TableSchema,
    TableSchemaError,
    _sql_string,
    check_table_name,
    load_schema,
    topic_bucket,
    topic_buckets,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable


class TableWriteError(CursorSyncError):
    """A table could not be written (the path unwritable, the object store refusing, a
    commit failing); names the table and where it lives."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def engine_message(err: BaseException) -> str:
    """A storage engine's error on one line: delta-rs reports causes on indented,
    coloured lines."""
    text = _ANSI.sub("", str(err))
    lines = (line.strip().lstrip("\u21b3").strip() for line in text.splitlines())
    return ": ".join(line for line in lines if line) or type(err).__name__


def _tuple(value: str | int | Iterable[str] | Iterable[int] | None) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | int):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class RowFilter:
    """Which rows :meth:`TableStore.read` returns; None means "any" for each column.

    Topic filters also prune ``topic_bucket`` partitions, so reading one
    topic's rows touches one bucket directory, not the whole table.
    """

    topics: tuple[str, ...] | None = None
    partitions: tuple[int, ...] | None = None
    subscriptions: tuple[str, ...] | None = None
    source_cluster: str | None = None
    target_cluster: str | None = None
    min_batch_id: int | None = None
    max_batch_id: int | None = None

    @classmethod
    def of(
        cls,
        *,
        topic: str | Iterable[str] | None = None,
        partition: int | Iterable[int] | None = None,
        subscription: str | Iterable[str] | None = None,
        source_cluster: str | None = None,
        target_cluster: str | None = None,
        min_batch_id: int | None = None,
        max_batch_id: int | None = None,
    ) -> RowFilter:
        """Build a filter from single values or collections."""
        return cls(
            _tuple(topic), _tuple(partition), _tuple(subscription),
            source_cluster, target_cluster, min_batch_id, max_batch_id,
        )

    def _conditions(self, schema: TableSchema) -> list[tuple[str, str, Any]]:
        """(column, op, value) triples; op is 'in', '=', '>=' or '<='."""
        conds: list[tuple[str, str, Any]] = []
        if self.topics is not None:
            if "topic_bucket" in schema.partition_by:
                buckets = sorted({topic_bucket(t, schema.topic_buckets) for t in self.topics})
                conds.append(("topic_bucket", "in", buckets))
            conds.append(("topic", "in", list(self.topics)))
        for column, values in (("partition", self.partitions),
                               ("subscription", self.subscriptions)):
            if values is not None:
                conds.append((column, "in", list(values)))
        for column, value in (("source_cluster", self.source_cluster),
                              ("target_cluster", self.target_cluster)):
            if value is not None:
                conds.append((column, "=", value))
        if self.min_batch_id is not None:
            conds.append(("batch_id", ">=", self.min_batch_id))
        if self.max_batch_id is not None:
            conds.append(("batch_id", "<=", self.max_batch_id))
        names = schema.column_names
        for column, _, _ in conds:
            if column not in names:
                raise TableSchemaError(
                    f"cannot filter table {schema.name} on {column}: no such column"
                )
        return conds

    def arrow_expression(self, schema: TableSchema) -> pds.Expression | None:
        """The filter as a pyarrow dataset expression (None when it keeps every row)."""
        expr: pds.Expression | None = None
        for column, op, value in self._conditions(schema):
            f = pc.field(column)
            term = (
                f.isin(value) if op == "in"
                else f == value if op == "="
                else f >= value if op == ">="
                else f <= value
            )
            expr = term if expr is None else expr & term
        return expr

    def sql(self, schema: TableSchema, *, dialect: SqlDialect = "spark") -> str | None:
        """The filter as a SQL boolean expression for Spark or DataFusion (delta-rs's
        query engine); None when it keeps every row."""
        quote = _IDENTIFIER_QUOTES[dialect]
        terms = []
        for column, op, value in self._conditions(schema):
            name = f"{quote}{column}{quote}"
            if op == "in":
                items = ", ".join(_sql_literal(v, dialect) for v in value) or "NULL"
                terms.append(f"{name} IN ({items})")
            else:
                terms.append(f"{name} {op} {_sql_literal(value, dialect)}")
        return " AND ".join(terms) if terms else None


#: Spark SQL quotes identifiers with backticks and escapes with backslashes in strings;
#: DataFusion follows standard SQL (double quotes, a quote doubled, backslash literal).
SqlDialect = Literal["spark", "datafusion"]
_IDENTIFIER_QUOTES: dict[str, str] = {"spark": "`", "datafusion": '"'}


def _sql_literal(value: Any, dialect: SqlDialect = "spark") -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if dialect == "datafusion":
        return "'" + str(value).replace("'", "''") + "'"
    return _sql_string(str(value))


def prepare_rows(schema: TableSchema, rows: pa.Table | pa.RecordBatch, batch_id: int) -> pa.Table:
    """Check and complete a batch of rows for ``schema``; the result has exactly its schema.

    Fills ``schema_version``, ``topic_bucket`` and ``batch_id`` when absent and
    refuses them when present with other values; fills absent nullable columns
    with nulls; refuses unknown columns, absent or null non-nullable columns.
    """
    if isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    expected = schema.arrow()
    extra = [n for n in rows.column_names if n not in expected.names]
    if extra:
        raise TableSchemaError(f"table {schema.name} has no columns {extra}")
    n = rows.num_rows
    given = {name: rows.column(name) for name in rows.column_names}
    derived: dict[str, pa.Array] = {
        "schema_version": pa.array([schema.version] * n, pa.int32()),
        "batch_id": pa.array([batch_id] * n, pa.int64()),
    }
    if "topic" not in given:
        raise TableSchemaError(f"table {schema.name}: column topic is required")
    if given["topic"].null_count:
        raise TableSchemaError(f"table {schema.name}: topic is null in some rows")
    derived["topic_bucket"] = topic_buckets(given["topic"].cast(pa.string()), schema.topic_buckets)
    for name, value in derived.items():
        if name in given and n and not pc.all(
            pc.equal(given[name].cast(value.type), value)
        ).as_py():
            raise TableSchemaError(
                f"table {schema.name}: column {name} must be {_describe(name, schema, batch_id)}"
            )
        given.setdefault(name, value)
    columns = [_column(schema, f, given, n) for f in expected]
    return pa.Table.from_arrays(columns, schema=expected)


def _column(schema: TableSchema, f: pa.Field, given: dict[str, Any], n: int) -> Any:
    """Column ``f`` of ``n`` rows from what was given: cast to its type, nulls where it is
    absent and nullable, its values checked; TableSchemaError naming it otherwise."""
    if f.name not in given:
        if not f.nullable:
            raise TableSchemaError(f"table {schema.name}: column {f.name} is required")
        return pa.nulls(n, f.type)
    col = given[f.name]
    try:
        col = col.cast(f.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise TableSchemaError(
            f"table {schema.name}: column {f.name} of type {col.type} "
            f"does not convert to {f.type}: {e}"
        ) from None
    if not f.nullable and col.null_count:
        raise TableSchemaError(
            f"table {schema.name}: column {f.name} is not nullable "
            f"but {col.null_count} rows are null"
        )
    if allowed := schema.field(f.name).values:
        bad = pc.drop_null(pc.filter(col, pc.invert(pc.is_in(col, pa.array(allowed, f.type)))))
        if len(bad):
            raise TableSchemaError(
                f"table {schema.name}: {bad[0].as_py()!r} is not a valid {f.name}. "
                f"Valid values are: {', '.join(allowed)}"
            )
    return col


def _describe(name: str, schema: TableSchema, batch_id: int) -> str:
    if name == "batch_id":
        return f"the append's batch_id {batch_id}"
    if name == "schema_version":
        return f"the schema file's version {schema.version}"
    return f"crc32(topic) mod {schema.topic_buckets} (leave it out: the store computes it)"


class TableStore(ABC):
    """One Delta table per schema file under ``root``, behind one backend."""

    #: The backend name open_store() accepts.
    backend: ClassVar[str]

    def __init__(self, root: str) -> None:
        self._root = root.rstrip("/")

    @property
    def root(self) -> str:
        return self._root

    def uri(self, table: TableName) -> str:
        """Where ``table`` lives: ``<root>/<table>``."""
        return f"{self._root}/{check_table_name(table)}"

    # ---- lifecycle

    @abstractmethod
    def exists(self, table: TableName) -> bool:
        """Whether the table has been created."""

    def ensure(self, table: TableName) -> None:
        """Create the table from its schema file if absent; bring it to its schema file's
        version where that is done in place (:mod:`cursorsync.tables.migrate`); fail if it
        differs otherwise.

        TableWriteError names the table and where when the engine cannot."""
        from cursorsync.tables.migrate import upgrade

        try:
            upgrade(self, table)
            self._ensure(table)
            # Once more for a table just created: record its version.
            upgrade(self, table)
        except CursorSyncError:
            raise
        except Exception as err:
            raise TableWriteError(f"cannot create or open table {table} at {self.uri(table)}: "
                                  f"{engine_message(err)}") from err

    @abstractmethod
    def _ensure(self, table: TableName) -> None:
        """:meth:`ensure` without the error wrapping."""

    def ensure_all(self) -> None:
        for table in TABLES:
            self.ensure(table)

    @abstractmethod
    def delta_log(self, table: TableName) -> DeltaTable | None:
        """The table's Delta log through delta-rs, whichever backend writes it (None when
        there is no table): what schema migrations read and change."""

    @abstractmethod
    def stored_schema(self, table: TableName) -> pa.Schema:
        """The table's schema as the Delta log records it."""

    @abstractmethod
    def partition_columns(self, table: TableName) -> list[str]:
        """The table's partition columns as the Delta log records them."""

    # ---- data

    def append(
        self, table: TableName, rows: pa.Table | pa.RecordBatch, *, app_id: str, batch_id: int
    ) -> bool:
        """Append ``rows`` as batch ``batch_id`` of writer ``app_id``; False if already written.

        The table is created first if absent. An empty ``rows`` still commits,
        so the batch is recorded as done.
        """
        if not app_id:
            raise ValueError("app_id must be a non-empty string")
        if batch_id < 0:
            raise ValueError(f"batch_id must be >= 0, got {batch_id}")
        schema = load_schema(table)
        prepared = prepare_rows(schema, rows, batch_id)
        try:
            return self._append(schema, prepared, app_id, batch_id)
        except CursorSyncError:
            raise
        except Exception as err:  # the engine's own error: say which table and where
            raise TableWriteError(
                f"cannot write table {table} at {self.uri(table)}: {engine_message(err)}"
            ) from err

    @abstractmethod
    def _append(self, schema: TableSchema, rows: pa.Table, app_id: str, batch_id: int) -> bool:
        """Write already prepared rows idempotently (see the module docstring)."""

    @abstractmethod
    def read(
        self,
        table: TableName,
        filter: RowFilter | None = None,
        *,
        columns: list[str] | None = None,
    ) -> pa.Table:
        """Rows matching ``filter`` in the schema file's types (empty if there is no table)."""

    @abstractmethod
    def table_batch(self, table: TableName, app_id: str) -> int | None:
        """The last batch id ``app_id`` committed to ``table``; None if none (or no table)."""

    def last_batch(self, app_id: str, *, table: TableName | None = None) -> int | None:
        """The last batch id ``app_id`` committed: to ``table``, or to any table when None."""
        tables = TABLES if table is None else (check_table_name(table),)
        seen = [v for t in tables if (v := self.table_batch(t, app_id)) is not None]
        return max(seen) if seen else None

    # ---- maintenance

    @abstractmethod
    def compact(self, table: TableName) -> dict[str, Any]:
        """Rewrite small files into larger ones (no data change); returns the engine's metrics."""

    def expire(self, table: TableName, *, time_column: str, before: datetime,
               key_columns: tuple[str, ...]) -> int:
        """Delete rows whose ``time_column`` is before ``before``, except each key's newest row.

        The newest row of every ``key_columns`` key survives however old it is (a cursor
        that stopped moving still has a current state). Kept rows and deletions are one
        commit (a conditional overwrite of the old rows), so a crash leaves either the
        table before or the table after, never a key without its newest row. Returns
        how many rows were deleted.
        """
        schema = load_schema(check_table_name(table))
        if not self.exists(table):
            return 0
        rows = self.read(table)
        if rows.num_rows == 0:
            return 0
        when = rows.column(time_column)
        old_mask = pc.less(when, pa.scalar(before, when.type))
        old = rows.filter(old_mask)
        if old.num_rows == 0:
            return 0
        recent = rows.filter(pc.invert(old_mask)).select(list(key_columns))
        recent_keys = set(zip(*(recent.column(c).to_pylist() for c in key_columns), strict=True))
        # Newest first (time, then batch id), so the first row seen per key is its newest.
        order = old.sort_by([(time_column, "descending"), ("batch_id", "descending")])
        keys = list(zip(*(order.column(c).to_pylist() for c in key_columns), strict=True))
        keep, seen = [], set(recent_keys)
        for i, k in enumerate(keys):
            if k not in seen:
                seen.add(k)
                keep.append(i)
        if len(keep) == old.num_rows:
            return 0
        self._replace_old(schema, time_column, before, order.take(keep))
        return int(old.num_rows) - len(keep)

    def replace_before(self, table: TableName, time_column: str, before: datetime,
                       rows: pa.Table) -> None:
        """Replace every row of ``table`` whose ``time_column`` is before ``before`` by
        ``rows`` (complete rows of the table's schema), in one commit."""
        schema = load_schema(check_table_name(table))
        try:
            self._replace_old(schema, time_column, before, rows.select(schema.arrow().names))
        except CursorSyncError:
            raise
        except Exception as err:
            raise TableWriteError(
                f"cannot rewrite table {table} at {self.uri(table)}: {engine_message(err)}"
            ) from err

    @abstractmethod
    def _replace_old(self, schema: TableSchema, time_column: str, before: datetime,
                     rows: pa.Table) -> None:
        """Atomically replace every row with ``time_column`` before ``before`` by ``rows``."""

    @abstractmethod
    def vacuum(
        self,
        table: TableName,
        retention_hours: int | None = None,
        dry_run: bool = True,
        *,
        enforce_retention_duration: bool = True,
    ) -> list[str]:
        """Delete data files no version within ``retention_hours`` still needs.

        Returns the files to delete on a dry run (the default); after a real run,
        delta-rs returns the files it deleted and delta-spark returns [].
        """

    def _cast_read(
        self, schema: TableSchema, table: pa.Table, columns: list[str] | None
    ) -> pa.Table:
        expected = schema.arrow()
        wanted = columns if columns is not None else expected.names
        unknown = [c for c in wanted if c not in expected.names]
        if unknown:
            raise TableSchemaError(f"table {schema.name} has no columns {unknown}")
        target = pa.schema([expected.field(c) for c in wanted])
        return table.select(wanted).cast(target)
