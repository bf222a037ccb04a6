"""The one way mappings are loaded from the ``mappings`` table, and merged in it.

Every reader (the mapping builder's seed, the sync on the driver and on
executors, ``status``, ``lookup``) loads through :func:`load_mappings`, so
each sees the same union of rows per topic partition, and a conflict between
rows is the same error everywhere.

Each mapping batch appends its own rows, so a run that many batches continue is
many rows. :func:`merge_rows` (table maintenance) replaces the rows written before
a moment by their union, one commit: the table then holds a handful of rows per
ledger. Readers see the same mappings before and after. A partition's ``live`` row
(the first ledgers each side still has, written when the sync finds rows about deleted
ledgers) makes every reader drop those rows' part of the union, and the merge drop the
rows: the table keeps the live ledgers' rows, not every ledger's since the start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.packed import ArrayKeeper, PackedMappings
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import TopicMapping
from cursorsync.errors import MappingConflictError
from cursorsync.tables.rows import latest_waits, mapping_rows, topic_mappings
from cursorsync.tables.schema import load_schema
from cursorsync.tables.store import RowFilter, TableStore, prepare_rows

log = logging.getLogger(__name__)

_GROUP = ["source_cluster", "target_cluster", "topic", "partition"]


def load_mappings(store: TableStore, *, source_cluster: str | None, target_cluster: str | None,
                  topics: Iterable[str] | None = None, partition: int | None = None,
                  min_batch_id: int | None = None, max_batch_id: int | None = None,
                  ) -> tuple[dict[PartitionKey, TopicMapping], int | None]:
    """The mappings of a cluster pair (optionally of some topics, between two batch ids),
    and the highest batch id read (None when no row was read).

    Raises :class:`~cursorsync.errors.MappingConflictError` when two rows claim one
    entry differently.
    """
    if not store.exists("mappings"):
        return {}, None
    wanted = sorted(set(topics)) if topics is not None else None
    if wanted == []:
        return {}, None
    rows = store.read("mappings", RowFilter.of(
        topic=wanted, partition=partition, source_cluster=source_cluster,
        target_cluster=target_cluster, min_batch_id=min_batch_id, max_batch_id=max_batch_id))
    if rows.num_rows == 0:
        return {}, None
    return topic_mappings(rows), int(pc.max(rows.column("batch_id")).as_py())


def merge_rows(store: TableStore, *, before: datetime) -> int:
    """Replace the ``mappings`` rows written before ``before`` by their union per topic
    partition and cluster pair, in one commit; returns how many rows fewer the table holds.

    Each merged row keeps the newest ``written_at`` and the highest ``batch_id`` of the rows
    it replaces: an incremental reader that has read up to a batch id then reads a merged
    row again only if it holds rows it has not read (the union is idempotent), and
    retention-free readers see the same union. Rows that conflict are left as they are
    (the conflict is every reader's error already).
    """
    if not store.exists("mappings"):
        return 0
    rows = store.read("mappings")
    when = rows.column("written_at")
    old = rows.filter(pc.less(when, pa.scalar(before, when.type)))
    if old.num_rows < 2:
        return 0
    latest = old.group_by(_GROUP).aggregate([("batch_id", "max"), ("written_at", "max")])
    # The union drops what the live rows say is dead; one live row per partition stays.
    lives = old.filter(pc.equal(old.column("kind"), "live")).group_by(_GROUP).aggregate(
        [("source_ledger", "max"), ("target_ledger", "max")]).to_pylist()
    live = {(r["source_cluster"], r["target_cluster"], r["topic"], r["partition"]):
            (r["source_ledger_max"], r["target_ledger_max"]) for r in lives}
    schema = load_schema("mappings")
    pairs = old.select(["source_cluster", "target_cluster"]).group_by(
        ["source_cluster", "target_cluster"]).aggregate([]).to_pylist()
    merged: list[pa.Table] = []
    for pair in pairs:
        part = _merged_pair(old, pair["source_cluster"], pair["target_cluster"], latest, live)
        if part is None:
            return 0
        merged.extend(part)
    out = pa.concat_tables(merged) if merged else schema.arrow().empty_table()
    if out.num_rows >= old.num_rows:
        return 0
    store.replace_before("mappings", "written_at", before, out)
    return int(old.num_rows - out.num_rows)


def _merged_pair(old: pa.Table, source: str, target: str, latest: pa.Table,
                 live: dict[tuple[str, str, str, int], tuple[int | None, int | None]],
                 ) -> list[pa.Table] | None:
    """The union of one cluster pair's rows, per topic partition; None when they conflict
    (logged: nothing is merged then)."""
    part = old.filter(pc.and_(pc.equal(old.column("source_cluster"), source),
                              pc.equal(old.column("target_cluster"), target)))
    try:
        union = topic_mappings(part)
    except MappingConflictError as err:
        log.error("mappings of %s -> %s are not merged: %s", source, target, err)
        return None
    last = {(r["topic"], r["partition"]): r for r in latest.to_pylist()
            if r["source_cluster"] == source and r["target_cluster"] == target}
    schema = load_schema("mappings")
    out = []
    for key, mapping in union.items():
        r = last[(key.topic, key.partition)]
        out.append(prepare_rows(schema, mapping_rows(
            key, mapping, source_cluster=source, target_cluster=target,
            written_at=r["written_at_max"],
            live=live.get((source, target, key.topic, key.partition))),
            int(r["batch_id_max"])))
    return out


@dataclass
class MappingStore:
    """The ``mappings`` table, loaded incrementally by batch id: each refresh reads only the
    batches written since the last one and unions them in."""

    store: TableStore
    source_cluster: str
    target_cluster: str
    loaded_upto: int = -1
    #: Where the settled mappings are kept (None: on the heap).
    spill: ArrayKeeper | None = None
    mappings: PackedMappings = field(init=False)

    def __post_init__(self) -> None:
        self.mappings = PackedMappings(self.spill)

    def refresh(self) -> PackedMappings:
        """Every mapping known so far, with the batches written since the last refresh; a
        new batch for :meth:`PackedMappings.next_batch`."""
        delta, top = load_mappings(self.store, source_cluster=self.source_cluster,
                                   target_cluster=self.target_cluster,
                                   min_batch_id=self.loaded_upto + 1)
        self.mappings.next_batch()
        for key, part in delta.items():
            self.mappings.merge(key, part)
        if top is not None:
            self.loaded_upto = top
        self.mappings.settle()
        return self.mappings


@dataclass
class WaitsStore:
    """The ``mapping_waits`` table, loaded incrementally by batch id: per topic partition,
    the skipped target ids its mapping has not classified yet, as the mapping last wrote
    (a partition whose count went back to 0 has a row saying so)."""

    store: TableStore
    source_cluster: str
    target_cluster: str
    loaded_upto: int = -1
    waiting: dict[PartitionKey, int] = field(default_factory=dict)

    def refresh(self) -> dict[PartitionKey, int]:
        """The partitions with skipped ids waiting, with the rows written since the last
        refresh read in."""
        if not self.store.exists("mapping_waits"):
            return self.waiting
        rows = self.store.read("mapping_waits", RowFilter.of(
            source_cluster=self.source_cluster, target_cluster=self.target_cluster,
            min_batch_id=self.loaded_upto + 1))
        if rows.num_rows:
            for key, n in latest_waits(rows).items():
                if n:
                    self.waiting[key] = n
                else:
                    self.waiting.pop(key, None)
            self.loaded_upto = int(pc.max(rows.column("batch_id")).as_py())
        return self.waiting
