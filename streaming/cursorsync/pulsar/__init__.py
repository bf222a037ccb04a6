"""The Pulsar edges: topic names, admin REST client and the parsing of its JSON."""

from cursorsync.pulsar.admin import AdminAuthError, AdminClient, AdminSettings
from cursorsync.pulsar.stats import (
    REPLICATOR_CURSOR_PREFIX,
    CursorStats,
    PartitionedInternalStats,
    TopicInternalStats,
    parse_internal_stats,
    parse_partitioned_internal_stats,
    parse_partitions,
    parse_topic_list,
)
from cursorsync.pulsar.topics import TopicName

__all__ = [
    "REPLICATOR_CURSOR_PREFIX",
    "AdminAuthError",
    "AdminClient",
    "AdminSettings",
    "CursorStats",
    "PartitionedInternalStats",
    "TopicInternalStats",
    "TopicName",
    "parse_internal_stats",
    "parse_partitioned_internal_stats",
    "parse_partitions",
    "parse_topic_list",
]
