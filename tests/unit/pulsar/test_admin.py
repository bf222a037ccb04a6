"""The admin REST client against a local stub HTTP server (stdlib, in a thread)."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cursorsync.errors import (
    AdminError,
    ConfigError,
    MalformedAdminOutputError,
    TopicNotFoundError,
)
from cursorsync.pulsar.admin import AdminAuthError, AdminClient, AdminSettings
from cursorsync.pulsar.topics import TopicName
from tests.support.admin_stub import BASE, Reply, StubAdmin, stats_doc


@pytest.fixture
def stub() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


def client(urls: str, **kw: Any) -> AdminClient:
    kw.setdefault("attempts", 3)
    kw.setdefault("backoff_initial_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    kw.setdefault("timeout_s", 2.0)
    return AdminClient(AdminSettings.from_urls(urls, cluster="cluster-a", **kw))


T = "persistent://acme/orders/events"
DOC = stats_doc("3:9", [(1, 5), (3, 0)], {"svc": ("1:4", "[(3:2..3:5]]"),
                                          "pulsar.repl.b": ("3:9", "[]")})


def test_internal_stats(stub: StubAdmin) -> None:
    stub.set(BASE + "/internalStats", Reply(body=DOC))
    with client(stub.url) as c:
        s = c.internal_stats(T)
    assert s.ledgers.entries.tolist() == [5, 10]
    assert list(s.subscriptions) == ["svc"]
    assert stub.requests[0][0] == BASE + "/internalStats"


def test_partitioned_partitions_and_lists(stub: StubAdmin) -> None:
    stub.set(BASE + "/partitions", Reply(body={"partitions": 2}))
    stub.set(BASE + "/partitioned-internalStats", Reply(body={
        "metadata": {"partitions": 2},
        "partitions": {f"{T}-partition-{i}": copy.deepcopy(DOC) for i in range(2)}}))
    stub.set("/admin/v2/persistent/acme/orders",
             Reply(body=[f"{T}-partition-0", f"{T}-partition-1", "persistent://acme/orders/x",
                         "persistent://acme/orders/y"]))
    stub.set("/admin/v2/persistent/acme/orders/partitioned", Reply(body=[T]))
    stub.set("/admin/v2/persistent/acme/orders/x/partitions", Reply(body={"partitions": 0}))
    with client(stub.url) as c:
        assert c.partitions(T) == 2
        ps = c.partitioned_internal_stats(T)
        assert ps.partitions == 2 and len(ps.stats) == 2
        assert c.list_topics("acme/orders")[-1] == "persistent://acme/orders/y"
        assert [str(t) for t in c.expand_topics([T, "persistent://acme/orders/x"])] == [
            f"{T}-partition-0", f"{T}-partition-1", "persistent://acme/orders/x"]
        got = c.expand_topics(namespace="acme/orders", pattern="ev.*|y")
        assert [str(t) for t in got] == [f"{T}-partition-0", f"{T}-partition-1",
                                         "persistent://acme/orders/y"]
        assert len(c.expand_topics(namespace="acme/orders")) == 4
        with pytest.raises(ConfigError, match="topicPattern"):
            c.expand_topics(namespace="acme/orders", pattern="(")


def test_many_topics_concurrently(stub: StubAdmin) -> None:
    names = [f"persistent://acme/orders/t{i}" for i in range(12)]
    for n in names:
        stub.set(TopicName.parse(n).admin_path("internalStats"), Reply(body=DOC, delay_s=0.2))
    t0 = time.monotonic()
    with client(stub.url) as c:
        got = c.internal_stats_many(names)
    assert sorted(got) == sorted(names)
    assert time.monotonic() - t0 < 12 * 0.2  # concurrent, not one after another


def test_404_names_topic_and_cluster(stub: StubAdmin) -> None:
    with client(stub.url) as c, pytest.raises(TopicNotFoundError) as ei:
        c.internal_stats("persistent://acme/orders/missing")
    assert "persistent://acme/orders/missing" in str(ei.value)
    assert "cluster-a" in str(ei.value)
    assert len(stub.requests) == 1  # 4xx is not retried


def test_500_then_200_is_retried(stub: StubAdmin) -> None:
    stub.set(BASE + "/internalStats", Reply(500, {"reason": "boom"}), Reply(503, {}),
             Reply(body=DOC))
    with client(stub.url) as c:
        s = c.internal_stats(T)
    assert s.last_confirmed_entry.entry == 9
    assert len(stub.requests) == 3


def test_persistent_5xx_gives_up_with_admin_error(stub: StubAdmin) -> None:
    stub.set(BASE + "/internalStats", Reply(500, {"reason": "boom"}))
    with client(stub.url, attempts=2) as c, pytest.raises(AdminError, match="HTTP 500"):
        c.internal_stats(T)
    assert len(stub.requests) == 2


def test_slow_response_times_out(stub: StubAdmin) -> None:
    stub.set(BASE + "/internalStats", Reply(body=DOC, delay_s=1.5))
    with client(stub.url, timeout_s=0.3, attempts=2) as c, pytest.raises(
            AdminError, match="timed out"):
        c.internal_stats(T)


def test_401_names_auth_and_token_is_sent(stub: StubAdmin) -> None:
    stub.required_token = "s3cret"
    stub.set(BASE + "/internalStats", Reply(body=DOC))
    with client(stub.url) as c, pytest.raises(AdminAuthError, match=r"401.*token"):
        c.internal_stats(T)
    assert len(stub.requests) == 1
    with client(stub.url, token="s3cret") as c:
        assert c.internal_stats(T).entries_added_counter == 0
    assert stub.requests[-1][1]["Authorization"] == "Bearer s3cret"


def test_403_is_auth_error(stub: StubAdmin) -> None:
    stub.set(BASE + "/internalStats", Reply(403, {"reason": "not authorized"}))
    with client(stub.url) as c, pytest.raises(AdminAuthError, match="authorization"):
        c.internal_stats(T)


def test_malformed_json(stub: StubAdmin) -> None:
    stub.set(BASE + "/internalStats", Reply(raw=b"<html>proxy error</html>"))
    with client(stub.url) as c, pytest.raises(AdminError, match="malformed JSON"):
        c.internal_stats(T)


def test_unreachable_names_url_and_fails_over(stub: StubAdmin) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    with client(dead, attempts=2) as c, pytest.raises(AdminError) as ei:
        c.internal_stats(T)
    assert "127.0.0.1:9" in str(ei.value) and "unreachable" in str(ei.value)
    stub.set(BASE + "/internalStats", Reply(body=DOC))
    with client(f"{dead},{stub.url}") as c:
        assert c.internal_stats(T).ledgers.ids.tolist() == [1, 3]


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="adminUrl"):
        AdminSettings.from_urls("")
    with pytest.raises(ConfigError, match="ftp://x"):
        AdminSettings.from_urls("ftp://x")
    with pytest.raises(ConfigError, match="adminTlsCertFile"):
        AdminSettings.from_urls("https://x", tls_key_file="k.pem")
    with pytest.raises(ConfigError, match="topic"):
        TopicName.parse("non-persistent://a/b/c")


def test_topic_names_and_paths() -> None:
    t = TopicName.parse("persistent://acme/orders/events-partition-3")
    assert t.partition == 3 and str(t.base) == T
    assert t.admin_path("internalStats") == BASE + "-partition-3/internalStats"
    assert str(TopicName.parse("events")) == "persistent://public/default/events"
    assert TopicName.parse("acme/orders/events") == TopicName.parse(T)


def test_raw_entry_reads_the_marker_and_chunk_headers_only(stub: StubAdmin) -> None:
    """Pulsar's header names (PersistentTopicsBase); a chunk's megabytes are not read."""
    entry = T + "-partition-2"
    path = "/admin/v2/persistent/acme/orders/events-partition-2/ledger/7/entry/{}"
    stub.set(path.format(1), Reply(raw=b"\x08\x01", headers={"X-Pulsar-marker-type": "10"}))
    stub.set(path.format(2), Reply(raw=b"x" * 5_000_000, headers={
        "X-Pulsar-chunk-id": "0", "X-Pulsar-num-chunks-from-msg": "3"}))
    stub.set(path.format(3), Reply(raw=b"payload"))
    stub.set(path.format(4), Reply(404, {"reason": "Message not found"}))
    stub.set(path.format(5), Reply(raw=b"", headers={"X-Pulsar-marker-type": "snapshot"}))
    with client(stub.url) as c:
        marker = c.raw_entry(entry, 7, 1)
        assert marker is not None and marker.is_marker and marker.marker_type == 10
        chunk = c.raw_entry(entry, 7, 2)
        assert chunk is not None and not chunk.is_marker
        assert (chunk.chunk_id, chunk.num_chunks) == (0, 3)
        plain = c.raw_entry(entry, 7, 3)
        assert plain is not None and not plain.is_marker and plain.chunk_id is None
        assert c.raw_entry(entry, 7, 4) is None
        with pytest.raises(AdminError, match="X-Pulsar-marker-type is 'snapshot'"):
            c.raw_entry(entry, 7, 5)


def test_raw_entry_reads_where_a_copy_came_from_and_its_properties(stub: StubAdmin) -> None:
    """A replicated chunk names its source cluster and, among its properties (one JSON
    header), the source position its replicator stamped; a header that is not a JSON
    object of strings is refused naming the entry."""
    path = BASE + "/ledger/7/entry/{}"
    stub.set(path.format(1), Reply(raw=b"x" * 5_000_000, headers={
        "X-Pulsar-chunk-id": "1", "X-Pulsar-num-chunks-from-msg": "3",
        "X-Pulsar-replicated-from": "a",
        "X-Pulsar-PROPERTY": '{"__MSG_PROP_REPL_SOURCE_POSITION":"3:19","key":"big-0"}'}))
    stub.set(path.format(2), Reply(raw=b"payload"))
    stub.set(path.format(3), Reply(raw=b"payload", headers={"X-Pulsar-PROPERTY": '["3:19"]'}))
    with client(stub.url) as c:
        chunk = c.raw_entry(T, 7, 1)
        assert chunk is not None and chunk.replicated_from == "a"
        assert chunk.properties == {"__MSG_PROP_REPL_SOURCE_POSITION": "3:19", "key": "big-0"}
        plain = c.raw_entry(T, 7, 2)
        assert plain is not None and plain.replicated_from is None and plain.properties == {}
        with pytest.raises(MalformedAdminOutputError,
                           match=r"entry 7:3 of .*events: header X-Pulsar-PROPERTY"):
            c.raw_entry(T, 7, 3)


def test_raw_entry_retries_5xx_and_names_the_entry(stub: StubAdmin) -> None:
    path = BASE + "/ledger/7/entry/1"
    stub.set(path, Reply(500, {"reason": "bookie down"}),
             Reply(raw=b"", headers={"X-Pulsar-marker-type": "12"}))
    with client(stub.url) as c:
        got = c.raw_entry(T, 7, 1)
        assert got is not None and got.marker_type == 12
    stub.set(path, Reply(503, {"reason": "bookie down"}))
    with client(stub.url) as c, pytest.raises(AdminError, match=r"entry 7:1 of .*events"):
        c.raw_entry(T, 7, 1)


def test_raw_entry_keeps_the_connection_after_a_marker_not_after_a_chunk(
        stub: StubAdmin) -> None:
    """A marker's small body is drained so the next request reuses the connection (and
    its TLS session); a chunk's megabytes are left unread and its connection dropped."""
    path = BASE + "/ledger/7/entry/{}"
    stub.set(path.format(1), Reply(raw=b"m" * 40, headers={"X-Pulsar-marker-type": "10"}))
    stub.set(path.format(2), Reply(raw=b"x" * 5_000_000, headers={"X-Pulsar-chunk-id": "1"}))
    with client(stub.url) as c:
        for _ in range(3):
            c.raw_entry(T, 7, 1)
        assert len(set(stub.client_ports)) == 1
        c.raw_entry(T, 7, 2)
        c.raw_entry(T, 7, 1)
    assert len(set(stub.client_ports)) == 2


def test_raw_entry_keeps_a_marker_s_body_only(stub: StubAdmin) -> None:
    """The body is the marker's protobuf; other entries' bodies are not kept, and a body
    past the read limit is never read, marker or not."""
    path = BASE + "/ledger/7/entry/{}"
    stub.set(path.format(1), Reply(raw=b"\x0a\x01s", headers={"X-Pulsar-marker-type": "10"}))
    stub.set(path.format(2), Reply(raw=b"payload"))
    stub.set(path.format(3), Reply(raw=b"m" * 5_000_000, headers={"X-Pulsar-marker-type": "12"}))
    with client(stub.url) as c:
        marker = c.raw_entry(T, 7, 1)
        assert marker is not None and marker.body == b"\x0a\x01s"
        plain = c.raw_entry(T, 7, 2)
        assert plain is not None and plain.body is None
        large = c.raw_entry(T, 7, 3)
        assert large is not None and large.marker_type == 12 and large.body is None


def test_raw_entry_past_the_end_is_none_at_once_with_past_end_ok(stub: StubAdmin) -> None:
    """The broker's 500 for an id past the open ledger's last entry is an answer, not a
    failure: with ``past_end_ok`` it is None after one request; without, it is retried as
    any 5xx. Other 500s are retried either way."""
    path = BASE + "/ledger/7/entry/9"
    past = Reply(500, {"reason": "Failed to read entry 7:9: LastConfirmedEntry is 7:3"})
    stub.set(path, past)
    with client(stub.url, attempts=4, backoff_initial_s=0.5, backoff_max_s=0.5) as c:
        t0 = time.monotonic()
        assert c.raw_entry(T, 7, 9, past_end_ok=True) is None
        assert time.monotonic() - t0 < 0.4 and len(stub.requests) == 1
    stub.requests.clear()
    with client(stub.url) as c, pytest.raises(AdminError, match=r"LastConfirmedEntry"):
        c.raw_entry(T, 7, 9)
    assert len(stub.requests) == 3
    stub.requests.clear()
    # Past the last entry of a closed ledger the broker says "No such entry".
    stub.set(path, Reply(500, {"reason": "org.apache.bookkeeper.mledger.ManagedLedgerException"
                                         "$NonRecoverableLedgerException: No such entry"}))
    with client(stub.url) as c:
        assert c.raw_entry(T, 7, 9, past_end_ok=True) is None
    assert len(stub.requests) == 1
    stub.requests.clear()
    stub.set(path, Reply(500, {"reason": "bookie down"}))
    with client(stub.url) as c, pytest.raises(AdminError, match=r"bookie down"):
        c.raw_entry(T, 7, 9, past_end_ok=True)
    assert len(stub.requests) == 3
