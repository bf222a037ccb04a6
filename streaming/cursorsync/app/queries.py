"""The job's two queries, built from the configuration: each sink gets the narrow settings
and clients it needs, never the whole configuration, and they share the one piece of
state they share (:class:`~cursorsync.core.retention.LiveLedgers`) as an argument."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from cursorsync.app.checkpoint_match import Rebased
from cursorsync.app.connect import connections
from cursorsync.app.maintenance import TableMaintenance
from cursorsync.app.metrics import Metrics
from cursorsync.app.settings import Config
from cursorsync.app.streams import cursors_stream, entries_stream, selection
from cursorsync.core.retention import LiveLedgers
from cursorsync.mapping.builder import BuilderSettings
from cursorsync.mapping.sink import MAPPING_APP, MappingSink
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.connections import Connections
from cursorsync.pulsar.cursor_digests import cluster_digests
from cursorsync.pulsar.dispatchable import DispatchableTail, PluginTail
from cursorsync.pulsar.replication import TopologyWatch
from cursorsync.sync.batch_moves import BatchMoves
from cursorsync.sync.batch_reads import BatchReads
from cursorsync.sync.executors import ExecutorSettings
from cursorsync.sync.follow import SYNC_WAKE, FollowMapping
from cursorsync.sync.poll_health import POLLS_DIR
from cursorsync.sync.sink import SYNC_APP, SyncSink, SyncSinkSettings
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.sync.target_reads import AdminTargets
from cursorsync.tables.store import TableStore

#: The sync query's trigger ticks this many times per trigger interval (see start_queries).
SYNC_TICKS_PER_INTERVAL = 4


@dataclass
class Clients:
    """The driver's connections to both clusters, opened once per start."""

    source: Connections
    target: Connections
    source_admin: AdminClient
    target_admin: AdminClient
    #: The target's ack emitter on the driver (None: a dry run, or emission on executors).
    emitter: Any
    #: Whether anything past a source partition's last mapped entry is dispatchable: from
    #: the source brokers' plugin with ``spark.cursor_digests``, else a reader each.
    source_tail: DispatchableTail | PluginTail

    @classmethod
    def open(cls, config: Config, *, dry_run: bool, emitter: Any = None) -> Clients:
        source, target = connections(config.source), connections(config.target)
        if emitter is None and not dry_run and not config.emission.spread_across_executors:
            emitter = target.emitter(subscription_type=config.emission.subscription_type,
                                     ack_batch_size=config.emission.ack_batch_size,
                                     batch_index_acks=config.emission.batch_index_acks)
        source_admin = source.admin_client()
        readers = source.dispatchable_tail()
        tail = PluginTail(source_admin, readers) if config.spark.cursor_digests else readers
        return cls(source, target, source_admin, target.admin_client(), emitter, tail)


def builder_config(config: Config) -> BuilderSettings:
    """What the mapping builder is made with."""
    return BuilderSettings(config.source.name, config.target.name,
                         tuple(config.evidence.strategies), config.evidence.alignment_window,
                         claim_holes=config.evidence.claims_holes)


def executor_settings(config: Config) -> ExecutorSettings:
    """What emission on executors takes into its Spark tasks."""
    return ExecutorSettings(
        connections(config.source), connections(config.target), config.tables.path,
        config.tables.storage_options or None, config.emission.rewind_policy,
        vouch="snapshot" in config.evidence.strategies,
        subscription_type=config.emission.subscription_type,
        ack_batch_size=config.emission.ack_batch_size)


def sync_sink_settings(config: Config) -> SyncSinkSettings:
    return SyncSinkSettings(
        config.source.name, config.target.name, config.tables.unchanged_rows_every_batches,
        executor_settings(config) if config.emission.spread_across_executors else None)


def mapping_sink(config: Config, store: TableStore, metrics: Metrics, clients: Clients,
                 topology: TopologyWatch, live: LiveLedgers) -> MappingSink:
    """The mapping query's sink, with the checks its evidence needs."""
    hole_check: Any = None
    source_chunks = None
    if config.evidence.holes in ("verified", "probe"):
        from cursorsync.mapping.hole_check import AdminHoleCheck

        stamps = "position-property" in config.evidence.strategies
        hole_check = AdminHoleCheck(clients.target_admin,
                                    max_workers=config.target.max_concurrency,
                                    target_cluster=config.target.name,
                                    source_cluster=config.source.name if stamps else None,
                                    plugin=config.spark.cursor_digests)
        if stamps:  # the source's copies of the target's chunks name their originals
            source_chunks = AdminHoleCheck(clients.source_admin,
                                           max_workers=config.source.max_concurrency,
                                           source_cluster=config.target.name)
    if config.evidence.holes == "probe":
        from cursorsync.mapping.probe_check import ProbeHoleCheck
        from cursorsync.pulsar.dispatch_probe import PROBE_SUBSCRIPTION, DispatchProbe

        probe = DispatchProbe(clients.target.client.connect(), clients.target_admin,
                              PROBE_SUBSCRIPTION, plugin=config.spark.cursor_digests)
        hole_check = ProbeHoleCheck(probe, hole_check)
    anchor_read = None
    if "snapshot" in config.evidence.strategies:
        from cursorsync.mapping.anchor_read import AdminAnchorRead

        anchor_read = AdminAnchorRead(clients.source_admin, config.target.name,
                                      max_workers=config.source.max_concurrency)
    ckpt = Path(config.spark.checkpoint_dir)
    sink = MappingSink(builder_config(config), store, ckpt / "builder-state", metrics,
                       hole_check, anchor_read,
                       None if hole_check is None else hole_check.drain_updates,
                       wake_file=str(ckpt / "mapping-wake"), topology=topology, live=live,
                       source_chunks=source_chunks)
    sink.after_batch = TableMaintenance(store, ("mappings", "builtin_updates", "mapping_waits"),
                                        config.tables,
                                        metrics).run_if_due
    return sink


def sync_sink(config: Config, store: TableStore, metrics: Metrics, clients: Clients,
              topology: TopologyWatch, live: LiveLedgers, *, dry_run: bool) -> SyncSink:
    """The sync query's sink and its step. The step reads each moving partition's ledger
    lists: the builder trims its known mappings with them too (``live``; with emission on
    executors this step plans nothing, and the builder keeps them whole)."""
    targets = AdminTargets(clients.target_admin, plugin=config.spark.cursor_digests)
    lookup = clients.source.marker_lookup(clients.source_admin,
                                          plugin=config.spark.cursor_digests)
    step = SyncStep(StepSettings(config.emission.cumulative, dry_run,
                               config.emission.rewind_policy,
                               vouch="snapshot" in config.evidence.strategies,
                               first_plans_per_batch=config.emission.first_plans_per_batch),
                    clients.emitter, targets, lookup,
                    clients.source_admin.creation, read_targets=targets.many,
                    topology=topology.current, live_ledgers=live,
                    batch_reads=(BatchReads(clients.source_admin, clients.target_admin)
                                 if config.emission.batch_index_acks else None),
                    batch_moves=(BatchMoves(partial(
                        cluster_digests, clients.source_admin,
                        selection(config).namespace_names()))
                        if config.emission.batch_index_acks else None),
                    tail_check=clients.source_tail.nothing_dispatchable_after,
                    lookups_in_background=True)
    sink = SyncSink(sync_sink_settings(config), store, step, metrics)
    sink.target_reads = targets
    sink.source_tail = clients.source_tail
    sink.source_lookups = lookup
    sink.after_batch = TableMaintenance(store, ("cursor_states", "sync_progress"),
                                        config.tables, metrics).run_if_due
    return sink


#: The local property naming a query's scheduler pool, inherited by its jobs; each query's
#: pool and name is its sink's app id.
SCHEDULER_POOL = "spark.scheduler.pool"


@contextmanager
def scheduler_pool(spark: Any, pool: str) -> Iterator[None]:
    """Queries started inside run their jobs in scheduler pool ``pool`` (with
    spark.scheduler.mode FAIR, the pools share the task slots: a sync batch's one task takes
    the next free slot instead of waiting behind every task of a mapping batch submitted
    before it, as FIFO would have it)."""
    context = spark.sparkContext
    context.setLocalProperty(SCHEDULER_POOL, pool)  # a started query's thread inherits it
    try:
        yield
    finally:
        context.setLocalProperty(SCHEDULER_POOL, None)


def start_queries(spark: Any, config: Config, mapping: MappingSink, sync: SyncSink,
                  bases: dict[str, int]) -> list[Any]:
    """Start the mapping and the sync queries on their checkpoints (batch ids bound to the
    tables' by ``bases``); returns them in that order."""
    ckpt = Path(config.spark.checkpoint_dir)
    trigger = f"{config.spark.trigger_interval_s} seconds"
    # The cursors source polls every trigger interval; the query ticks more often so that
    # a poll the mapping asks for (FollowMapping) comes soon after it asks.
    tick = f"{config.spark.trigger_interval_s / SYNC_TICKS_PER_INTERVAL} seconds"
    wake_file = str(ckpt / SYNC_WAKE)
    follow = FollowMapping(wake_file, lambda: sync.waits_on_mapping)
    maintain = mapping.after_batch

    def after_mapping_batch() -> None:
        if maintain is not None:
            maintain()
        follow.mapping_committed()

    mapping.after_batch = after_mapping_batch
    mapping_trigger = (f"{config.spark.mapping_trigger_interval_s} seconds"
                       if config.spark.mapping_trigger_interval_s else trigger)
    entries = entries_stream(spark, config, "target", wake_file=mapping.wake_file)
    if {"identity", "snapshot"} & set(config.evidence.strategies):
        entries = entries.unionByName(entries_stream(spark, config, "source"))
    with scheduler_pool(spark, MAPPING_APP):
        mq = (entries.writeStream.queryName(MAPPING_APP)
              .foreachBatch(Rebased(mapping, bases["mapping"]))
              .option("checkpointLocation", str(ckpt / "mapping"))
              .trigger(processingTime=mapping_trigger)
              .start())
    with scheduler_pool(spark, SYNC_APP):
        cq = (cursors_stream(spark, config, str(ckpt / POLLS_DIR), wake_file).writeStream
              .queryName(SYNC_APP).foreachBatch(Rebased(sync, bases["sync"]))
              .option("checkpointLocation", str(ckpt / "sync")).trigger(processingTime=tick)
              .start())
    return [mq, cq]


__all__ = ["Clients", "builder_config", "executor_settings", "mapping_sink", "scheduler_pool",
           "start_queries", "sync_sink", "sync_sink_settings"]
