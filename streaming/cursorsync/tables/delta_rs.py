"""The embedded default backend: delta-rs (the ``deltalake`` package), no JVM.

Idempotency. delta-rs records ``CommitProperties(app_transactions=[...])``
as a ``txn`` action but does NOT enforce it: appending again with an already
recorded (app_id, version) succeeds, duplicates the rows, and may even move
the recorded version backwards (pinned in tests/unit/tables/test_delta_rs.py). So
:meth:`DeltaRsStore._append` checks ``transaction_version(app_id)`` on a
snapshot and commits against that same snapshot.

Concurrency. Two writers racing with the same (app_id, batch_id) both see the
batch as unwritten; both commit on the same read version. delta-rs's conflict
checker rejects the second commit because the winning commit carries a
``txn`` for the same app_id ("Concurrent transaction failed"); the loser
reloads, sees the batch recorded and returns False. So exactly one copy of
the rows lands. Writers with different app_ids, or to different tables,
never conflict (blind appends). This relies on an atomic put-if-absent for
log files: true on local and most object stores; on S3 it needs conditional
put (or a locking provider) in ``storage_options``. Never mix delta-spark
and delta-rs writers on one S3 table.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from typing import Any, ClassVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from cursorsync.tables.migrate import TableVersionError, plan
from cursorsync.tables.schema import (
    TableName,
    TableSchema,
    TableSchemaError,
    check_table_name,
    load_schema,
)
from cursorsync.tables.store import RowFilter, TableStore


def _local_or_uri(path: str) -> str:
    """Absolute path for local roots (delta-rs resolves relative paths per call), URIs as given."""
    if "://" in path:
        return path
    return os.path.abspath(path)


class _Kept(threading.local):
    """A thread's open tables: a handle, its version when kept (a write through it moves
    it) and what that version's commit file was then."""

    def __init__(self) -> None:
        self.tables: dict[TableName, tuple[DeltaTable, int, tuple[int, int]]] = {}


def _commit_file(uri: str, version: int) -> tuple[int, int] | None:
    """The inode and modification time of a local table's commit file, or None."""
    try:
        st = os.stat(os.path.join(uri, "_delta_log", f"{version:020d}.json"))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


class DeltaRsStore(TableStore):
    """Delta tables written and read with delta-rs."""

    backend: ClassVar[str] = "delta-rs"

    def __init__(self, root: str, *, storage_options: dict[str, str] | None = None) -> None:
        super().__init__(_local_or_uri(root))
        self._storage = dict(storage_options or {})
        #: Tables whose stored version reads as it is (or with nullable columns to add).
        self._readable: set[TableName] = set()
        #: Local tables stay open per thread (a delta-rs handle is not for two threads at
        #: once): opening one replays its log from the last checkpoint (35-65 ms for 150
        #: commits on an idle machine), bringing an open one up to date reads the commits
        #: since (about 4 ms), and both sinks read and write their tables every batch.
        self._kept = _Kept()

    def _open(self, table: TableName) -> DeltaTable | None:
        """The table at its latest version; None if there is none."""
        uri = self.uri(table)
        local = "://" not in uri
        kept = self._kept.tables.pop(table, None) if local else None
        dt: DeltaTable | None = None
        # A table deleted (and maybe made again) under an open handle: delta-rs would keep
        # the old state and add the new commits to it. The commit file of the version the
        # handle holds, the same file still, says the table is the same.
        if kept is not None and _commit_file(uri, kept[1]) == kept[2]:
            try:
                kept[0].update_incremental()
                dt = kept[0]
            except (DeltaError, OSError):
                dt = None  # opened anew below
        if dt is None:
            try:
                dt = DeltaTable(uri, storage_options=self._storage or None)
            except TableNotFoundError:
                return None
        version = dt.version()
        commit = _commit_file(uri, version) if local else None
        if commit is not None:
            self._kept.tables[table] = (dt, version, commit)
        return dt

    def _require(self, table: TableName) -> DeltaTable:
        dt = self._open(table)
        if dt is None:
            raise TableSchemaError(f"table {table} does not exist at {self.uri(table)}")
        return dt

    def delta_log(self, table: TableName) -> DeltaTable | None:
        return self._open(table)

    def exists(self, table: TableName) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), storage_options=self._storage or None)

    def _ensure(self, table: TableName) -> None:
        schema = load_schema(check_table_name(table))
        if not self.exists(table):
            try:
                DeltaTable.create(
                    self.uri(table),
                    schema.arrow(),
                    mode="ignore",
                    partition_by=list(schema.partition_by) or None,
                    name=schema.name,
                    # No custom table properties: delta-rs refuses keys it does not know.
                    description=f"{schema.doc} (schema version {schema.version})",
                    storage_options=self._storage or None,
                )
            except (CommitFailedError, DeltaError):
                # Another process created it between our check and our commit.
                if not self.exists(table):
                    raise
        self._check_layout(schema)

    def _check_layout(self, schema: TableSchema) -> None:
        diffs = schema.differences(self.stored_schema(schema.name))
        stored_parts = self.partition_columns(schema.name)
        if stored_parts != list(schema.partition_by):
            diffs.append(f"partition columns {stored_parts} != {list(schema.partition_by)}")
        if diffs:
            raise TableSchemaError(
                f"table {schema.name} at {self.uri(schema.name)} does not match schema file "
                f"version {schema.version}: {'; '.join(diffs)}"
            )

    def stored_schema(self, table: TableName) -> pa.Schema:
        return pa.schema(self._require(table).schema().to_arrow())

    def partition_columns(self, table: TableName) -> list[str]:
        return list(self._require(table).metadata().partition_columns)

    def _append(self, schema: TableSchema, rows: pa.Table, app_id: str, batch_id: int) -> bool:
        dt = self._open(schema.name)
        if dt is None:
            self.ensure(schema.name)
            dt = self._require(schema.name)
        if _done(dt, app_id, batch_id):
            return False
        try:
            # Committing against the snapshot we checked makes a racing writer of the
            # same app_id a conflict instead of a duplicate.
            write_deltalake(
                dt,
                rows,
                mode="append",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id, batch_id)]
                ),
            )
        except CommitFailedError:
            if _done(self._require(schema.name), app_id, batch_id):
                return False
            raise
        return True

    def read(
        self,
        table: TableName,
        filter: RowFilter | None = None,
        *,
        columns: list[str] | None = None,
    ) -> pa.Table:
        schema = load_schema(check_table_name(table))
        dt = self._open(table)
        if dt is None:
            return self._cast_read(schema, schema.arrow().empty_table(), columns)
        # DataFusion prunes files on the log's statistics in Rust: the cost of a selective
        # read (the sync's "batches since the last one") stays small as files accumulate,
        # where a pyarrow dataset builds an expression per file first.
        self._check_readable(table)
        wanted = columns if columns is not None else schema.column_names
        stored = set(pa.schema(dt.schema().to_arrow()).names)
        select = ", ".join(f'"{c}"' for c in wanted if c in schema.column_names and c in stored)
        where = filter.sql(schema, dialect="datafusion") if filter is not None else None
        query = f"SELECT {select or '*'} FROM t" + (f" WHERE {where}" if where else "")
        data = pa.table(QueryBuilder().register("t", dt).execute(query).read_all())
        # A table the job has not opened since an upgrade lacks the new nullable columns:
        # they read as null, as they would once the job adds them.
        arrow = schema.arrow()
        for name in wanted:
            if name in arrow.names and name not in data.column_names:
                data = data.append_column(arrow.field(name),
                                          pa.nulls(data.num_rows, arrow.field(name).type))
        return self._cast_read(schema, data, columns)

    def _check_readable(self, table: TableName) -> None:
        """Refuse, in one line naming the table and what to do, a table whose stored
        version this cursorsync does not read as it is (the job's start or `cursorsync
        migrate` brings it to the schema file first)."""
        if table in self._readable:
            return
        m = plan(self, table)
        if not m.in_place:
            raise TableVersionError(m.refusal())
        self._readable.add(table)

    def table_batch(self, table: TableName, app_id: str) -> int | None:
        dt = self._open(table)
        return None if dt is None else dt.transaction_version(app_id)

    def compact(self, table: TableName) -> dict[str, Any]:
        return dict(self._require(table).optimize.compact())

    def _replace_old(self, schema: TableSchema, time_column: str, before: datetime,
                     rows: pa.Table) -> None:
        cutoff = before.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        write_deltalake(self._require(schema.name), rows.cast(schema.arrow()), mode="overwrite",
                        predicate=f"{time_column} < '{cutoff}'")

    def vacuum(
        self,
        table: TableName,
        retention_hours: int | None = None,
        dry_run: bool = True,
        *,
        enforce_retention_duration: bool = True,
    ) -> list[str]:
        return list(
            self._require(table).vacuum(
                retention_hours=retention_hours,
                dry_run=dry_run,
                enforce_retention_duration=enforce_retention_duration,
            )
        )


def _done(dt: DeltaTable, app_id: str, batch_id: int) -> bool:
    seen = dt.transaction_version(app_id)
    return seen is not None and seen >= batch_id
