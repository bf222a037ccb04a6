"""The brokers a service URL names, and whether one of them takes a connection."""

from __future__ import annotations

import socket

from cursorsync.pulsar.reachable import endpoints, reachable


def test_the_hosts_of_a_service_url() -> None:
    """Without a port, pulsar:// is 6650 and pulsar+ssl:// 6651, as the Pulsar client
    takes them."""
    assert endpoints("pulsar://broker-1") == [("broker-1", 6650)]
    assert endpoints("pulsar+ssl://broker-1,broker-2:7000/") == [
        ("broker-1", 6651), ("broker-2", 7000)]
    assert endpoints("pulsar://[::1]:6650") == [("::1", 6650)]
    (bad,) = endpoints("pulsar://h:99999")
    assert isinstance(bad, str) and bad.startswith("'h:99999' is not host:port")


def test_reachable_when_any_named_broker_takes_a_connection() -> None:
    """A malformed item and a closed port are passed over; one listening broker is
    enough, and none is not."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        shut = closed.getsockname()[1]
    with socket.socket() as up:
        up.bind(("127.0.0.1", 0))
        up.listen()
        port = up.getsockname()[1]
        assert reachable(f"pulsar://h:99999,127.0.0.1:{shut},127.0.0.1:{port}")
    assert not reachable(f"pulsar://127.0.0.1:{shut}")
    assert not reachable("pulsar://h:99999")
