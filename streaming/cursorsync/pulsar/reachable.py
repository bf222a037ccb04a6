"""Whether any broker of a service URL accepts connections: tells an unreachable
cluster from a subscription that timed out on brokers that are up."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def endpoints(service_url: str) -> list[tuple[str, int] | str]:
    """Each host and port a service URL names (``pulsar://h1:6650,h2:6650``; without a
    port, 6650, or 6651 for pulsar+ssl), or why an item is none."""
    scheme, _, hosts = service_url.partition("://")
    default_port = 6651 if scheme == "pulsar+ssl" else 6650
    out: list[tuple[str, int] | str] = []
    for hostport in hosts.rstrip("/").split(","):
        try:
            parts = urlsplit(f"//{hostport.strip()}")
            out.append((parts.hostname or "", parts.port or default_port))
        except ValueError as err:
            out.append(f"{hostport!r} is not host:port ({err})")
    return out


def reachable(service_url: str, timeout_s: float = 1.0) -> bool:
    """Whether any broker ``service_url`` names takes a TCP connection."""
    for endpoint in endpoints(service_url):
        if isinstance(endpoint, str):
            continue
        try:
            with socket.create_connection(endpoint, timeout=timeout_s):
                return True
        except OSError:
            continue
    return False


__all__ = ["endpoints", "reachable"]
