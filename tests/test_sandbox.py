"""The sandbox: replication fidelity, admin API shapes and folding, workload, ack proxy."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.positions import MessageId, Position
from cursorsync.sandbox.proxy import (
    _encode_fields,
    _encode_varint,
    decode_acks,
    decode_subscribe,
    rewrite_lookup,
)
from cursorsync.sandbox.state import (
    EntryInfo,
    SubscriptionAcks,
    fold_cursor,
)

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "/admin/v2/persistent/public/default"


# ----------------------------------------------------------------- pure: folding


def _entries(ledger: int, sizes: list[int]) -> list[EntryInfo]:
    return [EntryInfo(ledger, i, k, 10, 0) for i, k in enumerate(sizes)]


def test_fold_out_of_order_acks_like_the_broker() -> None:
    acks = SubscriptionAcks(None)
    for e in (0, 1, 2, 4, 5, 8):
        acks.whole.add((7, e))
    view = fold_cursor(acks, _entries(7, [0] * 10))
    assert str(view.mark_delete) == "7:2"
    assert str(view.individually_deleted) == "[(7:3..7:5],(7:7..7:8]]"


def test_fold_batch_counts_only_when_every_message_is_acked() -> None:
    acks = SubscriptionAcks(None)
    acks.indexes[(3, 0)] = {0, 1, 2}  # batch of 3: complete
    acks.indexes[(3, 1)] = {0}  # batch of 2: partial
    acks.whole.add((3, 2))
    view = fold_cursor(acks, _entries(3, [3, 2, 0]))
    assert view.mark_delete == Position(3, 0)
    assert str(view.individually_deleted) == "[(3:1..3:2]]"
    assert view.partially_acked_entries == 1


def test_fold_cumulative_ack_inside_a_batch_stops_before_it() -> None:
    acks = SubscriptionAcks(None)
    acks.cumulative = MessageId(3, 2, -1, 0)  # index 0 of a batch of 2
    view = fold_cursor(acks, _entries(3, [0, 0, 2, 0]))
    assert view.mark_delete == Position(3, 1)
    acks.indexes[(3, 2)] = {1}
    assert fold_cursor(acks, _entries(3, [0, 0, 2, 0])).mark_delete == Position(3, 2)


# ---------------------------------------------------------- pure: proxy decoding


def _field(num: int, value: int | bytes) -> tuple[int, int, int | bytes]:
    return (num, 0 if isinstance(value, int) else 2, value)


def test_proxy_decodes_subscribe_and_acks() -> None:
    sub = _encode_fields(
        [_field(1, b"persistent://public/default/t"), _field(2, b"sync"), _field(3, 1),
         _field(4, 42), _field(5, 9)]
    )
    cmd = _encode_fields([_field(1, 4), _field(4, sub)])
    assert decode_subscribe(cmd) == (42, "persistent://public/default/t", "sync", True)
    reader = _encode_fields(
        [_field(1, b"persistent://public/default/t"), _field(2, b"reader-1"), _field(3, 1),
         _field(4, 43), _field(5, 10), _field(8, 0)]
    )
    assert decode_subscribe(_encode_fields([_field(1, 4), _field(4, reader)]))[3] is False
    mid1 = _encode_fields([_field(1, 5), _field(2, 7)])
    # batch-index ack of a batch of 4: bits set = still unacked (indexes 1 and 3 acked)
    mid2 = _encode_fields([_field(1, 5), _field(2, 8), _field(5, 0b0101), _field(6, 4)])
    ack = _encode_fields([_field(1, 42), _field(2, 0), _field(3, mid1), _field(3, mid2)])
    cmd = _encode_fields([_field(1, 10), _field(10, ack)])
    assert decode_acks(cmd) == (42, False, [(5, 7, -1), (5, 8, 1), (5, 8, 3)])
    assert decode_subscribe(cmd) is None


def test_proxy_rewrites_lookup_url() -> None:
    inner = _encode_fields([_field(1, b"pulsar://127.0.0.1:1"), _field(3, 1), _field(4, 3)])
    cmd = _encode_fields([_field(1, 24), _field(24, inner)])
    out = rewrite_lookup(cmd, "pulsar://127.0.0.1:2")
    assert out is not None and b"pulsar://127.0.0.1:2" in out and b":1\x18" not in out
    assert rewrite_lookup(_encode_fields([_field(1, 18)]), "x") is None
    assert _encode_varint(300) == b"\xac\x02"


# ------------------------------------------------------------- integration setup

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pulsar_lite")

from cursorsync.sandbox import (  # noqa: E402
    Replicator,
    ReplicatorOptions,
    Sandbox,
    SandboxConfig,
    WorkloadSpec,
    run_workload,
)

SPEC = WorkloadSpec(partitioned_topic="orders", partitions=2, plain_topic="audit",
                    entries_per_partition=16, seed=11)


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    topics = {**SPEC.topics, "fidelity": 0, "folding": 0, "lagging": 0}
    config = SandboxConfig(
        topics=topics, work_dir=tmp_path_factory.mktemp("sandbox"), admin_token=TOKEN
    )
    with Sandbox(config) as sandbox:
        yield sandbox


def _get(sb: Sandbox, cluster: str, path: str, headers: dict[str, str] | None = None) -> Any:
    return httpx.get(sb.admin_url(cluster) + path, headers=AUTH if headers is None else headers)


def _read_all(client: Any, topic: str, n: int) -> list[Any]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        return [reader.read_next(5000) for _ in range(n)]
    finally:
        reader.close()


def _identity(m: Any) -> tuple[Any, ...]:
    props = {k: v for k, v in m.properties().items() if not k.startswith("__MSG_PROP")}
    return (m.data(), props, m.partition_key(), m.ordering_key(), m.event_timestamp(),
            m.producer_name(), m.message_id().batch_index())


# ------------------------------------------------------------------- replication


@pytest.mark.integration
def test_replication_preserves_order_batches_and_fields(sb: Sandbox) -> None:
    topic = "persistent://public/default/fidelity"
    ca = sb.client("A")
    single = ca.create_producer(topic, producer_name="single")
    batching = ca.create_producer(
        topic, producer_name="batcher", batching_enabled=True,
        batching_max_messages=10_000, batching_max_publish_delay_ms=3_600_000,
    )
    sizes = [0, 3, 0, 1, 5, 0, 2]
    total = 0
    for k in sizes:
        if k == 0:
            single.send(b"u%d" % total, properties={"n": str(total)}, partition_key="pk",
                        event_timestamp=1_000 + total)
            total += 1
            continue
        for _ in range(k):
            batching.send_async(b"b%d" % total, None, properties={"n": str(total)},
                                ordering_key="ok", event_timestamp=2_000 + total)
            total += 1
        batching.flush()
    assert sb.replicator is not None
    sb.replicator.wait_caught_up(30)
    src = _read_all(ca, topic, total)
    dst = _read_all(sb.client("B"), topic, total)
    assert [_identity(m) for m in src] == [_identity(m) for m in dst]
    # Batch composition, checked on message ids: same grouping of messages into entries.
    def groups(ms: list[Any]) -> list[int]:
        out: list[int] = []
        last = None
        for m in ms:
            key = (m.message_id().ledger_id(), m.message_id().entry_id())
            if key != last:
                out.append(0)
                last = key
            out[-1] += 1
        return out
    assert groups(src) == groups(dst) == [1, 3, 1, 1, 5, 1, 2]
    def entry_heads(ms: list[Any]) -> list[Position]:
        return [
            Position(m.message_id().ledger_id(), m.message_id().entry_id())
            for m in ms
            if m.message_id().batch_index() <= 0
        ]

    pairs = sb.replicator.pairs(topic)
    assert [s for s, _ in pairs] == entry_heads(src)
    assert [t for _, t in pairs] == entry_heads(dst)
    # B's ledger ids differ from A's (target_ledger_offset), so mix-ups show.
    assert src[0].message_id().ledger_id() != dst[0].message_id().ledger_id()
    # The source position: on non-batched entries only (real brokers put it in the entry
    # metadata, which consumers of batched messages do not see).
    for m, (s, _t) in zip([m for m in dst if m.message_id().batch_index() <= 0], pairs,
                          strict=True):
        if m.message_id().batch_index() < 0:
            assert m.properties()["__MSG_PROP_REPL_SOURCE_POSITION"] == f"{s.ledger}:{s.entry}"
        else:
            assert "__MSG_PROP_REPL_SOURCE_POSITION" not in m.properties()
    # Publish time is not preserved: the target's is its own, never earlier.
    assert all(d.publish_timestamp() >= s.publish_timestamp() for s, d in zip(src, dst,
                                                                              strict=True))


@pytest.mark.integration
def test_source_position_property_switch(sb: Sandbox) -> None:
    topic = f"persistent://public/default/switch-{uuid.uuid4().hex[:6]}"
    ca, cb = sb.client("A"), sb.client("B")
    p = ca.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=3_600_000)
    for i in range(2):
        p.send_async(b"%d" % i, None)
    p.flush()
    ca.create_producer(topic).send(b"single")
    variants = {
        "off": ReplicatorOptions(stamp_source_position=False),
        "each": ReplicatorOptions(
            source_position_property="X-Source", position_on_batched="each_message"
        ),
    }
    results = {}
    for name, opts in variants.items():
        # Each variant replicates the same source topic into its own target topic.
        repl = Replicator(ca, _RenamingClient(cb, topic, f"{topic}-{name}"), [topic], opts)
        with repl:
            deadline = time.monotonic() + 20
            while len(repl.entries()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert len(repl.entries()) == 2
        results[name] = repl
    off = _read_all(cb, f"{topic}-off", 3)
    assert all(not any(k.startswith("__MSG") for k in m.properties()) for m in off)
    each = _read_all(cb, f"{topic}-each", 3)
    src_first = results["each"].entries()[0].source
    assert [m.properties().get("X-Source") for m in each][:2] == [
        f"{src_first.ledger}:{src_first.entry}"] * 2
    assert each[2].properties()["X-Source"] == str(results["each"].entries()[1].source)


class _RenamingClient:
    """Sends what the replicator produces for ``src`` to ``dst`` (one source, two variants)."""

    def __init__(self, client: Any, src: str, dst: str) -> None:
        self._client, self._src, self._dst = client, src, dst

    def create_producer(self, topic: str, **kw: Any) -> Any:
        return self._client.create_producer(self._dst if topic == self._src else topic, **kw)


@pytest.mark.integration
def test_pause_resume_and_lag(sb: Sandbox) -> None:
    assert sb.replicator is not None
    topic = "persistent://public/default/lagging"
    sb.replicator.pause()
    p = sb.client("A").create_producer(topic)
    for i in range(3):
        p.send(b"%d" % i)
    time.sleep(0.3)
    assert sb.replicator.lag()[topic] == 3
    sb.replicator.resume()
    sb.replicator.wait_caught_up(20)
    assert sb.replicator.lag()[topic] == 0
    assert len(sb.replicator.pairs(topic)) == 3


# ------------------------------------------------------------------------- admin


@pytest.mark.integration
def test_internal_stats_shape_and_folding(sb: Sandbox) -> None:
    topic = "persistent://public/default/folding"
    p = sb.client("A").create_producer(topic)
    for i in range(10):
        p.send(b"%d" % i)
    c = sb.subscribe("A", topic, "fold", consumer_type=pulsar.ConsumerType.Shared,
                     initial_position=pulsar.InitialPosition.Earliest)
    msgs = [c.receive(5000) for _ in range(10)]
    for m in msgs:
        if m.message_id().entry_id() in (0, 1, 2, 4, 5, 8):
            c.acknowledge(m)
    ledger = msgs[0].message_id().ledger_id()
    r = _get(sb, "A", f"{PREFIX}/folding/internalStats")
    assert r.status_code == 200
    stats = r.json()
    assert set(stats) >= {
        "entriesAddedCounter", "numberOfEntries", "totalSize", "currentLedgerEntries",
        "currentLedgerSize", "lastLedgerCreatedTimestamp", "waitingCursorsCount",
        "pendingAddEntriesCount", "lastConfirmedEntry", "state", "ledgers", "cursors",
        "schemaLedgers", "compactedLedger",
    }
    assert stats["state"] == "LedgerOpened"
    assert stats["lastConfirmedEntry"] == f"{ledger}:9"
    assert stats["currentLedgerEntries"] == 10 and stats["numberOfEntries"] == 10
    # The open ledger is listed with 0 entries, as the broker does.
    assert stats["ledgers"] == [
        {"ledgerId": ledger, "entries": 0, "size": 0, "offloaded": False,
         "underReplicated": False}
    ]
    cur = stats["cursors"]["fold"]
    assert cur["markDeletePosition"] == f"{ledger}:2"
    assert cur["individuallyDeletedMessages"] == (
        f"[({ledger}:3..{ledger}:5],({ledger}:7..{ledger}:8]]"
    )
    assert cur["totalNonContiguousDeletedMessagesRange"] == 2
    assert set(cur) == {
        "markDeletePosition", "readPosition", "waitingReadOp", "pendingReadOps",
        "messagesConsumedCounter", "cursorLedger", "cursorLedgerLastEntry",
        "individuallyDeletedMessages", "lastLedgerSwitchTimestamp", "state", "active",
        "numberOfEntriesSinceFirstNotAckedMessage", "totalNonContiguousDeletedMessagesRange",
        "subscriptionHavePendingRead", "subscriptionHavePendingReplayRead", "properties",
    }
    # The replicator's cursor is listed as on a real source broker.
    assert "pulsar.repl.B" in stats["cursors"]
    c.close()


@pytest.mark.integration
def test_partitioned_stats_partitions_listing_404_and_auth(sb: Sandbox) -> None:
    r = _get(sb, "A", f"{PREFIX}/orders/partitioned-internalStats")
    assert r.status_code == 200
    body = r.json()
    assert body["metadata"] == {"partitions": 2}
    assert sorted(body["partitions"]) == [
        "persistent://public/default/orders-partition-0",
        "persistent://public/default/orders-partition-1",
    ]
    assert all("cursors" in s for s in body["partitions"].values())
    assert _get(sb, "A", f"{PREFIX}/orders/partitions").json() == {"partitions": 2}
    assert _get(sb, "A", f"{PREFIX}/audit/partitions").json() == {"partitions": 0}
    listing = _get(sb, "B", PREFIX).json()
    assert "persistent://public/default/orders-partition-1" in listing
    assert "persistent://public/default/audit" in listing
    r = _get(sb, "A", f"{PREFIX}/no-such-topic/internalStats")
    assert r.status_code == 404 and r.json() == {"reason": "Topic not found"}
    assert _get(sb, "A", f"{PREFIX}/audit/partitioned-internalStats").status_code == 404
    assert _get(sb, "A", f"{PREFIX}/audit/internalStats", headers={}).status_code == 401
    bad = {"Authorization": "Bearer wrong"}
    assert _get(sb, "B", f"{PREFIX}/audit/internalStats", headers=bad).status_code == 401


# ---------------------------------------------------------------------- workload


@pytest.mark.integration
def test_workload_holes_foreign_and_stats_agree(sb: Sandbox) -> None:
    res = run_workload(sb, SPEC)
    assert len(res.topics()) == 3
    assert res.holes, "the workload must leave messages unacked"
    assert len(res.foreign) == 3 * SPEC.foreign_per_partition
    assert any(m.batch_size > 1 for m in res.messages)
    assert any(m.batch_size == 0 for m in res.messages)
    assert sb.replicator is not None
    sb.replicator.wait_caught_up(30)
    for topic in res.topics():
        local = topic.rsplit("/", 1)[-1]
        stats = _get(sb, "A", f"{PREFIX}/{local}/internalStats").json()
        cur = stats["cursors"][SPEC.subscription]
        md = Position.parse(cur["markDeletePosition"])
        from cursorsync.ranges import RangeSet

        acked = RangeSet.up_to(md) | RangeSet.parse(cur["individuallyDeletedMessages"])
        entries = {m.position for m in res.messages_of(topic)}
        assert {p for p in entries if p in acked} == res.acked_entries(topic)
        assert res.unacked_entries(topic), f"{topic} has no hole"
        # Foreign entries exist on B only: B has more entries than A.
        stats_b = _get(sb, "B", f"{PREFIX}/{local}/internalStats").json()
        assert stats_b["numberOfEntries"] == stats["numberOfEntries"] + SPEC.foreign_per_partition
        foreign = [m for m in res.foreign if m.topic == topic]
        replicated_targets = {t for _, t in sb.replicator.pairs(topic)}
        assert not {m.position for m in foreign} & replicated_targets


@pytest.mark.integration
def test_proxy_reports_acks_of_a_plain_client_on_b(sb: Sandbox) -> None:
    topic = "persistent://public/default/fidelity"
    assert sb.replicator is not None
    sb.replicator.wait_caught_up(30)
    plain = sb.client("B")  # through the proxy, like the sync emitter
    c = plain.subscribe(topic, "emitter", consumer_type=pulsar.ConsumerType.Shared,
                        initial_position=pulsar.InitialPosition.Earliest)
    first = c.receive(5000)
    ledger = first.message_id().ledger_id()
    c.acknowledge(first)  # entry 0 (non-batched)
    c.acknowledge(pulsar.MessageId(-1, ledger, 2, -1))  # a whole entry by ledger:entry
    c.close()  # flushes grouped acks
    deadline = time.monotonic() + 5
    cur: dict[str, Any] = {}
    while time.monotonic() < deadline:
        cur = _get(sb, "B", f"{PREFIX}/fidelity/internalStats").json()["cursors"].get(
            "emitter", {})
        if cur.get("individuallyDeletedMessages") == f"[({ledger}:1..{ledger}:2]]":
            break
        time.sleep(0.1)
    assert cur["markDeletePosition"] == f"{ledger}:0"
    assert cur["individuallyDeletedMessages"] == f"[({ledger}:1..{ledger}:2]]"
    events = [e for e in sb.state("B").ack_events() if e.subscription == "emitter"]
    assert {e.source for e in events} == {"proxy"}
    # The hook for acks sent elsewhere.
    sb.record_ack("B", topic, "emitter", f"{ledger}:1")
    cur = _get(sb, "B", f"{PREFIX}/fidelity/internalStats").json()["cursors"]["emitter"]
    assert cur["markDeletePosition"] == f"{ledger}:2"
    assert json.loads(json.dumps(cur))["individuallyDeletedMessages"] == "[]"


def test_readers_through_the_proxy_are_not_subscriptions(sb: Sandbox) -> None:
    """A reader's non-durable cursor (its internal acks) must not appear as a cursor on B."""
    topic = "persistent://public/default/fidelity"
    assert sb.replicator is not None
    p = sb.client("A").create_producer(topic, batching_enabled=False)
    p.send(b"r1")
    p.send(b"r2")
    p.close()
    sb.replicator.wait_caught_up(30)
    r = sb.client("B").create_reader(topic, pulsar.MessageId.earliest)
    try:
        r.read_next(5000)
        r.read_next(5000)
    finally:
        r.close()
    time.sleep(0.3)
    cursors = _get(sb, "B", f"{PREFIX}/fidelity/internalStats").json()["cursors"]
    assert not [name for name in cursors if name.startswith("reader-")]


@pytest.mark.integration
def test_verified_holes_never_claims_a_chunked_messages_chunks(sb: Sandbox) -> None:
    """evidence.holes verified against a real broker's skipped ids: pulsar-lite chunks a
    6 MB message, its reader skips the first chunks, and the admin API's raw-entry answer
    for them carries no marker type, so nothing is claimed."""
    from cursorsync.hole_check import AdminHoleCheck
    from cursorsync.mapping import holes
    from cursorsync.pulsar.admin import AdminClient, AdminConfig
    from cursorsync.tables.rows import PartitionKey

    topic = f"persistent://public/default/chunky-{uuid.uuid4().hex[:6]}"
    sb.register_topic("B", topic)
    p = sb.client("B").create_producer(topic, batching_enabled=False, chunking_enabled=True)
    ids = [p.send(b"a"), p.send(b"x" * (6 * 1024 * 1024)), p.send(b"b")]
    p.close()
    seen = [(i.ledger_id(), i.entry_id()) for i in ids]
    assert seen[1][1] - seen[0][1] > 1  # the reader sees the chunked message at its last chunk
    found = holes(*map(np.array, zip(*seen, strict=True)))
    assert found.rows.tolist() == [[seen[0][0], seen[0][1] + 1, seen[1][1] - seen[0][1] - 1]]
    key = PartitionKey(topic, -1)
    with AdminClient(AdminConfig.from_urls(sb.admin_url("B"), token=TOKEN)) as admin:
        check = AdminHoleCheck(admin)
        assert check({key: found}) == {}
        assert check.stats.requests == 1 and check.stats.not_markers == 1
        assert admin.raw_entry(topic, seen[2][0], seen[2][1] + 1) is None  # past the end


@settings(max_examples=300, deadline=None)
@given(ledgers=st.lists(st.integers(0, 6), min_size=0, max_size=4, unique=True),
       per=st.integers(0, 5),
       lo=st.tuples(st.integers(-1, 7), st.integers(-1, 6)),
       hi=st.tuples(st.integers(-1, 7), st.integers(-1, 6)))
def test_entries_between_counts_what_a_walk_over_the_entries_counts(
        ledgers: list[int], per: int, lo: tuple[int, int], hi: tuple[int, int]) -> None:
    """The admin server's count of entries in (lo, hi], and the count up to a position the
    replicator's lag uses (binary searches), against walks."""
    from cursorsync.sandbox.admin_server import _entries_between
    from cursorsync.sandbox.state import entries_up_to

    entries = [EntryInfo(lid, e, 0, 1, 0) for lid in sorted(ledgers) for e in range(per)]
    a, b = Position(*lo), Position(*hi)
    walked = sum(1 for e in entries if a < Position(e.ledger, e.entry) <= b)
    assert _entries_between(entries, a, b) == walked
    assert entries_up_to(entries, b) == sum(1 for e in entries if Position(e.ledger, e.entry) <= b)
