"""Table schema versions: what version a stored table is at, and the way to its schema file's.

The rule (docs/upgrading.md#table-schemas):

* Every schema file has a ``version``. A table records the version it was last brought to,
  and its topic bucket count, in its Delta table properties :data:`VERSION_PROPERTY` and
  :data:`BUCKETS_PROPERTY`. A table without them was written before versions were
  recorded: its version is the highest ``schema_version`` in its rows (0 when it has none).
* **In place, when the table is opened** (the job's start, a command's first write):
  a new version whose columns are the stored ones, or the stored ones followed by new
  nullable columns. The new columns are added (null in the rows already there), then
  the version is recorded; every row stays where it is.
* **Rewritten by ``cursorsync migrate``, the job stopped**: a column widened (``int`` to
  ``long``, ``float`` to ``double``), a column's nullability changed, new nullable
  columns before stored ones, a new topic bucket count. Opening such a table refuses
  with one message naming it, its version and the command. The rewrite reads every row,
  converts it and overwrites the table in one commit, which keeps the tables' batch
  watermarks (Delta ``txn`` actions).
* **Refused**: a stored column the file no longer has (its values would be lost), a new
  column that is not nullable (no value for the rows there), a type that does not widen,
  other partition columns; and a table at a version newer than this cursorsync's.

Every change goes through delta-rs on the table's log, whichever backend writes it: the
Delta protocol is the same, and the job is not running (or is opening its tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import pyarrow as pa

from cursorsync.tables.schema import (
    TableName,
    TableSchema,
    TableSchemaError,
    _normalize,
    check_table_name,
    load_schema,
    topic_buckets,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

#: The schema file version a table was last brought to (a Delta table property).
VERSION_PROPERTY = "cursorsync.schemaVersion"
#: The topic bucket count its rows' ``topic_bucket`` was computed with.
BUCKETS_PROPERTY = "cursorsync.topicBuckets"
MIGRATE_COMMAND = "cursorsync migrate -c FILE"

Action = Literal["absent", "current", "record", "add-columns", "rewrite", "newer", "refused"]
#: Actions done when a table is opened, without asking.
IN_PLACE: frozenset[Action] = frozenset({"current", "record", "add-columns"})


class TableVersionError(TableSchemaError):
    """A stored table's schema is not one this cursorsync opens as it is (see the module
    docstring): the message names the table, its version and what to do."""


class DeltaLogs(Protocol):
    """What migrations need of a table store: where a table is and its Delta log."""

    def uri(self, table: TableName) -> str: ...

    def delta_log(self, table: TableName) -> DeltaTable | None: ...


@dataclass(frozen=True)
class Migration:
    """What it takes to bring one stored table to its schema file."""

    table: TableName
    uri: str
    action: Action
    #: The stored table's version; None when there is no table.
    stored_version: int | None
    #: The schema file's version.
    version: int
    #: Whether ``stored_version`` is recorded in the table's properties (False: its rows').
    recorded: bool = True
    #: What differs, one item per column or property.
    changes: tuple[str, ...] = ()
    #: Columns added in place (action ``add-columns``).
    add: tuple[str, ...] = field(default=())

    @property
    def in_place(self) -> bool:
        return self.action in IN_PLACE

    def describe(self) -> str:
        """One line for ``cursorsync migrate``."""
        at = self._at()
        what = {
            "absent": "absent (the job creates it)",
            "current": f"at version {self.version}, current",
            "record": f"{at}: records version {self.version} (no column changes)",
            "add-columns": f"{at}: adds nullable columns {', '.join(self.add)}, "
                           f"records version {self.version}",
            "rewrite": f"{at}: rewrites every row for version {self.version} "
                       f"({'; '.join(self.changes)})",
            "newer": f"{at}, newer than this cursorsync's version {self.version}: refused",
            "refused": f"{at}: no migration to version {self.version} "
                       f"({'; '.join(self.changes)})",
        }[self.action]
        return f"{self.table}: {what}"

    def refusal(self) -> str:
        """Why the table does not open, and what to do; one line."""
        where = f"table {self.table} at {self.uri} is {self._at()}"
        if self.action == "newer":
            return (f"{where}, newer than this cursorsync's schema version {self.version}: "
                    "run the release that wrote it, or a later one")
        if self.action == "rewrite":
            return (f"{where} and this cursorsync needs version {self.version}, which rewrites "
                    f"its rows ({'; '.join(self.changes)}): stop the job and run "
                    f"`{MIGRATE_COMMAND}` (--dry-run shows what it does)")
        return (f"{where} and no migration leads to version {self.version} "
                f"({'; '.join(self.changes)}): run the release that wrote it")

    def _at(self) -> str:
        if self.recorded:
            return f"at version {self.stored_version}"
        return f"at version {self.stored_version} (its rows'; no version recorded)"


def plan(store: DeltaLogs, table: TableName) -> Migration:
    """What bringing ``table`` to its schema file takes; reads the Delta log only."""
    schema = load_schema(check_table_name(table))
    uri = store.uri(table)
    log = store.delta_log(table)
    if log is None:
        return Migration(table, uri, "absent", None, schema.version)
    return _plan(schema, uri, log)


def upgrade(store: DeltaLogs, table: TableName) -> Migration:
    """Bring an existing ``table`` to its schema file where that is done in place; raise
    :class:`TableVersionError` where it is not. Nothing happens to an absent table."""
    from deltalake.exceptions import CommitFailedError

    for _ in range(3):
        m = plan(store, table)
        if m.action == "absent":
            return m
        if not m.in_place:
            raise TableVersionError(m.refusal())
        try:
            _in_place(m, load_schema(table), _log(store, table))
        except CommitFailedError:
            continue  # another process changed the table meanwhile: plan again
        return m
    raise TableVersionError(f"table {table} at {store.uri(table)} kept changing while its "
                            "schema version was recorded: is another job opening it?")


def migrate(store: DeltaLogs, table: TableName, *, dry_run: bool = False) -> Migration:
    """``cursorsync migrate`` for one table: what :func:`upgrade` does, and the rewrites.

    With ``dry_run`` only plans. Raises :class:`TableVersionError` for a table nothing
    migrates (``newer``, ``refused``), after planning (so a dry run says it too).
    """
    m = plan(store, table)
    if m.action in ("newer", "refused"):
        raise TableVersionError(m.refusal())
    if dry_run or m.action == "absent":
        return m
    schema = load_schema(table)
    log = _log(store, table)
    if m.action == "rewrite":
        _rewrite(schema, log)
        log = _log(store, table)
    _in_place(m, schema, log)
    return m


# ------------------------------------------------------------------ planning


def _plan(schema: TableSchema, uri: str, log: DeltaTable) -> Migration:
    props = dict(log.metadata().configuration)
    recorded = VERSION_PROPERTY in props
    version = int(props[VERSION_PROPERTY]) if recorded else _row_version(log)
    buckets = int(props[BUCKETS_PROPERTY]) if BUCKETS_PROPERTY in props else None

    def result(action: Action, changes: list[str] | tuple[str, ...] = (),
               add: tuple[str, ...] = ()) -> Migration:
        return Migration(schema.name, uri, action, version, schema.version, recorded,
                         tuple(changes), add)

    if version > schema.version:
        return result("newer")
    stored = pa.schema(log.schema().to_arrow())
    refused, rewrite, add = _differences(schema, stored, list(log.metadata().partition_columns))
    if buckets is not None and buckets != schema.topic_buckets:
        rewrite.append(f"topic buckets {buckets} -> {schema.topic_buckets}")
    if refused:
        return result("refused", refused)
    if rewrite:
        return result("rewrite", rewrite)
    if add:
        return result("add-columns", [f"new column {c}" for c in add], add)
    if not recorded or version != schema.version or buckets is None:
        return result("record")
    return result("current")


def _differences(schema: TableSchema, stored: pa.Schema, partitions: list[str]
                 ) -> tuple[list[str], list[str], tuple[str, ...]]:
    """(changes nothing migrates, changes a rewrite makes, columns added in place)."""
    want = schema.arrow()
    refused: list[str] = []
    rewrite: list[str] = []
    dropped = [n for n in stored.names if n not in want.names]
    if dropped:
        refused.append(f"columns {', '.join(dropped)} are not in the schema file")
    new = [f for f in want if f.name not in stored.names]
    if not_null := [f.name for f in new if not f.nullable]:
        refused.append(f"new columns {', '.join(not_null)} are not nullable")
    if partitions != list(schema.partition_by):
        refused.append(f"partition columns {partitions} -> {list(schema.partition_by)}")
    for f in want:
        if f.name not in stored.names:
            continue
        got = stored.field(f.name)
        have = _normalize(got.type)
        if not have.equals(f.type):
            target = rewrite if _widens(have, f.type) else refused
            target.append(f"{f.name}: type {have} -> {f.type}")
        if got.nullable != f.nullable:
            rewrite.append(f"{f.name}: nullable {got.nullable} -> {f.nullable}")
    kept = [n for n in want.names if n in stored.names]
    if not dropped and want.names[:len(stored.names)] != stored.names:
        rewrite.append(f"column order {kept} -> {want.names}")
    return refused, rewrite, tuple(f.name for f in new)


def _widens(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether every value of type ``have`` is a value of ``want``."""
    if pa.types.is_signed_integer(have) and pa.types.is_signed_integer(want):
        return bool(want.bit_width >= have.bit_width)
    if pa.types.is_floating(have) and pa.types.is_floating(want):
        return bool(want.bit_width >= have.bit_width)
    return False


def _row_version(log: DeltaTable) -> int:
    """The highest ``schema_version`` in the rows of a table that records none; 0 if empty."""
    from deltalake import QueryBuilder

    result = QueryBuilder().register("t", log).execute(
        'SELECT max("schema_version") AS v FROM t').read_all()
    value = pa.table(result).column("v")[0].as_py()
    return int(value) if value is not None else 0


# ------------------------------------------------------------------ changing


def _log(store: DeltaLogs, table: TableName) -> DeltaTable:
    log = store.delta_log(table)
    if log is None:
        raise TableSchemaError(f"table {table} does not exist at {store.uri(table)}")
    return log


def _in_place(m: Migration, schema: TableSchema, log: DeltaTable) -> None:
    """Add the new nullable columns, then record the version: a crash in between leaves a
    table whose next opening records it."""
    from deltalake.schema import Field

    if m.action == "current":
        return
    want = schema.arrow()
    # ``add`` is empty after a rewrite: its overwrite wrote every column.
    add = [c for c in m.add if c not in pa.schema(log.schema().to_arrow()).names]
    if add:
        log.alter.add_columns([Field.from_arrow(want.field(c)) for c in add])
    log.alter.set_table_properties(
        {VERSION_PROPERTY: str(schema.version), BUCKETS_PROPERTY: str(schema.topic_buckets)},
        raise_if_not_exists=False,
    )


def _rewrite(schema: TableSchema, log: DeltaTable) -> None:
    """Every row converted to ``schema``, in one overwrite commit (the table's txn
    watermarks and properties stay)."""
    from deltalake import QueryBuilder, write_deltalake

    rows = pa.table(QueryBuilder().register("t", log).execute("SELECT * FROM t").read_all())
    columns: list[pa.Array | pa.ChunkedArray] = []
    for f in schema.arrow():
        if f.name == "topic_bucket":
            columns.append(topic_buckets(rows.column("topic").cast(pa.string()),
                                         schema.topic_buckets))
        elif f.name in rows.column_names:
            columns.append(_convert(schema, f, rows.column(f.name)))
        else:
            columns.append(pa.nulls(rows.num_rows, f.type))
    converted = pa.Table.from_arrays(columns, schema=schema.arrow())
    write_deltalake(log, converted, mode="overwrite", schema_mode="overwrite",
                    partition_by=list(schema.partition_by) or None)


def _convert(schema: TableSchema, f: pa.Field, column: pa.ChunkedArray) -> pa.ChunkedArray:
    if not f.nullable and column.null_count:
        raise TableVersionError(
            f"table {schema.name}: column {f.name} is not nullable in schema version "
            f"{schema.version} but {column.null_count} rows hold null; nothing was changed")
    try:
        return column.cast(f.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise TableVersionError(
            f"table {schema.name}: column {f.name} does not convert to {f.type}: {e}; "
            "nothing was changed") from None
