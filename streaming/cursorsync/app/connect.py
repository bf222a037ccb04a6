"""From a cluster's configuration to how the job reaches it: the one place that does so.

Pulsar clients, admin clients, the emitter and the data sources' Spark options all come
from the :class:`~cursorsync.pulsar.connections.Connections` built here, so a credential
or TLS setting reaches every connection or none.
"""

from __future__ import annotations

from cursorsync.app.settings import ClusterConfig, TlsConfig
from cursorsync.pulsar.admin import AdminSettings
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.connections import Connections


def client_settings(cluster: ClusterConfig) -> ClientSettings:
    """How to open a pulsar-client for ``cluster`` (token, TLS trust and client certificate)."""
    tls = _tls(cluster)
    return ClientSettings(
        service_url=cluster.service_url,
        token=cluster.auth.resolve_token(),
        tls_ca_file=tls.ca_file if tls else None,
        tls_cert_file=tls.cert_file if tls else None,
        tls_key_file=tls.key_file if tls else None,
        tls_allow_insecure=bool(tls and tls.allow_insecure),
        operation_timeout_s=max(1, round(cluster.request_timeout_s)),
    )


def admin_config(cluster: ClusterConfig) -> AdminSettings:
    """How to reach ``cluster``'s admin API (token, TLS, timeout, concurrency)."""
    tls = _tls(cluster)
    return AdminSettings.from_urls(
        cluster.admin_url, cluster=cluster.name, token=cluster.auth.resolve_token(),
        tls_ca_file=tls.ca_file if tls else None,
        tls_cert_file=tls.cert_file if tls else None,
        tls_key_file=tls.key_file if tls else None,
        tls_allow_insecure=bool(tls and tls.allow_insecure),
        timeout_s=cluster.request_timeout_s, max_workers=cluster.max_concurrency)


def _tls(cluster: ClusterConfig) -> TlsConfig | None:
    """The cluster's TLS settings, their files checked: a missing one is named here."""
    tls = cluster.auth.tls
    if tls is not None:
        tls.check_files(cluster.name)
    return tls


def connections(cluster: ClusterConfig) -> Connections:
    """Everything that says how to reach ``cluster``."""
    return Connections(cluster.name, admin_config(cluster), client_settings(cluster))


__all__ = ["admin_config", "client_settings", "connections"]
