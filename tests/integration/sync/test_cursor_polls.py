"""The cursor poll's pre-check on real Pulsar: a topic's stats fingerprint moves with every
kind of cursor change (so a partition whose fingerprint stands still may keep the cursor
rows read before), and ``pulsar-cursors`` reads internalStats only of the partitions whose
fingerprint moved (in Spark too: tests/integration/mapping/test_sources_in_spark.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.topic_stats import Fingerprint, fingerprint
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.cursors import CursorsOptions, PulsarCursorsStreamReader
from cursorsync_devtools.testbed import TestBed
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

SUB = "polled"


def _print(admin: AdminClient, topic: str, subs: tuple[str, ...] | None = (SUB,)
           ) -> Fingerprint:
    fp = fingerprint(topic, admin.topic_stats(topic), subs)
    assert fp is not None, admin.topic_stats(topic)
    return fp


def _md(bed: TestBed, topic: str) -> str:
    return str(bed.internal_stats("a", topic)["cursors"][SUB]["markDeletePosition"])


def test_the_stats_fingerprint_moves_with_every_cursor_change(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    topic = testbed.topic(topic_name("fingerprint"))
    testbed.create_topic(topic)
    client = testbed.client("a")
    consumer = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("a"), cluster="a")) as admin:
        last = [_print(admin, topic)]

        def moves(what: str) -> None:
            wait_for(f"the fingerprint moves: {what}",
                     lambda: _print(admin, topic) != last[0], 10)
            time.sleep(0.5)  # the rest of the change lands too
            last[0] = _print(admin, topic)

        time.sleep(1.5)
        assert _print(admin, topic) == last[0], "it stands still while nothing happens"
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            producer.send(f"m{i}".encode())
        moves("messages added")
        got = {m.data().decode(): m for m in (consumer.receive(10_000) for _ in range(10))}
        time.sleep(1)
        assert _print(admin, topic) == last[0], "delivered, not acked: no cursor change"
        md = _md(testbed, topic)
        consumer.acknowledge(got["m3"])
        moves("an ack that leaves a hole")
        assert _md(testbed, topic) == md  # the markDeletePosition did not move
        consumer.acknowledge(got["m4"])
        moves("an ack that extends the same range")
        consumer.acknowledge(got["m7"])
        moves("an ack that opens a second range")
        for m in ("m0", "m1", "m2"):
            consumer.acknowledge(got[m])
        moves("acks that move the markDeletePosition over the first range")
        assert _md(testbed, topic) != md
        consumer.close()
        path = TopicName.parse(topic).admin_path(f"subscription/{SUB}")
        testbed.admin_call("a", "POST", path + "/resetcursor/0")
        moves("a reset back to the start")
        testbed.admin_call("a", "POST", path + "/skip/2")
        moves("an admin skip")
        client.subscribe(topic, "another", consumer_type=pulsar.ConsumerType.Shared).close()
        assert _print(admin, topic) == last[0], "a subscription not wanted changes nothing"
        assert _print(admin, topic, None) != _print(admin, topic, (SUB,))  # every one
        producer.close()


def test_the_polled_stats_leave_out_producers_and_consumers_not_the_counters(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    topic = testbed.topic(topic_name("lean-stats"))
    testbed.create_topic(topic)
    client = testbed.client("a")
    consumers = [client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                  initial_position=pulsar.InitialPosition.Earliest)
                 for _ in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(6):
        producer.send(f"m{i}".encode())
    consumers[0].acknowledge(consumers[0].receive(10_000))
    time.sleep(1)  # the ack's counters land
    full = testbed.admin_call("a", "GET", TopicName.parse(topic).admin_path("stats")
                              + "?getPreciseBacklog=false&subscriptionBacklogSize=false"
                              "&getEarliestTimeInBacklog=false")
    assert full["publishers"] and full["subscriptions"][SUB]["consumers"]  # there to leave out
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("a"), cluster="a")) as admin:
        lean = admin.topic_stats(topic)
    assert not lean.get("publishers") and not lean["subscriptions"][SUB].get("consumers")
    assert lean["subscriptions"][SUB]["lastAckedTimestamp"] > 0  # summed over the consumers
    assert fingerprint(topic, lean, (SUB,)) == fingerprint(topic, full, (SUB,))
    producer.close()
    for c in consumers:
        c.close()


def _reader(bed: TestBed, topic: str, tmp_path: Path, **extra: str) -> PulsarCursorsStreamReader:
    opts = {"adminUrl": bed.admin_url("a"), "cluster": "a", "topics": topic,
            "subscriptions": SUB, "stateDir": str(tmp_path), **extra}
    return PulsarCursorsStreamReader(CursorsOptions.parse(opts))


def _poll(reader: PulsarCursorsStreamReader) -> dict[int, tuple[Any, ...]]:
    return {r[2]: r for r in reader.poll()}


def test_only_partitions_whose_stats_moved_are_read(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    topic = testbed.topic(topic_name("polled"))
    parts = testbed.create_topic(topic, partitions=4)
    client = testbed.client("a")
    client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared).close()
    producer = client.create_producer(parts[2], batching_enabled=False)
    for i in range(5):
        producer.send(f"m{i}".encode())
    producer.close()
    consumer = client.subscribe(parts[2], SUB, consumer_type=pulsar.ConsumerType.Shared)
    got = [consumer.receive(10_000) for _ in range(5)]
    consumer.acknowledge(got[0])
    wait_for("the first ack", lambda: _md(testbed, parts[2]).endswith(":0"), 10)

    reader = _reader(testbed, topic, tmp_path, internalStatsMaxAgeMs="600000")
    first = _poll(reader)
    assert reader.partitions_read == 4 and sorted(first) == [0, 1, 2, 3]
    second = _poll(reader)
    assert (reader.partitions_read, reader.partitions_unchanged) == (0, 4)
    # The rows as read, observed when they were read, checked by this poll.
    assert {p: r[:9] for p, r in second.items()} == {p: r[:9] for p, r in first.items()}
    assert all(first[p][9] == first[p][7] < second[p][9] for p in first)
    consumer.acknowledge(got[3])  # a hole: only the ranges of partition 2 change
    wait_for("the hole in the cursor", lambda: testbed.internal_stats("a", parts[2])[
        "cursors"][SUB]["individuallyDeletedMessages"] != "[]", 10)
    third = _poll(reader)
    assert (reader.partitions_read, reader.partitions_unchanged) == (1, 3)
    assert third[2][5] != first[2][5] and third[2][4] == first[2][4]
    assert all(third[p][:7] == first[p][:7] for p in (0, 1, 3))
    consumer.close()
    # Past the maximum age, every partition is read again whatever its stats say.
    later = reader.clock() + 601
    reader.clock = lambda: later
    _poll(reader)
    assert reader.partitions_read == 4
    # The same rows as a poll with the pre-check off.
    plain = _reader(testbed, topic, tmp_path / "plain", internalStatsMaxAgeMs="0")
    assert {p: r[:7] for p, r in _poll(plain).items()} == {
        p: r[:7] for p, r in _poll(reader).items()}

