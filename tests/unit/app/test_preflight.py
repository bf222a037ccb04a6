"""The preflight's checks that need no broker: a broker that refuses the connection, a
service URL that names no reachable host. (The rest, on the real test bed:
tests/integration/app/test_preflight.py.)"""

from __future__ import annotations

import socket
import time

from cursorsync.app.preflight import _broker, _no_connection
from cursorsync.app.settings import ClusterConfig


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_refused_broker_connection_is_named_at_once() -> None:
    """The Pulsar client retries a refused connection until its timeout and then says
    "TimeOut"; the check says who refused, without waiting."""
    port = closed_port()
    cluster = ClusterConfig(name="a", service_url=f"pulsar://127.0.0.1:{port}",
                            admin_url=f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    found = _broker(cluster, "source cluster a", None)
    assert time.monotonic() - t0 < 2.0
    assert (found.status, found.what, found.detail) == (
        "problem", f"source cluster a broker pulsar://127.0.0.1:{port}",
        f"connection refused by 127.0.0.1:{port}")


def test_every_host_of_a_service_url_is_tried_and_named() -> None:
    port = closed_port()
    assert _no_connection(f"pulsar+ssl://127.0.0.1:{port},[::1]:{port}/") == (
        f"connection refused by 127.0.0.1:{port}; connection refused by [::1]:{port}")
    assert _no_connection("pulsar://127.0.0.1:x").startswith(
        "'127.0.0.1:x' is not host:port")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        up = server.getsockname()[1]
        assert _no_connection(f"pulsar://127.0.0.1:{port},127.0.0.1:{up}") == ""
