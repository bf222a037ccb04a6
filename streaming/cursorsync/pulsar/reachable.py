"""Whether any broker of a service URL accepts connections: tells an unreachable
cluster from a subscription that timed out on brokers that are up."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651}


def hosts(service_url: str) -> list[tuple[str, int]]:
    """(host, port) of each broker in a service URL such as ``pulsar://h1:6650,h2:6650``."""
    parts = urlsplit(service_url)
    default = _DEFAULT_PORTS.get(parts.scheme, 6650)
    out = []
    for hostport in parts.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            host, port = hostport, str(default)
        out.append((host.strip("[]"), int(port)))
    return out


def reachable(service_url: str, timeout_s: float = 1.0) -> bool:
    for host, port in hosts(service_url):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return True
        except OSError:
            continue
    return False


__all__ = ["hosts", "reachable"]
