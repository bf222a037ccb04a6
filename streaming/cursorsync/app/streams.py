"""The job's two input streams, with their data-source options from the configuration."""

from __future__ import annotations

from typing import Any, Literal

from cursorsync.app.connect import connections
from cursorsync.app.settings import MAPPING_SUBSCRIPTION_PREFIX, Config
from cursorsync.pulsar.selection import NamespaceRule, Selection, TopicRule


def selection(config: Config) -> Selection:
    """Exactly the (topic, subscription) pairs the configuration names."""
    return Selection(
        tuple(TopicRule(t.topic, tuple(t.subscriptions)) for t in config.topics),
        tuple(NamespaceRule(n.namespace, n.regex, tuple(n.subscriptions))
              for n in config.namespaces))


def entries_stream(spark: Any, config: Config, side: Literal["source", "target"],
                   wake_file: str | None = None) -> Any:
    """The ``pulsar-entries`` stream of one side, with the options the builder needs;
    ``wake_file``: where the mapping sink asks for batches (:mod:`cursorsync.wake`)."""
    opts = entries_options(config, side)
    if wake_file is not None:
        opts["wakeFile"] = wake_file
    return spark.readStream.format("pulsar-entries").options(**opts).load()


def entries_options(config: Config, side: Literal["source", "target"]) -> dict[str, str]:
    """The ``pulsar-entries`` options of one side's stream."""
    cluster = config.source if side == "source" else config.target
    opts = {**connections(cluster).source_options(), "selection": selection(config).to_option(),
            "maxRowsPerBatch": str(config.spark.max_entries_per_batch),
            "entriesPerTask": str(config.spark.entries_per_task),
            "rangesPerTask": str(config.spark.ranges_per_task),
            "discoveryIntervalMs": str(round(config.spark.topic_discovery_interval_s * 1000)),
            "identityFields": ",".join(config.evidence.identity_fields),
            # Snapshot evidence compares digests too: a copy's digest is on the source.
            "identity": str(bool({"identity", "snapshot"}
                                 & set(config.evidence.strategies))).lower(),
            "positionEvidence": str("position-property" in config.evidence.strategies).lower(),
            "identityScope": config.evidence.identity_scope,
            # The source side is read for identity evidence only: rows without a digest
            # would be dropped by the builder anyway. Snapshot evidence needs every source
            # row: the ids the reader skips are where the markers are.
            "identityRowsOnly": str(side == "source" and "snapshot"
                                    not in config.evidence.strategies).lower(),
            "rowsPer": "entry",  # the builder works on entries; one row each crosses the JVM
            "columns": "evidence",  # and only the columns it reads
            # and a Spark row per record batch of them: the sink takes the batch to the
            # driver as Arrow at once, so rows would only cost the JVM a conversion each way
            "layout": "arrow",
            "receiverQueueSize": str(cluster.receiver_queue_size),
            "keptReaders": str(cluster.kept_readers),
            "sourcePositionProperty": config.evidence.source_position_property,
            "subscription": f"{MAPPING_SUBSCRIPTION_PREFIX}-{side}",
            # Every partition's last position each trigger: from the plugin, which the
            # cursor digests need on both clusters' brokers.
            "pluginPositions": str(config.spark.cursor_digests).lower(),
            "startingPosition": "earliest"}
    return opts


def cursors_stream(spark: Any, config: Config, state_dir: str,
                   wake_file: str | None = None) -> Any:
    """The ``pulsar-cursors`` stream: the source's synced subscriptions, polled every
    trigger interval, or sooner when asked through ``wake_file`` (:mod:`cursorsync.wake`)."""
    opts = {**connections(config.source).source_options(),
            "selection": selection(config).to_option(),
            "stateDir": state_dir, "internalStatsMaxAgeMs":
            str(round(config.spark.cursor_stats_max_age_s * 1000)),
            "pollIntervalMs": str(round(config.spark.trigger_interval_s * 1000)),
            "cursorDigests": str(config.spark.cursor_digests).lower()}
    if wake_file is not None:
        opts["wakeFile"] = wake_file
    return spark.readStream.format("pulsar-cursors").options(**opts).load()
