"""A deterministic two-cluster simulator for cursorsync: histories, failovers, per-message truth.

Pure Python and numpy. ``run_failover(Workload(...))`` simulates source cluster
A and target cluster B (managed ledgers rolling over, batched producers,
replication with lag and backlog bursts, PIP-33 markers on both topics,
foreign entries on B, consumers on A acking out of order with holes and
partial batches), then fails consumers over to B under cursorsync and under
Pulsar's built-in replicated subscriptions, and counts duplicates and losses
per message. ``simulate`` exposes the raw per-partition history
(:class:`PartitionState`) for property tests.
"""

from cursorsync_devtools.sim._failover import (
    BuiltinStats,
    FailoverReport,
    Simulation,
    StrategyCounts,
    SyncStats,
    count_failover,
    failover_report,
    run_cursorsync,
    run_failover,
    simulate,
)
from cursorsync_devtools.sim._partition import BuiltinTrace, PartitionState
from cursorsync_devtools.sim._production import SourceMessages
from cursorsync_devtools.sim._topics import (
    KIND_DATA,
    KIND_FOREIGN,
    KIND_MARKER,
    REASONS,
    SNAPSHOT,
    SNAPSHOT_REQUEST,
    SNAPSHOT_RESPONSE,
    UPDATE,
    TopicLog,
)
from cursorsync_devtools.sim._workload import Workload

__all__ = [
    "KIND_DATA",
    "KIND_FOREIGN",
    "KIND_MARKER",
    "REASONS",
    "SNAPSHOT",
    "SNAPSHOT_REQUEST",
    "SNAPSHOT_RESPONSE",
    "UPDATE",
    "BuiltinStats",
    "BuiltinTrace",
    "FailoverReport",
    "PartitionState",
    "Simulation",
    "SourceMessages",
    "StrategyCounts",
    "SyncStats",
    "TopicLog",
    "Workload",
    "count_failover",
    "failover_report",
    "run_cursorsync",
    "run_failover",
    "simulate",
]
