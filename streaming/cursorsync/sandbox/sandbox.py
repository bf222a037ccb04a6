"""The sandbox: two embedded clusters A and B, replication A -> B, admin APIs.

Usage::

    with Sandbox(SandboxConfig(topics={"orders": 3, "audit": 0})) as sb:
        sb.service_url("A"), sb.admin_url("B")
        c = sb.subscribe("A", "orders-partition-0", "sub", initial_position=Earliest)
        ...
        sb.replicator.wait_caught_up()

Topics are named by their local name in ``public/default`` (or a full
``persistent://`` name); a topic with N > 0 partitions exists as
``<topic>-partition-<i>`` on both brokers and the admin APIs report N.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cursorsync.errors import ConfigError
from cursorsync.pulsar.client import connect
from cursorsync.sandbox.admin_server import AdminServer
from cursorsync.sandbox.brokers import Brokers
from cursorsync.sandbox.consumers import RecordingConsumer, subscribe_recording
from cursorsync.sandbox.proxy import AckSniffingProxy
from cursorsync.sandbox.replicator import Replicator, ReplicatorOptions
from cursorsync.sandbox.state import AckEvent, ClusterState, full_topic, partition_topic


@dataclass(frozen=True)
class SandboxConfig:
    """What the sandbox starts. ``topics`` maps name -> partitions (0: not partitioned)."""

    topics: dict[str, int] = field(default_factory=dict)
    work_dir: Path | None = None
    admin_token: str | None = None
    replicator: ReplicatorOptions = field(default_factory=ReplicatorOptions)
    start_replicator: bool = True
    #: Topics written on B before anything else, so B's ledger ids differ from A's
    #: (pulsar-lite numbers ledgers per broker from 0 in topic-creation order): they
    #: cannot collide while A has fewer topics than this.
    target_ledger_offset: int = 20
    #: Put a proxy in front of B's broker that records every ack clients send to it,
    #: so B's admin API reports cursors of any client (see cursorsync.sandbox.proxy).
    sniff_target_acks: bool = True
    log_level: str = "warn"

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.topics.items() if not isinstance(v, int) or v < 0}
        if bad:
            raise ConfigError(f"topics: partition counts must be ints >= 0, got {bad}")


class Sandbox:
    """Clusters A (source) and B (target) with replication and admin APIs; a context manager."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if self.config.work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cursorsync-sandbox-")
            self.work_dir = Path(self._tmp.name)
        else:
            self.work_dir = Path(self.config.work_dir)
        opts = self.config.replicator
        self.source, self.target = opts.source_cluster, opts.target_cluster
        self.brokers = Brokers(
            self.work_dir, (self.source, self.target), log_level=self.config.log_level
        )
        self._clients: list[Any] = []
        self._direct: dict[str, Any] = {}
        self._states: dict[str, ClusterState] = {}
        self._admins: dict[str, AdminServer] = {}
        self._proxy: AckSniffingProxy | None = None
        self.replicator: Replicator | None = None
        self._started = False

    # -- lifecycle
    def start(self) -> Sandbox:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.brokers.start()
        if self.config.sniff_target_acks:
            self._proxy = AckSniffingProxy(self.brokers[self.target].port, self._record_sniffed)
            self._proxy.start()
        for cluster in (self.source, self.target):
            state = ClusterState(cluster, self.client(cluster))
            self._states[cluster] = state
            self._admins[cluster] = AdminServer(state, token=self.config.admin_token).start()
        self._offset_target_ledgers()
        partitions: list[str] = []
        for name, n in self.config.topics.items():
            for cluster in (self.source, self.target):
                parts = self._states[cluster].register_topic(name, n)
            partitions.extend(parts)
        self.replicator = Replicator(
            self.client(self.source),
            self.client(self.target),
            partitions,
            self.config.replicator,
            source_state=self._states[self.source],
            target_state=self._states[self.target],
        )
        if self.config.start_replicator:
            self.replicator.start()
        self._started = True

    def _offset_target_ledgers(self) -> None:
        client = self.client(self.target)
        for i in range(self.config.target_ledger_offset):
            p = client.create_producer(f"persistent://public/default/__sandbox-ledger-offset-{i}")
            p.send(b"offset")
            p.close()

    def stop(self) -> None:
        """Stop replicator, admin servers, clients, proxy and brokers (safe to call twice)."""
        if self.replicator is not None:
            self.replicator.stop()
        for admin in self._admins.values():
            admin.stop()
        self._admins.clear()
        for state in self._states.values():
            state.close()
        for client in self._clients:
            client.close()
        self._clients.clear()
        self._direct.clear()
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None
        self.brokers.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._started = False

    def __enter__(self) -> Sandbox:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and clients
    def _check_cluster(self, cluster: str) -> None:
        if cluster not in (self.source, self.target):
            raise ConfigError(
                f"unknown cluster {cluster!r}; the sandbox has {self.source!r} and {self.target!r}"
            )

    def service_url(self, cluster: str) -> str:
        """The pulsar:// URL clients use (for B, the ack-recording proxy when enabled)."""
        self._check_cluster(cluster)
        if cluster == self.target and self._proxy is not None:
            return self._proxy.service_url
        return self.brokers[cluster].service_url

    def broker_url(self, cluster: str) -> str:
        """The broker's own URL, bypassing any proxy (acks sent here are not recorded)."""
        self._check_cluster(cluster)
        return self.brokers[cluster].service_url

    def admin_url(self, cluster: str) -> str:
        """Base URL of the cluster's admin API (routes under /admin/v2/persistent/...)."""
        self._check_cluster(cluster)
        return self._admins[cluster].url

    def admin_server(self, cluster: str) -> AdminServer:
        self._check_cluster(cluster)
        return self._admins[cluster]

    def client(self, cluster: str, **kwargs: Any) -> Any:
        """A new ``pulsar.Client`` for the cluster, closed by ``stop()``."""
        self._check_cluster(cluster)
        kwargs.setdefault("operation_timeout_seconds", 15)
        client = connect(self.service_url(cluster), **kwargs)
        self._clients.append(client)
        return client

    def state(self, cluster: str) -> ClusterState:
        self._check_cluster(cluster)
        return self._states[cluster]

    # -- topics, consumers, acks
    def topic(self, name: str) -> str:
        return full_topic(name)

    def partitions(self, name: str) -> list[str]:
        """The topics to produce to / consume from: the partitions, or the topic itself."""
        n = self.config.topics.get(name, self._states[self.source].partitions_of(name))
        return [partition_topic(name, i) for i in range(n)] if n else [full_topic(name)]

    def register_topic(self, cluster: str, name: str, partitions: int = 0) -> list[str]:
        """Make a topic (not replicated) known to a cluster's admin API."""
        self._check_cluster(cluster)
        return self._states[cluster].register_topic(name, partitions)

    def subscribe(
        self, cluster: str, topic: str, subscription: str, *, client: Any = None, **kwargs: Any
    ) -> RecordingConsumer:
        """A consumer whose receives and acks feed the cluster's admin stats."""
        self._check_cluster(cluster)
        if client is None:
            # Through the proxy the ack would be recorded twice; go to the broker directly.
            client = self._direct_client(cluster)
        return subscribe_recording(client, self._states[cluster], topic, subscription, **kwargs)

    def _direct_client(self, cluster: str) -> Any:
        if cluster not in self._direct:
            self._direct[cluster] = connect(self.broker_url(cluster), operation_timeout_seconds=15)
            self._clients.append(self._direct[cluster])
        return self._direct[cluster]

    def record_ack(
        self,
        cluster: str,
        topic: str,
        subscription: str,
        message_id_or_position: Any,
        cumulative: bool = False,
    ) -> AckEvent:
        """Report an ack sent outside the recording consumers and the proxy."""
        self._check_cluster(cluster)
        return self._states[cluster].record_ack(
            topic, subscription, message_id_or_position, cumulative=cumulative
        )

    def _record_sniffed(
        self, topic: str, subscription: str, ledger: int, entry: int, batch_index: int,
        cumulative: bool,
    ) -> None:
        from cursorsync.positions import MessageId

        self._states[self.target].record_ack(
            topic,
            subscription,
            MessageId(ledger, entry, -1, batch_index),
            cumulative=cumulative,
            source="proxy",
        )
