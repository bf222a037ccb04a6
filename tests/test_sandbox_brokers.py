"""pulsar-lite brokers: start/stop, and every broker behaviour the sandbox relies on."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pulsar_lite")

from cursorsync.pulsar.client import connect  # noqa: E402
from cursorsync.sandbox.brokers import Broker, Brokers, BrokerSpec  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with Broker(BrokerSpec("pin", tmp_path_factory.mktemp("pin"))) as b:
        yield b


@pytest.fixture(scope="module")
def client(broker: Broker) -> Iterator[Any]:
    c = connect(broker.service_url, operation_timeout_seconds=10)
    yield c
    c.close()


def _topic(name: str) -> str:
    return f"persistent://public/default/{name}-{uuid.uuid4().hex[:8]}"


def _drain(consumer: Any, timeout_ms: int = 500) -> list[Any]:
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_ms))
        except pulsar.Timeout:
            return out


def _ids(msgs: list[Any]) -> list[tuple[int, int, int, int]]:
    return [
        (m.message_id().ledger_id(), m.message_id().entry_id(), m.message_id().partition(),
         m.message_id().batch_index())
        for m in msgs
    ]


def _send_batch(producer: Any, payloads: list[bytes]) -> list[Any]:
    ids: list[Any] = []
    for p in payloads:
        producer.send_async(p, lambda res, mid: ids.append(mid))
    producer.flush()
    deadline = time.monotonic() + 10
    while len(ids) < len(payloads) and time.monotonic() < deadline:
        time.sleep(0.01)
    return ids


def _batching_producer(client: Any, topic: str) -> Any:
    return client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=10_000,
        batching_max_publish_delay_ms=3_600_000,
    )


def test_two_brokers_start_on_free_ports_and_stop(tmp_path: Path) -> None:
    with Brokers(tmp_path) as brokers:
        a, b = brokers["A"], brokers["B"]
        assert a.port != b.port
        assert a.is_running() and b.is_running()
        assert (tmp_path / "cluster-A" / "pulsar-lite.toml").read_text().count(
            "default_partitions = 0"
        ) == 1
        assert "enabled = false" in (tmp_path / "cluster-B" / "pulsar-lite.toml").read_text()
        ports = (a.port, b.port)
    assert not a.is_running() and not b.is_running()
    for port in ports:
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            pass


def test_partition_topics_carry_partition_index_and_one_ledger(client: Any) -> None:
    base = _topic("p")
    producer = client.create_producer(f"{base}-partition-2")
    sent = [producer.send(b"x") for _ in range(3)]
    # Send receipts carry no partition; received ids carry the index from the name.
    assert {m.partition() for m in sent} == {-1}
    reader = client.create_reader(f"{base}-partition-2", pulsar.MessageId.earliest)
    got = [reader.read_next(2000) for _ in range(3)]
    ids = _ids(got)
    assert [i[2] for i in ids] == [2, 2, 2]
    assert len({i[0] for i in ids}) == 1  # one ledger per topic
    assert [i[1] for i in ids] == [0, 1, 2]  # entries dense from 0
    assert client.get_topic_partitions(f"{base}-partition-2") == [f"{base}-partition-2"]
    reader.close()


def test_ledger_ids_are_per_broker_in_creation_order(client: Any) -> None:
    ledgers = []
    for _ in range(2):
        p = client.create_producer(_topic("l"))
        ledgers.append(p.send(b"x").ledger_id())
        p.close()
    assert ledgers[1] > ledgers[0]


def test_batch_ids_and_single_message_batch(client: Any) -> None:
    topic = _topic("b")
    producer = _batching_producer(client, topic)
    one = _send_batch(producer, [b"solo"])
    three = _send_batch(producer, [b"a", b"b", b"c"])
    # The C++ client keeps the batch format for a batch of one: batch index 0, not -1.
    assert [m.batch_index() for m in one] == [0]
    assert {(m.ledger_id(), m.entry_id()) for m in three} == {
        (three[0].ledger_id(), one[0].entry_id() + 1)
    }
    assert sorted(m.batch_index() for m in three) == [0, 1, 2]


def test_duplicate_producer_names_are_allowed(client: Any) -> None:
    topic = _topic("dup")
    p1 = client.create_producer(topic, producer_name="same")
    p2 = client.create_producer(topic, producer_name="same", batching_enabled=True)
    p1.send(b"1")
    assert p2.producer_name() == "same"


def test_last_message_id_of_empty_topic_is_an_error(client: Any) -> None:
    reader = client.create_reader(_topic("empty"), pulsar.MessageId.earliest)
    with pytest.raises(pulsar.UnknownError):
        reader.has_message_available()
    reader.close()


def _topic_with(client: Any, n: int) -> tuple[str, int]:
    topic = _topic("acks")
    p = client.create_producer(topic)
    ids = [p.send(b"%d" % i) for i in range(n)]
    ledger = ids[0].ledger_id()
    p.close()
    return topic, ledger


def _sub(client: Any, topic: str, name: str, **kw: Any) -> Any:
    kw.setdefault("consumer_type", pulsar.ConsumerType.Shared)
    return client.subscribe(topic, name, initial_position=pulsar.InitialPosition.Earliest, **kw)


def test_out_of_order_individual_acks(client: Any) -> None:
    topic, _ = _topic_with(client, 10)
    c = _sub(client, topic, "s")
    for m in _drain(c):
        if m.message_id().entry_id() in (0, 1, 2, 4, 5, 8):
            c.acknowledge(m)
    c.close()
    c = _sub(client, topic, "s")
    assert [m.message_id().entry_id() for m in _drain(c)] == [3, 6, 7, 9]
    c.close()


def test_cumulative_ack_and_refusal_on_shared(client: Any) -> None:
    topic, _ = _topic_with(client, 6)
    c = _sub(client, topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    msgs = _drain(c)
    c.acknowledge_cumulative(msgs[3])
    c.close()
    c = _sub(client, topic, "ex", consumer_type=pulsar.ConsumerType.Exclusive)
    assert [m.message_id().entry_id() for m in _drain(c)] == [4, 5]
    c.close()
    s = _sub(client, topic, "sh")
    msgs = _drain(s)
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        s.acknowledge_cumulative(msgs[0])
    s.close()


def test_acks_of_entries_never_dispatched_are_ignored(client: Any) -> None:
    """Real brokers apply them; pulsar-lite drops them (why B's stats come from the proxy)."""
    topic, ledger = _topic_with(client, 6)
    c = _sub(client, topic, "zq", receiver_queue_size=0)
    for e in (0, 1, 2, 4):
        c.acknowledge(pulsar.MessageId(-1, ledger, e, -1))
    time.sleep(0.3)
    c.close()
    c = _sub(client, topic, "zq")
    assert [m.message_id().entry_id() for m in _drain(c)] == [0, 1, 2, 3, 4, 5]
    c.close()


def test_acks_by_another_consumer_of_the_subscription_are_applied(client: Any) -> None:
    topic, ledger = _topic_with(client, 6)
    holder = _sub(client, topic, "s")
    assert len(_drain(holder)) == 6
    other = _sub(client, topic, "s")
    for e in (0, 1, 2):
        other.acknowledge(pulsar.MessageId(-1, ledger, e, -1))
    time.sleep(0.3)
    other.close()
    holder.close()
    c = _sub(client, topic, "s")
    assert [m.message_id().entry_id() for m in _drain(c)] == [3, 4, 5]
    c.close()


def test_batch_acks(client: Any) -> None:
    topic = _topic("ba")
    producer = _batching_producer(client, topic)
    _send_batch(producer, [b"0", b"1", b"2", b"3"])
    _send_batch(producer, [b"4", b"5"])
    # Without batch-index acks: a partly acked batch is redelivered whole.
    c = _sub(client, topic, "plain")
    msgs = _drain(c)
    for i in (0, 1, 4, 5):
        c.acknowledge(msgs[i])
    c.close()
    c = _sub(client, topic, "plain")
    assert [b for (_, _, _, b) in _ids(_drain(c))] == [0, 1, 2, 3]
    c.close()
    # With batch-index acks, pulsar-lite treats an ack of one index as an ack of the
    # whole entry (a real broker redelivers the unacked indexes).
    c = _sub(client, topic, "bia", batch_index_ack_enabled=True)
    msgs = _drain(c)
    c.acknowledge(msgs[1])
    time.sleep(0.3)
    c.close()
    c = _sub(client, topic, "bia", batch_index_ack_enabled=True)
    assert [m.data() for m in _drain(c)] == [b"4", b"5"]
    c.close()
