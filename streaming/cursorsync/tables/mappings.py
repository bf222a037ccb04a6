"""The one way mappings are loaded from the ``mappings`` table.

Every reader (the mapping builder's seed, the sync on the driver and on
executors, ``status``, ``lookup``) loads through :func:`load_mappings`, so
each sees the same union of rows per topic partition, and a conflict between
rows is the same error everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow.compute as pc

from cursorsync.core.mapping import TopicMapping
from cursorsync.core.records import PartitionKey
from cursorsync.tables.rows import topic_mappings
from cursorsync.tables.store import RowFilter, TableStore


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


@dataclass
class MappingStore:
    """The ``mappings`` table, loaded incrementally by batch id: each refresh reads only the
    batches written since the last one and unions them in."""

    store: TableStore
    source_cluster: str
    target_cluster: str
    loaded_upto: int = -1
    mappings: dict[PartitionKey, TopicMapping] = field(default_factory=dict)

    def refresh(self) -> dict[PartitionKey, TopicMapping]:
        """Every mapping known so far, with the batches written since the last refresh."""
        delta, top = load_mappings(self.store, source_cluster=self.source_cluster,
                                   target_cluster=self.target_cluster,
                                   min_batch_id=self.loaded_upto + 1)
        for key, part in delta.items():
            self.mappings[key] = self.mappings.get(key, TopicMapping()).union(part)
        if top is not None:
            self.loaded_upto = top
        return self.mappings
