"""How to reach one cluster, as one picklable value: its name, its admin API and its
brokers. The job builds one per cluster from its configuration; emission on executors
takes them into Spark tasks, which open their own clients from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.options import admin_options, client_options

if TYPE_CHECKING:
    from cursorsync.pulsar.dispatchable import DispatchableTail
    from cursorsync.pulsar.emitter import PulsarEmitter
    from cursorsync.pulsar.marker_lookup import AdminMarkerLookup, PluginMarkerLookup
    from cursorsync.pulsar.subscriptions import SubscriptionType


@dataclass(frozen=True)
class Connections:
    """One cluster's connection settings; every client the job opens comes from one."""

    name: str
    admin: AdminSettings
    client: ClientSettings

    def admin_client(self) -> AdminClient:
        """A new admin client (the caller closes it)."""
        return AdminClient(self.admin)

    def emitter(self, *, subscription_type: SubscriptionType,
                ack_batch_size: int, batch_index_acks: bool = False) -> PulsarEmitter:
        """The ack emitter for this cluster's subscriptions (the caller closes it)."""
        from cursorsync.pulsar.emitter import PulsarEmitter

        return PulsarEmitter(self.client, subscription_type=subscription_type,
                             ack_batch_size=ack_batch_size, batch_index_acks=batch_index_acks)

    def marker_lookup(self, admin: AdminClient, *, plugin: bool = False,
                      ) -> AdminMarkerLookup | PluginMarkerLookup:
        """Which entries are markers, asked of ``admin``: entry by entry on up to the
        configured number of threads, or with ``plugin`` of the brokers' plugin, a request
        per partition (entry by entry while it cannot be asked)."""
        from cursorsync.pulsar.marker_lookup import AdminMarkerLookup, PluginMarkerLookup

        by_entry = AdminMarkerLookup(admin, max_workers=self.admin.max_workers)
        return PluginMarkerLookup(admin, by_entry) if plugin else by_entry

    def dispatchable_tail(self) -> DispatchableTail:
        """Whether a partition holds a dispatchable entry past a position, asked of this
        cluster's brokers (the caller closes it)."""
        from cursorsync.pulsar.dispatchable import DispatchableTail

        return DispatchableTail(self.client)

    def source_options(self) -> dict[str, str]:
        """The ``pulsar-entries`` / ``pulsar-cursors`` options that say how to reach it."""
        return {"cluster": self.name, **client_options(self.client),
                **admin_options(self.admin)}


__all__ = ["Connections"]
