"""The plugin's cursor digests (cursorsync.pulsar.cursor_digests): parsing, which topics
moved, and asking a stub broker."""

from __future__ import annotations

import contextlib
import copy
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.positions import Position, parse_range_bounds
from cursorsync.errors import MalformedAdminOutputError
from cursorsync.pulsar.batch_acks import BatchAcksNotFoundError, BatchAcksPluginAbsentError
from cursorsync.pulsar.cursor_digests import (
    CURSORS_PATH,
    PLUGIN_RETRY_S,
    CursorDigest,
    PluginCursorStats,
    TopicDigest,
    acks_digest,
    cluster_cursor_stats,
    cluster_digests,
    fetch_cursor_digests,
    moved,
    parse_cursor_digests,
)
from tests.support.admin_stub import Reply, StubAdmin
from tests.support.admin_stub import fast_client as client

NS = "acme/orders"
P0 = f"persistent://{NS}/events-partition-0"
P1 = f"persistent://{NS}/events-partition-1"
D1, D2 = "0123456789abcdef", "fedcba9876543210"


def answer(*topics: dict[str, Any]) -> dict[str, Any]:
    return {"plugin": "cursorsync", "broker": "broker-1:8080",
            "brokers": ["broker-1:8080", "broker-2:8080"], "namespace": NS,
            "topics": list(topics)}


def topic(name: str = P0, ledgers: str = "20:2000:12:19", **cursors: Any) -> dict[str, Any]:
    return {"topic": name, "ledgers": ledgers,
            "cursors": cursors or {"svc": {"acks": D1, "batches": D2}}}


def digest(acks: str = D1, batches: str = D2) -> dict[str, str]:
    return {"acks": acks, "batches": batches}


def test_an_answer_reads_as_topic_to_ledgers_and_digests() -> None:
    got = parse_cursor_digests(NS, answer(topic(), topic(P1, "0:0:-1:-1", svc=digest(D2, D1),
                                                         b=digest())))
    assert got.broker == "broker-1:8080" and got.namespace == NS
    assert got.brokers == ("broker-1:8080", "broker-2:8080")
    assert got.topics == {P0: TopicDigest("20:2000:12:19", {"svc": CursorDigest(D1, D2)}),
                          P1: TopicDigest("0:0:-1:-1", {"svc": CursorDigest(D2, D1),
                                                        "b": CursorDigest(D1, D2)})}


BROKEN = [
    ("not an object", [], "expected a JSON object"),
    ("no mark", {**answer(), "plugin": None}, "plugin is None"),
    ("other namespace", {**answer(), "namespace": "acme/other"}, "for namespace 'acme/other'"),
    ("no topics", {**answer(), "topics": None}, "a topics list"),
    ("no brokers", {**answer(), "brokers": None}, "not a list of host:port"),
    ("a URL for a broker", {**answer(), "brokers": ["http://b:8080"]}, "not a list of host:port"),
    ("topic elsewhere", answer(topic("persistent://acme/other/x")), "not a persistent topic"),
    ("non-persistent", answer(topic(f"non-persistent://{NS}/x")), "not a persistent topic"),
    ("bad ledgers", answer(topic(ledgers="20:2000")), "is not entries:bytes:ledger:entry"),
    ("one digest", answer(topic(svc=D1)), "16 hex digits each"),
    ("short digest", answer(topic(svc=digest("0123"))), "16 hex digits each"),
    ("upper digest", answer(topic(svc=digest(batches=D1.upper()))), "16 hex digits each"),
    ("more digests", answer(topic(svc={**digest(), "x": D1})), "16 hex digits each"),
    ("twice", answer(topic(), topic()), "listed twice"),
]


@pytest.mark.parametrize(("doc", "why"), [(d, w) for _, d, w in BROKEN],
                         ids=[n for n, _, _ in BROKEN])
def test_anything_else_is_one_error_naming_the_namespace(doc: Any, why: str) -> None:
    with pytest.raises(MalformedAdminOutputError) as err:
        parse_cursor_digests(NS, copy.deepcopy(doc))
    assert f"cursor digests of namespace {NS}: " in str(err.value)
    assert why in str(err.value)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12))
def test_arbitrary_json_is_refused_or_read_never_crashes(doc: Any) -> None:
    with contextlib.suppress(MalformedAdminOutputError):
        parse_cursor_digests(NS, doc)


def test_moved_names_new_topics_ledgers_and_cursors_of_the_wanted_subscriptions() -> None:
    c1, c2 = CursorDigest(D1, D1), CursorDigest(D1, D2)  # the batches differ only
    before = {P0: TopicDigest("1:1:1:0", {"svc": c1, "b": c1}),
              P1: TopicDigest("1:1:1:0", {"svc": c1})}
    assert moved(before, before) == set()
    assert moved({}, before) == {P0, P1}
    assert moved(before, {P0: TopicDigest("2:2:1:1", {"svc": c1, "b": c1})}) == {P0}
    other = {P0: TopicDigest("1:1:1:0", {"svc": c1, "b": c2})}
    assert moved(before, other) == {P0}
    assert moved(before, other, ["svc"]) == set()  # b is not synced
    assert moved(before, {P0: TopicDigest("1:1:1:0", {"b": c1})}, ["svc"]) == {P0}  # svc gone


def splitmix_reference(values: list[int]) -> str:
    """The plugin's Hash, step by step in Java's terms (64-bit wrap, unsigned shifts)."""
    def wrap(x: int) -> int:
        return x & 0xFFFFFFFFFFFFFFFF

    h = 0x9E3779B97F4A7C15
    for v in values:
        z = h ^ wrap(v + 0x9E3779B97F4A7C15)
        z = wrap((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9)
        z = wrap((z ^ (z >> 27)) * 0x94D049BB133111EB)
        h = z ^ (z >> 31)
    return f"{h:016x}"


def test_the_acks_digest_hashes_each_range_then_the_mark_delete_position() -> None:
    ranges = parse_range_bounds("[(12:3..12:5], (13:-1..13:7]]")
    got = acks_digest(Position(12, 2), ranges)
    assert got == splitmix_reference([12, 3, 12, 5, 13, -1, 13, 7, 12, 2])
    assert acks_digest(Position(12, 2), parse_range_bounds("[]")) == splitmix_reference(
        [12, 2])
    # Order and every number count.
    assert got != acks_digest(Position(12, 2), parse_range_bounds("[(13:-1..13:7], (12:3..12:5]]"))
    assert got != acks_digest(Position(12, 1), ranges)


@pytest.fixture
def stub(admin: StubAdmin) -> StubAdmin:
    return admin


def test_fetch_asks_for_the_namespace_and_each_subscription(stub: StubAdmin) -> None:
    query = urlencode([("namespace", NS), ("subscription", "svc"), ("subscription", "b")])
    path = f"{CURSORS_PATH}?{query}"
    stub.set(path, Reply(body=answer(topic())))
    with client(stub.url) as admin:
        got = fetch_cursor_digests(admin, NS, ["svc", "b"])
    assert got.topics == {P0: TopicDigest("20:2000:12:19", {"svc": CursorDigest(D1, D2)})}


def test_a_broker_without_the_plugin_or_an_older_plugin_is_named(stub: StubAdmin) -> None:
    with client(stub.url) as admin, pytest.raises(BatchAcksPluginAbsentError,
                                                  match="no cursorsync plugin loaded"):
        fetch_cursor_digests(admin, NS)
    stub.set(f"{CURSORS_PATH}?namespace={NS.replace('/', '%2F')}",
             Reply(404, {"plugin": "cursorsync", "error": "no such endpoint"}))
    with client(stub.url) as admin, pytest.raises(BatchAcksNotFoundError,
                                                  match="no such endpoint"):
        fetch_cursor_digests(admin, NS)


def test_every_broker_is_asked_for_each_namespace_it_has_not_answered(stub: StubAdmin) -> None:
    """Behind a load balancer, each namespace's first answer may come from another broker:
    each broker is then asked for the namespaces it has not answered yet. The stub plays
    both brokers (127.0.0.1 and localhost on its port)."""
    port = urlsplit(stub.url).port
    one, two = f"127.0.0.1:{port}", f"localhost:{port}"
    other_ns = "acme/billing"

    def reply(broker: str, namespace: str, *names: str) -> Reply:
        return Reply(body={"plugin": "cursorsync", "broker": broker, "brokers": [one, two],
                           "namespace": namespace,
                           "topics": [topic(f"persistent://{namespace}/{n}") for n in names]})

    stub.set(f"{CURSORS_PATH}?namespace=acme%2Forders",
             reply(one, NS, "a"), reply(two, NS, "b"))
    stub.set(f"{CURSORS_PATH}?namespace=acme%2Fbilling",
             reply(two, other_ns, "c"), reply(one, other_ns, "d"))
    with client(stub.url) as admin:
        got = cluster_digests(admin, [NS, other_ns])
    assert set(got) == {f"persistent://{NS}/a", f"persistent://{NS}/b",
                        f"persistent://{other_ns}/c", f"persistent://{other_ns}/d"}
    assert sorted(p for p, _ in stub.requests) == sorted(
        [f"{CURSORS_PATH}?namespace=acme%2Forders"] * 2
        + [f"{CURSORS_PATH}?namespace=acme%2Fbilling"] * 2)


def test_a_broker_that_cannot_be_asked_leaves_its_topics_out(stub: StubAdmin) -> None:
    stub.set(f"{CURSORS_PATH}?namespace=acme%2Forders", Reply(body={
        **answer(topic()), "broker": urlsplit(stub.url).netloc,
        "brokers": [urlsplit(stub.url).netloc, "127.0.0.1:1"]}))
    with client(stub.url) as admin:
        assert set(cluster_digests(admin, [NS])) == {P0}  # 127.0.0.1:1 refuses: logged


def stats(cursors: dict[str, Any] | None = None, lce: str = "12:4",
          ledgers: list[dict[str, int]] | None = None) -> dict[str, Any]:
    """A topic's ``stats`` as the plugin writes them with ``stats=true``: internalStats'
    own fields and forms."""
    return {"lastConfirmedEntry": lce,
            "ledgers": [{"ledgerId": 11, "entries": 7}, {"ledgerId": 12, "entries": 0}]
            if ledgers is None else ledgers,
            "cursors": {"cursorsync-probe": {"markDeletePosition": "11:2",
                                             "individuallyDeletedMessages":
                                                 "[(11:3..11:5],(12:0..12:2]]"}}
            if cursors is None else cursors}


def test_stats_read_as_internal_stats_would() -> None:
    """The open ledger's count comes from the last confirmed entry, as internalStats' does;
    the cursor's acked set from its markDeletePosition and ranges."""
    got = parse_cursor_digests(NS, answer({**topic(), "stats": stats()})).topics[P0].stats
    assert got is not None
    assert dict(zip(got.ledgers.ids.tolist(), got.ledgers.entries.tolist(),
                    strict=True)) == {11: 7, 12: 5}
    cursor = got.subscriptions["cursorsync-probe"].state
    acked = cursor.acked()
    assert cursor.mark_delete == Position(11, 2)
    assert [p for p in (Position(11, 2), Position(11, 4), Position(11, 5), Position(12, 1),
                        Position(12, 2)) if acked.contains(p)] == [
        Position(11, 2), Position(11, 4), Position(11, 5), Position(12, 1), Position(12, 2)]
    assert not acked.contains(Position(11, 3)) and not acked.contains(Position(12, 3))
    assert parse_cursor_digests(NS, answer(topic())).topics[P0].stats is None


@pytest.mark.parametrize(("bad", "why"), [
    ({"cursors": {"cursorsync-probe": {"markDeletePosition": "11:2",
                                       "individuallyDeletedMessages": "[(11:3..]"}}},
     "individuallyDeletedMessages is malformed"),
    ({"lce": "x"}, "lastConfirmedEntry"),
    ({"ledgers": [{"ledgerId": 11, "entries": -1}]}, "entries is negative"),
], ids=["ranges", "last confirmed", "ledger count"])
def test_malformed_stats_are_one_error_naming_the_topic(bad: dict[str, Any], why: str) -> None:
    with pytest.raises(MalformedAdminOutputError) as err:
        parse_cursor_digests(NS, answer({**topic(), "stats": stats(**bad)}))
    assert P0 in str(err.value) and why in str(err.value)


def test_cluster_cursor_stats_asks_for_stats_and_leaves_out_what_it_cannot_answer(
        stub: StubAdmin) -> None:
    """One request for the namespace; a topic without the cursor, or not listed, is left
    for the caller to read on its own."""
    no_probe = stats(cursors={})
    query = urlencode([("namespace", NS), ("subscription", "cursorsync-probe"),
                       ("stats", "true")])
    stub.set(f"{CURSORS_PATH}?{query}", Reply(body={
        **answer({**topic(), "stats": stats()}, {**topic(P1), "stats": no_probe}),
        "broker": urlsplit(stub.url).netloc, "brokers": [urlsplit(stub.url).netloc]}))
    p2 = f"persistent://{NS}/events-partition-2"
    with client(stub.url) as admin:
        got = cluster_cursor_stats(admin, {t: ("cursorsync-probe",) for t in (P0, P1, p2)})
    assert set(got) == {P0}
    assert got[P0].subscriptions["cursorsync-probe"].state.mark_delete == Position(11, 2)
    assert len(stub.requests) == 1


def test_a_plugin_that_cannot_be_asked_is_asked_again_after_the_retry_time(
        stub: StubAdmin, caplog: pytest.LogCaptureFixture) -> None:
    """No plugin on the broker: one warning naming what is read, nothing read from it (the
    caller reads each partition on its own) and no request until PLUGIN_RETRY_S has passed;
    then it is asked again, and answers."""
    now = [1000.0]
    with client(stub.url) as admin:
        reads = PluginCursorStats(admin, "the target cursors")
        reads.clock = lambda: now[0]
        wanted = {P0: ("cursorsync-probe",)}
        assert reads.read(wanted) == {}  # the stub answers 404: no plugin
        assert "the target cursors of cluster" in caplog.text
        asked = len(stub.requests)
        now[0] += PLUGIN_RETRY_S - 1
        assert reads.read(wanted) == {} and len(stub.requests) == asked
        query = urlencode([("namespace", NS), ("subscription", "cursorsync-probe"),
                           ("stats", "true")])
        stub.set(f"{CURSORS_PATH}?{query}", Reply(body={
            **answer({**topic(), "stats": stats()}),
            "broker": urlsplit(stub.url).netloc, "brokers": [urlsplit(stub.url).netloc]}))
        now[0] += 1
        assert set(reads.read(wanted)) == {P0} and reads.reads == 1
        assert PluginCursorStats(admin, "x", enabled=False).read(wanted) == {}
