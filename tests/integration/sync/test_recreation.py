"""A source topic deleted and created again, on the real test bed: the brokers keep a topic's
creation across an unload and draw ids upwards; a subscription first synced after its
source topic was created again halts."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.app.job import start_job
from cursorsync.core.positions import Position
from cursorsync.pulsar.admin import AdminClient, AdminSettings, TopicCreation
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.halts import read_halts
from cursorsync.tables import open_store
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failover import drain
from tests.support.job_on_bed import SUB, consumer_on_a, send_and_ack, shared_topic

# ------------------------------------------------------------------ on the real brokers


def _info(bed: TestBed, topic: str) -> dict[str, Any]:
    found: dict[str, Any] = bed.admin_call("a", "GET", TopicName.parse(topic).admin_path(
        "internal-info"))
    return found


@pytest.mark.integration
def test_the_brokers_keep_a_topics_creation_across_an_unload_and_draw_ids_upwards(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """What the rule stands on, on Pulsar 4.0.8: one ledger-id sequence for data and cursor
    ledgers; an unload keeps creationDate and the ledgers the cursors still need; deleted
    and created again, the topic has another creationDate and only ledgers above every
    old one."""
    topic = testbed.topic(topic_name("ids"))
    testbed.create_topic(topic)
    consumer = testbed.client("a").subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                             initial_position=pulsar.InitialPosition.Earliest)
    producer = testbed.client("a").create_producer(topic, batching_enabled=False)
    for i in range(70):  # a rolls its ledgers every 60 entries
        producer.send(f"m{i}".encode())
    for i in range(70):
        msg = consumer.receive(10_000)
        if i % 2:
            consumer.acknowledge(msg)
    admin = AdminClient(AdminSettings.from_urls(testbed.admin_url("a")))
    try:
        first = _until_cursor_ledger(admin, topic)
        ids = _ids(_info(testbed, topic))
        assert len(ids["data"]) >= 2 and ids["cursors"], ids
        testbed.admin_call("a", "PUT", TopicName.parse(topic).admin_path("unload"))
        producer.send(b"after the unload")
        msg = consumer.receive(10_000)
        consumer.acknowledge(msg)
        reloaded = _until_cursor_ledger(admin, topic)
        assert reloaded.created == first.created
        # The unacked entries keep the old ledgers; a new one and new cursor ledgers come.
        assert set(ids["data"]) <= set(reloaded.ledgers)
        assert max(reloaded.ledgers) > max(first.ledgers)
        consumer.close()
        producer.close()
        testbed.admin_call("a", "DELETE", TopicName.parse(topic).admin_path() + "?force=true")
        testbed.client("a").subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest).close()
        again = admin.creation(topic)
        assert again.created != first.created
        assert again.first_ledger is not None and again.first_ledger > max(reloaded.ledgers)
        stats = testbed.internal_stats("a", topic)
        assert Position.parse(stats["cursors"]["s"]["markDeletePosition"]).ledger == min(
            lg["ledgerId"] for lg in stats["ledgers"])
    finally:
        admin.close()


def _ids(info: dict[str, Any]) -> dict[str, list[int]]:
    return {"data": [lg["ledgerId"] for lg in info["ledgers"]],
            "cursors": [c["cursorsLedgerId"] for c in info["cursors"].values()
                        if c["cursorsLedgerId"] >= 0]}


def _until_cursor_ledger(admin: AdminClient, topic: str) -> TopicCreation:
    """The topic's creation once a cursor has persisted into a ledger (after its first
    acks; a cursor creates its ledger when it first persists)."""
    deadline = time.monotonic() + 30
    while True:
        found = admin.creation(topic)
        info = admin.get_json(TopicName.parse(topic).admin_path("internal-info"), "info")
        if any(c["cursorsLedgerId"] >= 0 for n, c in info["cursors"].items() if n == "s"):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no cursor ledger for s on {topic}: {info}")
        time.sleep(0.5)


@pytest.mark.integration
@pytest.mark.spark
def test_a_subscription_first_synced_after_its_source_topic_was_created_again_halts(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """a's topic holds ten messages, four acked; it is deleted and created again (with the
    subscription, three new messages acked) before the job ever synced the subscription.
    The job's first observation covers the old ledgers: their copies on b stay unacked and
    the subscription halts, with no observation before to compare with."""
    topic = shared_topic(testbed, topic_name("first-seen"))
    consumer = consumer_on_a(testbed, topic)
    producer = testbed.client("a").create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"old-{i}".encode())
    producer.close()
    for _ in range(10):
        msg = consumer.receive(timeout_millis=10_000)
        if int(msg.data().decode().split("-")[1]) < 4:
            consumer.acknowledge(msg)
    testbed.wait_replicated([topic])
    consumer.close()
    old = [lg["ledgerId"] for lg in testbed.internal_stats("a", topic)["ledgers"]]
    testbed.admin_call("a", "DELETE", TopicName.parse(topic).admin_path() + "?force=true")
    consumer = consumer_on_a(testbed, topic)
    send_and_ack(testbed, topic, consumer, 3)
    consumer.close()
    testbed.wait_replicated([topic])
    new = [lg["ledgerId"] for lg in testbed.internal_stats("a", topic)["ledgers"]]
    assert min(new) > max(old), (old, new)

    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB])
    store = open_store("delta-rs", config.tables.path)
    clusters = {"source_cluster": config.source.name, "target_cluster": config.target.name}
    job = start_job(config)
    try:
        deadline = time.monotonic() + 120
        while not any(k[1] == SUB for k in read_halts(store, **clusters)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        job.wait_batches(2, timeout_s=60)
    finally:
        job.stop()
    got = sorted(m.data().decode() for m in drain(testbed, topic, SUB, "Shared"))
    # The six never acked on a are there, none lost (and, a defect rather than a loss, the
    # four acked before the deletion and the three after: the halt sent nothing).
    assert {f"old-{i}" for i in range(4, 10)} <= set(got), got
    assert any(k[1] == SUB for k in read_halts(store, **clusters)), "the subscription did not halt"
    cursor = testbed.internal_stats("b", topic)["cursors"][SUB]
    assert cursor["individuallyDeletedMessages"] == "[]", cursor
