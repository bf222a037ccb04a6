"""Each query's checkpoint matched with the tables before the queries start.

Table writes are idempotent per (writer, batch id): an append whose batch id a table
recorded for its writer already writes nothing (:mod:`cursorsync.tables.store`). Spark
numbers a new checkpoint's batches from 0 again, so a checkpoint is *bound* to the tables:
a batch's id in the tables is Spark's plus the checkpoint's ``base``, fixed when the
binding is made. A replayed batch keeps its id (the base does not change in a
checkpoint's life), so replays still write nothing twice; a new checkpoint's base is one
past the last batch the tables recorded for its query, so its appends (halts, status
rows) land, and what reads the tables by batch id (the previous cursor states, the
builder's known mappings, the sync's incremental mapping reads) sees the older batches
as older.

The binding is written on both sides: ``cursorsync-tables.json`` in the query's
checkpoint directory (a random generation id, the base, the tables' root, Spark's query
id once there is one), and in the query's every-batch table an empty commit of writer
``<writer>.checkpoint.<generation>`` at version ``base``. A start then finds one of:

* no binding and no batch in the checkpoint (none, empty, or replaced by an empty one):
  bound now; carries on.
* no binding, batches in it (written before bindings existed): base 0; bound if its
  batch ids agree with the tables (below), else refused.
* a binding the tables know, with its query id, and batch ids that agree: carries on.
* a binding the tables do not know, or another Spark query id: the checkpoint was made
  with other tables, or replaced; refused.

Batch ids agree when, with base B, the checkpoint's last offsets N and last commit C:
no table holds a batch of the writer above B+N (a batch writes only after Spark logged
its offsets; above it, the checkpoint is older than the tables: a restored backup), and
the every-batch table holds B+C or later (Spark commits a batch after its writes; short
of it, the tables are older than the checkpoint). A refusal is one line naming the checkpoint, the
table and both batch ids; moving the checkpoint aside makes the next start bind a new one.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from cursorsync.app.spark_checkpoint import (
    CheckpointReadError,
    QueryCheckpoint,
    filesystem,
    read_checkpoint,
    read_text,
    write_text,
)
from cursorsync.errors import CursorSyncError
from cursorsync.mapping.sink import MAPPING_APP
from cursorsync.sync.sink import SYNC_APP
from cursorsync.tables.rows import row_schema
from cursorsync.tables.schema import TABLES, TableName
from cursorsync.tables.store import TableStore

log = logging.getLogger(__name__)

#: The binding's file, in the query's checkpoint directory (Spark ignores it).
BINDING_FILE = "cursorsync-tables.json"
BINDING_VERSION = 1


class CheckpointMismatchError(CursorSyncError):
    """A query's checkpoint does not go with the tables; names the checkpoint, the table,
    both batch ids and what to do."""


@dataclass(frozen=True, slots=True)
class Query:
    """What the match needs of a streaming query."""

    name: str
    #: Its writer id in the tables' transaction log.
    app_id: str
    #: The table it appends to in every batch (empty or not).
    table: TableName


QUERIES: dict[str, Query] = {"mapping": Query("mapping", MAPPING_APP, "mappings"),
                             "sync": Query("sync", SYNC_APP, "sync_progress")}


@dataclass(frozen=True, slots=True)
class Binding:
    """A checkpoint's side of the binding."""

    query: str
    generation: str
    base: int
    #: The tables' root when bound (for messages: tables may move).
    tables: str
    spark_query_id: str | None = None
    bound_at: str = ""

    def text(self) -> str:
        return json.dumps({"version": BINDING_VERSION, **asdict(self)}, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str, path: str) -> Binding:
        try:
            doc = json.loads(text)
            if doc.get("version") != BINDING_VERSION:
                raise ValueError(f"version {doc.get('version')!r} is not {BINDING_VERSION}")
            return cls(str(doc["query"]), str(doc["generation"]), int(doc["base"]),
                       str(doc["tables"]), doc.get("spark_query_id"), str(doc.get("bound_at", "")))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointReadError(f"checkpoint binding {path} cannot be read ({err}); "
                                      "restore it, or move its checkpoint aside") from err


def identity_app(app_id: str, generation: str) -> str:
    """The writer id under which the tables record a checkpoint generation."""
    return f"{app_id}.checkpoint.{generation}"


def bind_checkpoints(store: TableStore, locations: Mapping[str, str], *,
                     builder_state: str | None = None) -> dict[str, int]:
    """Match each query's checkpoint (``locations``: query name -> directory) with the
    tables, then bind what is not bound yet; returns each query's base.

    ``builder_state``: the mapping builder's state directory, emptied when the mapping
    query's checkpoint is new (its states belong to a checkpoint that is gone).
    Raises :class:`CheckpointMismatchError` when a checkpoint does not go with the tables,
    before anything is written.
    """
    found = [match(store, QUERIES[name], location) for name, location in locations.items()]
    return {m.query.name: m.apply(store, stale_states=builder_state
                                  if m.query.name == "mapping" else None) for m in found}


def bind(store: TableStore, query: Query, location: str, *,
         stale_states: str | None = None) -> int:
    """Match one query's checkpoint with the tables and bind it; its base."""
    return match(store, query, location).apply(store, stale_states=stale_states)


@dataclass(frozen=True, slots=True)
class Match:
    """A checkpoint that goes with the tables, and what binding it still needs."""

    query: Query
    location: str
    checkpoint: QueryCheckpoint
    binding: Binding
    #: Not bound yet: the tables' record and the file are written.
    new: bool

    def apply(self, store: TableStore, *, stale_states: str | None = None) -> int:
        """Write what the binding needs; the base."""
        fs, root = filesystem(self.location)
        path = f"{root}/{BINDING_FILE}"
        base = self.binding.base
        if self.new:
            if self.checkpoint.fresh and stale_states is not None:
                _clear_states(stale_states)
            # The tables first: a binding file the tables do not know is a refusal.
            table = self.query.table
            store.append(table, row_schema(table).empty_table(),
                         app_id=identity_app(self.query.app_id, self.binding.generation),
                         batch_id=base)
            _write(fs, path, self.binding)
            log.info("checkpoint %s bound to the tables at %s: a batch's id there is Spark's "
                     "plus %d", self.location, store.root, base)
        elif self.checkpoint.query_id is not None and self.binding.spark_query_id is None:
            _write(fs, path, replace(self.binding, spark_query_id=self.checkpoint.query_id))
        return base


def match(store: TableStore, query: Query, location: str) -> Match:
    """Check one query's checkpoint against the tables (see the module docstring), writing
    nothing; raises :class:`CheckpointMismatchError` when it does not go with them."""
    ckpt = read_checkpoint(location)
    fs, root = filesystem(location)
    path = f"{root}/{BINDING_FILE}"
    try:
        text = read_text(fs, path)
    except OSError as err:
        raise CheckpointReadError(f"cannot read checkpoint binding {path}: {err}") from err
    recorded = store.last_batch(query.app_id)
    if text is not None:
        binding = Binding.parse(text, path)
        _check_identity(store, query, ckpt, binding, recorded)
        _check_batches(store, query, ckpt, binding.base, recorded)
        return Match(query, location, ckpt, binding, new=False)
    if ckpt.fresh:
        base = 0 if recorded is None else recorded + 1
        if recorded is not None:
            log.warning("checkpoint %s is new and the tables hold batches up to %d of %s: "
                        "its batches are numbered from %d on in the tables",
                        location, recorded, query.app_id, base)
    else:
        base = 0  # written before bindings existed: Spark's batch ids are the tables'
        _check_batches(store, query, ckpt, base, recorded)
    binding = Binding(query.name, uuid.uuid4().hex, base, store.root, ckpt.query_id,
                      datetime.now(UTC).isoformat())
    return Match(query, location, ckpt, binding, new=True)


def _check_identity(store: TableStore, query: Query, ckpt: QueryCheckpoint, binding: Binding,
                    recorded: int | None) -> None:
    where = f"table {query.table} at {store.uri(query.table)}"
    move = f"or move {ckpt.location} aside to start a new checkpoint bound to these tables"
    if binding.query != query.name:
        raise CheckpointMismatchError(
            f"checkpoint {ckpt.location} is bound as query {binding.query}, not {query.name}: "
            f"the checkpoint directories were swapped; put them back, {move}")
    known = store.table_batch(query.table, identity_app(query.app_id, binding.generation))
    if known != binding.base:
        raise CheckpointMismatchError(
            f"checkpoint {ckpt.location} was not made with these tables: it was bound at "
            f"batch {binding.base} to the tables at {binding.tables} (generation "
            f"{binding.generation}), and {where} has no record of it (its last batch of "
            f"{query.app_id}: {_text(recorded)}); point tables.path at the tables it was "
            f"made with, {move}")
    if (ckpt.query_id is not None and binding.spark_query_id is not None
            and ckpt.query_id != binding.spark_query_id):
        raise CheckpointMismatchError(
            f"checkpoint {ckpt.location} was replaced: it holds Spark query {ckpt.query_id}, "
            f"but query {binding.spark_query_id} was bound at batch {binding.base} to "
            f"{where} (its last batch of {query.app_id}: {_text(recorded)}); restore the "
            f"checkpoint, {move}")


def _check_batches(store: TableStore, query: Query, ckpt: QueryCheckpoint, base: int,
                   recorded: int | None) -> None:
    """Refuses a checkpoint older than the tables, or tables older than the checkpoint."""
    move = f"or move {ckpt.location} aside to start a new checkpoint bound to these tables"
    last = base + ckpt.last_offset if ckpt.last_offset is not None else base - 1
    if recorded is not None and recorded > last:
        table = _highest(store, query.app_id)
        its = (f"its last batch is {ckpt.last_offset} (batch {last} in the tables)"
               if ckpt.last_offset is not None
               else f"it has no batch yet (its first is batch {base} in the tables)")
        raise CheckpointMismatchError(
            f"checkpoint {ckpt.location} is older than the tables: {its}, but table {table} "
            f"at {store.uri(table)} holds batch {recorded} of {query.app_id}; restore the "
            f"checkpoint saved with these tables, {move}")
    if ckpt.last_commit is None:
        return
    done = base + ckpt.last_commit
    main = store.table_batch(query.table, query.app_id)
    if main is None or main < done:
        raise CheckpointMismatchError(
            f"table {query.table} at {store.uri(query.table)} is older than checkpoint "
            f"{ckpt.location}: the checkpoint completed batch {ckpt.last_commit} (batch "
            f"{done} in the tables), and the table's last batch of {query.app_id} is "
            f"{_text(main)}; restore the tables saved with this checkpoint, {move}")


def _highest(store: TableStore, app_id: str) -> TableName:
    """The table holding the writer's highest batch id."""
    found = [(b, t) for t in TABLES if (b := store.table_batch(t, app_id)) is not None]
    return max(found)[1]


def _text(batch: int | None) -> str:
    return "none" if batch is None else str(batch)


def _write(fs: pafs.FileSystem, path: str, binding: Binding) -> None:
    try:
        write_text(fs, path, binding.text())
    except OSError as err:
        raise CheckpointReadError(f"cannot write checkpoint binding {path}: {err}") from err


def _clear_states(directory: str) -> None:
    """Delete the builder states a gone checkpoint left (a new one starts without)."""
    fs, root = filesystem(directory)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        old = [i.path for i in infos if i.base_name.startswith("builder-")]
        for p in old:
            fs.delete_file(p)
    except OSError as err:
        raise CheckpointReadError(f"cannot clear builder states in {directory}: {err}") from err
    if old:
        log.info("deleted %d builder states of a former checkpoint in %s", len(old), directory)


class Rebased:
    """A ``foreachBatch`` function called with the tables' batch id: Spark's plus the base."""

    def __init__(self, sink: Callable[[Any, int], None], base: int) -> None:
        self.sink = sink
        self.base = base

    def __call__(self, df: Any, batch_id: int) -> None:
        self.sink(df, batch_id + self.base)
