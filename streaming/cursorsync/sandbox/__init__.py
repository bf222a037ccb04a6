"""The embedded sandbox: two pulsar-lite clusters, emulated geo-replication, admin APIs.

Start with :class:`Sandbox`; the parts are usable alone (:class:`Brokers`,
:class:`Replicator`, :class:`AdminServer`, :class:`AckSniffingProxy`,
:func:`run_workload`). Needs the ``pulsar-client`` and ``pulsar-lite`` packages.
"""

from cursorsync.sandbox.admin_server import AdminServer, internal_stats
from cursorsync.sandbox.brokers import Broker, Brokers, BrokerStartError, free_port, start_broker
from cursorsync.sandbox.consumers import RecordingConsumer, subscribe_recording
from cursorsync.sandbox.proxy import AckSniffingProxy
from cursorsync.sandbox.replicator import (
    SOURCE_POSITION_PROPERTY,
    ReplicatedEntry,
    ReplicationError,
    Replicator,
    ReplicatorOptions,
)
from cursorsync.sandbox.sandbox import Sandbox, SandboxConfig
from cursorsync.sandbox.state import (
    AckEvent,
    ClusterState,
    CursorView,
    EntryInfo,
    SandboxTopicError,
    fold_cursor,
    full_topic,
    partition_topic,
)
from cursorsync.sandbox.workload import (
    ProducedMessage,
    WorkloadResult,
    WorkloadSpec,
    run_workload,
)

__all__ = [
    "SOURCE_POSITION_PROPERTY",
    "AckEvent",
    "AckSniffingProxy",
    "AdminServer",
    "Broker",
    "BrokerStartError",
    "Brokers",
    "ClusterState",
    "CursorView",
    "EntryInfo",
    "ProducedMessage",
    "RecordingConsumer",
    "ReplicatedEntry",
    "ReplicationError",
    "Replicator",
    "ReplicatorOptions",
    "Sandbox",
    "SandboxConfig",
    "SandboxTopicError",
    "WorkloadResult",
    "WorkloadSpec",
    "fold_cursor",
    "free_port",
    "full_topic",
    "internal_stats",
    "partition_topic",
    "run_workload",
    "start_broker",
    "subscribe_recording",
]
