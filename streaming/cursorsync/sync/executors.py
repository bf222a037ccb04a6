"""Emission spread across executors, for many topic partitions.

The sync batch (one row per observed cursor) is repartitioned by topic
partition; each Spark task translates, guards and emits for its partitions
with its own admin client and emitter, reading each partition's mapping and
previous cursor state from the Delta tables (with delta-rs), and returns ``sync_progress``
rows. The driver only writes the tables. Every task runs the same
:class:`cursorsync.sync.step.SyncStep`, so the safety guard is the same code.

A re-run task (Spark retries) re-sends acks that the target does not show
yet; acks are idempotent on the broker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cursorsync.core.records import PartitionKey, RewindPolicy
from cursorsync.core.segments import TopicMapping
from cursorsync.core.topology import Topology
from cursorsync.pulsar.connections import Connections
from cursorsync.pulsar.subscriptions import SubscriptionType
from cursorsync.sync.halts import read_halts
from cursorsync.sync.marker_lookups import MarkerCache
from cursorsync.sync.observed import observations, previous_states
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.sync.target_reads import AdminTargets
from cursorsync.tables import TableStore, open_reader
from cursorsync.tables.mappings_table import load_mappings
from cursorsync.tables.rows import row_schema, sync_progress_rows


@dataclass(frozen=True)
class ExecutorSettings:
    """What a Spark task needs to sync its partitions: plain values, so that they pickle
    into the task, which opens its own clients and tables from them."""

    source: Connections
    target: Connections
    tables_path: str
    storage_options: Mapping[str, str] | None
    rewind_policy: RewindPolicy
    #: Snapshot evidence on (:attr:`cursorsync.sync.step.StepSettings.vouch`).
    vouch: bool
    subscription_type: SubscriptionType
    ack_batch_size: int

    @property
    def clusters(self) -> dict[str, str]:
        return {"source_cluster": self.source.name, "target_cluster": self.target.name}


def _mappings(store: TableStore, keys: set[PartitionKey],
              settings: ExecutorSettings) -> dict[PartitionKey, TopicMapping]:
    found, _ = load_mappings(store, source_cluster=settings.source.name,
                             target_cluster=settings.target.name, topics={k.topic for k in keys})
    return {k: m for k, m in found.items() if k in keys}


#: Per source admin URL, the sync steps' source-marker caches (see SyncStep) in this worker.
_MARKERS: dict[str, MarkerCache] = {}


def worker_marker_cache(source_admin_url: str) -> MarkerCache:
    """This worker's marker cache for a source. The task function is a closure, which
    cloudpickle ships by value with a copy of the module globals it names: a global named
    there directly would be a new, empty dict every task. A module-level function goes by
    reference, so the cache it returns is this process's."""
    return _MARKERS.setdefault(source_admin_url, MarkerCache())


def sync_partitions(settings: ExecutorSettings, batch_id: int, *, dry_run: bool,
                    cumulative: bool,
                    topologies: Mapping[str, Topology | None] | None = None) -> Any:
    """The function each task runs over its share of the batch (for ``mapInArrow``);
    ``topologies``: the batch's topics' replication topologies, as the driver read them
    (see :class:`cursorsync.sync.step.SyncStep`)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [pa.Table.from_batches([b]) for b in batches]
        obs = observations(pa.concat_tables(parts)) if parts else []
        if not obs:
            return
        # Tasks only read the tables (the driver writes them), with delta-rs whichever
        # backend writes: an executor has no SparkSession for delta-spark.
        store = open_reader(settings.tables_path,
                            storage_options=dict(settings.storage_options or {}) or None)
        admin = settings.target.admin_client()
        source_admin = settings.source.admin_client()
        emitter = None if dry_run else settings.target.emitter(
            subscription_type=settings.subscription_type,
            ack_batch_size=settings.ack_batch_size)
        targets = AdminTargets(admin)
        try:
            step = SyncStep(StepSettings(cumulative, dry_run, settings.rewind_policy,
                                       vouch=settings.vouch),
                            emitter, targets, settings.source.marker_lookup(source_admin),
                            source_admin.creation, read_targets=targets.many,
                            topology=None if topologies is None else topologies.get)
            step.halted_keys = read_halts(store, **settings.clusters)
            step.previous = previous_states(store, obs, batch_id, **settings.clusters)
            # Source entries found to be markers stay known for the worker's life: a task
            # does not look the same entries up again every batch.
            step.lookups.cache = worker_marker_cache(settings.source.admin.urls[0])
            result = step.run(obs, _mappings(store, {o.key for o in obs}, settings))
            rows = sync_progress_rows(result.records, **settings.clusters)
        finally:
            if emitter is not None:
                emitter.close()
            admin.close()
            source_admin.close()
        yield from rows.to_batches()

    return run


def sync_on_executors(df: Any, settings: ExecutorSettings, batch_id: int, *, dry_run: bool,
                      cumulative: bool,
                      topologies: Mapping[str, Topology | None] | None = None) -> pa.Table:
    """Run the sync step in Spark tasks, one group of topic partitions per task."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = row_schema("sync_progress")
    n = max(1, int(df.sparkSession.sparkContext.defaultParallelism))
    fn = sync_partitions(settings, batch_id, dry_run=dry_run, cumulative=cumulative,
                         topologies=topologies)
    out = df.repartition(n, "topic", "partition").mapInArrow(fn, from_arrow_schema(schema))
    table = out.toArrow()
    return table.cast(schema) if table.num_rows else schema.empty_table()
