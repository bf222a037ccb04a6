"""The job running on the real test bed: the topics and traffic the tests give it, and
what they read of b's cursors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pulsar
import pytest

from cursorsync.app.job import run_job
from cursorsync.core.positions import Position
from cursorsync_devtools.testbed import TestBed

#: The subscription the tests sync: Shared, on both clusters.
SUB = "sync-shared"


@contextmanager
def running(config: Any) -> Iterator[None]:
    """The job as `cursorsync run` runs it, with its restarts: a query that fails on a
    broker's transient error (a topic unloaded or deleted under it) starts again from its
    checkpoint."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            run_job(config, stop_event=stop)
        except BaseException as err:  # reported below
            errors.append(err)

    thread = threading.Thread(target=main, name="cursorsync-job", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)
    assert not errors, errors


def mark_delete(bed: TestBed, cluster: str, topic: str, subscription: str) -> Position:
    return Position.parse(bed.internal_stats(cluster, topic)["cursors"][subscription][
        "markDeletePosition"])


def last_data_entry(bed: TestBed, topic: str) -> Position:
    """b's last dispatchable entry (markers after it do not count)."""
    probe = bed.client("b").subscribe(topic, "probe", receiver_queue_size=0,
                                      consumer_type=pulsar.ConsumerType.Shared)
    try:
        mid = probe.get_last_message_id()
    finally:
        probe.unsubscribe()
    return Position(mid.ledger_id(), mid.entry_id())


def shared_topic(bed: TestBed, name: str, *, partitions: int = 0) -> str:
    """A topic with the Shared subscription SUB on b from its start, as the job finds it."""
    topic = bed.topic(name)
    bed.create_topic(topic, partitions=partitions)
    bed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest).close()
    return topic


def consumer_on_a(bed: TestBed, topic: str) -> pulsar.Consumer:
    """SUB on a, at Earliest: what the tests ack with."""
    return bed.client("a").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                     initial_position=pulsar.InitialPosition.Earliest)


def send_and_ack(bed: TestBed, topic: str, consumer: pulsar.Consumer, n: int) -> None:
    """n messages sent on a, then acked by ``consumer`` with whatever else it has."""
    producer = bed.client("a").create_producer(topic, batching_enabled=False,
                                               block_if_queue_full=True)
    for i in range(n):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    producer.close()
    for _ in range(n):
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    ack_all(consumer, timeout_ms=200)


def ack_all(consumer: pulsar.Consumer, *, timeout_ms: int = 2000) -> None:
    """Ack what ``consumer`` receives until nothing comes for ``timeout_ms``."""
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return
        consumer.acknowledge(msg)


def nothing_redelivered_on_b(bed: TestBed, topic: str) -> None:
    """b's SUB has nothing left to deliver: every copy of what a acked is acked on b."""
    check = bed.client("b").subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
    try:
        with pytest.raises(pulsar.Timeout):
            check.receive(timeout_millis=2000)
    finally:
        check.close()
