"""The emitter on the real test bed: acks exactly the plan, cumulative where the
subscription type allows, per partition, through consumers opened ahead together; an
exclusive subscription held elsewhere, a topic missing on the target."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import ConfigError
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.emitter import (
    EmitResult,
    EmitTopicNotFoundError,
    PulsarEmitter,
    SubscriptionBusyError,
)
from cursorsync.pulsar.subscriptions import SubscriptionType
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.emitter_plans import _plan

pulsar = pytest.importorskip("pulsar")

# Batch sizes of the entries produced (0: not batched), entry i = LAYOUT[i].
LAYOUT = [0, 3, 0, 0, 2, 4, 0, 0, 3, 0, 0, 2]


def _acked_entries(state: CursorState, n: int) -> set[int]:
    return {p.entry for p in state.acked().iter_entries(Ledgers.of([(state_ledger(state), n)]))}


def state_ledger(state: CursorState) -> int:
    assert state.ledgers is not None
    return int(state.ledgers.ids[0])


def _produce(client: Any, topic: str, layout: list[int], first: int = 0) -> int:
    """Entries ``first``, ``first + 1``... with the given batch sizes; returns the ledger id."""
    plain = client.create_producer(topic, batching_enabled=False)
    batched = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10_000,
        batching_max_publish_delay_ms=3_600_000,
    )
    ledgers = set()
    for i, size in enumerate(layout):
        if size == 0:
            ledgers.add(plain.send(b"e%d" % i).ledger_id())
            continue
        ids: list[Any] = []
        for k in range(size):
            batched.send_async(b"e%d.%d" % (i, k), lambda _res, mid, out=ids: out.append(mid))
        batched.flush()
        deadline = time.monotonic() + 10
        while len(ids) < size and time.monotonic() < deadline:
            time.sleep(0.005)
        assert {(m.entry_id(), m.batch_index()) for m in ids} == {
            (first + i, k) for k in range(size)}
        ledgers.add(ids[0].ledger_id())
    plain.close()
    batched.close()
    assert len(ledgers) == 1
    return int(ledgers.pop())


def _messages(layout: list[int], entries: set[int]) -> set[tuple[int, int]]:
    """(entry, batch index) of every message of the given entries."""
    return {(e, k) for e in entries for k in (range(layout[e]) if layout[e] else [-1])}


def _drain(client: Any, topic: str, subscription: str, consumer_type: Any) -> set[tuple[int, int]]:
    c = client.subscribe(topic, subscription, consumer_type=consumer_type,
                         initial_position=pulsar.InitialPosition.Earliest)
    got = []
    try:
        # A Failover subscription's first consumer becomes active after the broker's
        # activeConsumerFailoverDelayTimeMillis (1 s): wait longer for the first message.
        wait = 5000
        while True:
            m = c.receive(wait).message_id()
            got.append((m.entry_id(), m.batch_index()))
            wait = 700
    except pulsar.Timeout:
        pass
    c.close()
    assert len(got) == len(set(got)), f"duplicates in {got}"
    return set(got)


# ------------------------------------------------------------ against real brokers


def _local(testbed: TestBed, name: str) -> str:
    """A topic on b alone (b's own namespace: nothing replicates it anywhere)."""
    return f"persistent://public/default/{name}"


def _wait_cursor(testbed: TestBed, topic: str, sub: str, md: Position,
                 individual: RangeSet) -> None:
    want = {"markDeletePosition": str(md), "individuallyDeletedMessages": str(individual)}
    deadline = time.monotonic() + 10
    got: dict[str, Any] = {}
    while time.monotonic() < deadline:
        got = testbed.internal_stats("b", topic)["cursors"].get(sub, {})
        if {k: got.get(k) for k in want} == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"cursor of {topic} {sub}: want {want}, got {got}")


@pytest.fixture(scope="module")
def client_b(testbed: TestBed) -> Any:
    return testbed.client("b")


@pytest.mark.integration
def test_individual_acks_are_exactly_the_plan(testbed: TestBed, client_b: Any,
                                              topic_name: Callable[[str], str]) -> None:
    topic = _local(testbed, topic_name())
    n = len(LAYOUT)
    ledger = _produce(client_b, topic, LAYOUT)
    with PulsarEmitter(testbed.service_url("b")) as em:
        safe, after = _plan(ledger, n, 1, "[(900:3..900:5],(900:7..900:8]]")
        assert em.apply(topic, "sub", safe, cumulative=False) == EmitResult(5, None, 5)
        assert _acked_entries(after, n) == {0, 1, 4, 5, 8}
        _wait_cursor(testbed, topic, "sub", after.mark_delete, after.individually_deleted)
        # The next sync: more acked on the source; only what is new goes out.
        safe2, after2 = _plan(ledger, n, 1, "[(900:1..900:5],(900:7..900:8],(900:9..900:10]]",
                              target=after)
        assert em.apply(topic, "sub", safe2, cumulative=False) == EmitResult(3, None, 3)
        _wait_cursor(testbed, topic, "sub", after2.mark_delete, after2.individually_deleted)
    rest = set(range(n)) - _acked_entries(after2, n)
    assert _drain(client_b, topic, "sub", pulsar.ConsumerType.Shared) == _messages(LAYOUT, rest)


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["Exclusive", "Failover"])
def test_cumulative_where_the_subscription_type_allows(
        testbed: TestBed, client_b: Any, topic_name: Callable[[str], str],
        kind: SubscriptionType) -> None:
    topic = _local(testbed, topic_name())
    n = len(LAYOUT)
    ledger = _produce(client_b, topic, LAYOUT)
    with PulsarEmitter(testbed.service_url("b"), subscription_type=kind) as em:
        # markDelete on entry 6, then 8 and 9 acked individually.
        safe, after = _plan(ledger, n, 6, "[(900:7..900:9]]")
        assert em.apply(topic, "sub", safe, cumulative=True) == EmitResult(
            3, Position(ledger, 6), 2)
        _wait_cursor(testbed, topic, "sub", after.mark_delete, after.individually_deleted)
    rest = set(range(n)) - _acked_entries(after, n)
    assert rest == {7, 10, 11}
    assert _drain(client_b, topic, "sub", getattr(pulsar.ConsumerType, kind)) == _messages(
        LAYOUT, rest)


@pytest.mark.integration
def test_partitions_are_acked_each_with_its_own_plan(
        testbed: TestBed, client_b: Any, topic_name: Callable[[str], str]) -> None:
    name = topic_name()
    parts = testbed.create_topic(name, 2)
    n = 6
    plans = {0: (1, "[(900:2..900:4]]"), 1: (-1, "[(900:0..900:1],(900:4..900:5]]")}
    with PulsarEmitter(testbed.service_url("b")) as em:
        # Both consumers opened at once, ahead of their acks; the acks go through them.
        em.open_consumers([(topic, "sub") for topic in parts])
        for topic in parts:
            stats = testbed.admin_call("b", "GET", TopicName.parse(topic).admin_path("stats"),
                                       ok=(200,))
            assert len(stats["subscriptions"]["sub"]["consumers"]) == 1, topic
        for i, topic in enumerate(parts):
            ledger = _produce(client_b, topic, [0, 2, 0, 0, 3, 0])
            safe, after = _plan(ledger, n, plans[i][0], plans[i][1])
            em.apply(topic, "sub", safe, cumulative=False)
            _wait_cursor(testbed, topic, "sub", after.mark_delete, after.individually_deleted)
            stats = testbed.admin_call("b", "GET", TopicName.parse(topic).admin_path("stats"),
                                       ok=(200,))
            assert len(stats["subscriptions"]["sub"]["consumers"]) == 1, topic
        with pytest.raises(ConfigError, match="partitioned topic"):
            em.apply(testbed.topic(name), "sub", safe, cumulative=False)


@pytest.mark.integration
def test_exclusive_subscription_held_by_another_consumer(
        testbed: TestBed, client_b: Any, topic_name: Callable[[str], str]) -> None:
    topic = _local(testbed, topic_name())
    _produce(client_b, topic, [0, 0])
    holder = client_b.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    try:
        em = PulsarEmitter(ClientSettings(testbed.service_url("b"), operation_timeout_s=2),
                           subscription_type="Exclusive")
        safe, _ = _plan(0, 2, 1)
        em.open_consumers([(topic, "sub")])  # fails quietly: apply says why
        with pytest.raises(SubscriptionBusyError, match=f"{topic} subscription 'sub'") as err:
            em.apply(topic, "sub", safe, cumulative=True)
        assert "must be stopped" in str(err.value)
        em.close()
    finally:
        holder.close()


@pytest.mark.integration
def test_a_topic_missing_on_the_target_is_named(testbed: TestBed,
                                                topic_name: Callable[[str], str]) -> None:
    """With auto-creation off for the namespace, subscribing to a missing topic fails."""
    name = topic_name()
    testbed.admin_call("b", "PUT", "/admin/v2/namespaces/public/no-auto-creation")
    testbed.admin_call("b", "POST", "/admin/v2/namespaces/public/no-auto-creation/"
                       "autoTopicCreation", json={"allowAutoTopicCreation": False})
    with PulsarEmitter(testbed.service_url("b")) as em:
        topic = f"persistent://public/no-auto-creation/{name}"
        safe, _ = _plan(0, 2, 1)
        with pytest.raises(EmitTopicNotFoundError, match=name):
            em.apply(topic, "sub", safe, cumulative=False)
