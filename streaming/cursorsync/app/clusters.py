"""From a cluster's configuration to the things that talk to it: the one place that does so.

Pulsar clients, admin clients, the emitter and the data sources' Spark
options are all built from :func:`client_settings` and :func:`admin_config`,
so a credential or TLS setting reaches every connection or none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cursorsync.app.settings import ClusterConfig, Config
from cursorsync.pulsar.admin import AdminClient, AdminConfig
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.options import admin_options, client_options

if TYPE_CHECKING:
    from cursorsync.mapping.hole_check import AdminMarkerLookup
    from cursorsync.pulsar.emitter import PulsarEmitter


def client_settings(cluster: ClusterConfig) -> ClientSettings:
    """How to open a pulsar-client for ``cluster`` (token, TLS trust and client certificate)."""
    tls = cluster.auth.tls
    return ClientSettings(
        service_url=cluster.service_url,
        auth_token=cluster.auth.resolve_token(),
        tls_trust_certs_file=tls.ca_file if tls else None,
        tls_cert_file=tls.cert_file if tls else None,
        tls_key_file=tls.key_file if tls else None,
        tls_allow_insecure=bool(tls and tls.allow_insecure),
        operation_timeout_s=max(1, round(cluster.request_timeout_s)),
    )


def admin_config(cluster: ClusterConfig) -> AdminConfig:
    """How to reach ``cluster``'s admin API (token, TLS, timeout, concurrency)."""
    tls = cluster.auth.tls
    return AdminConfig.from_urls(
        cluster.admin_url, cluster=cluster.name, token=cluster.auth.resolve_token(),
        tls_ca_file=tls.ca_file if tls else None,
        tls_cert_file=tls.cert_file if tls else None,
        tls_key_file=tls.key_file if tls else None,
        tls_insecure=bool(tls and tls.allow_insecure),
        timeout_s=cluster.request_timeout_s, max_workers=cluster.max_concurrency)


def admin_client(cluster: ClusterConfig) -> AdminClient:
    """A new admin client for ``cluster`` (the caller closes it)."""
    return AdminClient(admin_config(cluster))


def source_options(cluster: ClusterConfig) -> dict[str, str]:
    """The ``pulsar-entries`` / ``pulsar-cursors`` options that say how to reach ``cluster``."""
    return {"cluster": cluster.name, **client_options(client_settings(cluster)),
            **admin_options(admin_config(cluster))}


def target_emitter(config: Config) -> PulsarEmitter:
    """The ack emitter for the target cluster."""
    from cursorsync.pulsar.emitter import PulsarEmitter

    return PulsarEmitter(client_settings(config.target),
                         subscription_type=config.emission.subscription_type,
                         ack_batch_size=config.emission.ack_batch_size)


def source_marker_lookup(admin: AdminClient, config: Config) -> AdminMarkerLookup:
    """What the sync step asks which unmapped source entries are markers."""
    from cursorsync.mapping.hole_check import AdminMarkerLookup

    return AdminMarkerLookup(admin, max_workers=config.source.max_concurrency)
