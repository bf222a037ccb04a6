"""A source poll with ``cursorDigests`` on real brokers with cursorsync's plugin, when many
partitions moved: their cursors come from the plugin's stats, one request per broker,
and are what internalStats gives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.sync.cursors import PLUGIN_STATS_MIN, CursorsOptions, PulsarCursorsStreamReader
from cursorsync_devtools.testbed import TestBed

PARTITIONS = PLUGIN_STATS_MIN + 2


@pytest.mark.integration
def test_many_moved_partitions_are_read_from_the_plugin_as_internal_stats_would(
        index_testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """Every partition has acks with a hole: the first poll reads all of them from the
    plugin in one answer; the next, nothing having changed, reads none (what it kept is
    what the plugin's digests say); the rows equal a poll that reads each partition's
    internalStats."""
    bed = index_testbed
    name = topic_name("many-moved")
    bed.create_topic(name, partitions=PARTITIONS)
    client = bed.client("a")
    topic = bed.topic(name)
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(4 * PARTITIONS):
        producer.send(f"m{i}".encode())
    producer.close()
    seen: dict[str, int] = {}
    for _ in range(4 * PARTITIONS):
        msg = consumer.receive(timeout_millis=10_000)
        seen[msg.topic_name()] = seen.get(msg.topic_name(), 0) + 1
        if seen[msg.topic_name()] != 2:  # a hole: each partition's second stays unacked
            consumer.acknowledge(msg)
    consumer.close()

    def reader(state: str, **extra: str) -> PulsarCursorsStreamReader:
        return PulsarCursorsStreamReader(CursorsOptions.parse({
            "adminUrl": bed.admin_url("a"), "cluster": "a", "topics": topic,
            "subscriptions": "s", "stateDir": str(tmp_path / state), **extra}))

    def poll(r: PulsarCursorsStreamReader) -> dict[int, tuple[Any, ...]]:
        return {row[2]: row[:7] for row in r.poll()}

    polls = reader("digests", internalStatsMaxAgeMs="600000", cursorDigests="true")
    first = poll(polls)
    assert polls.plugin_reads == 1 and polls.partitions_read == PARTITIONS
    assert len(first) == PARTITIONS
    assert poll(polls) == first
    assert (polls.partitions_read, polls.partitions_unchanged) == (0, PARTITIONS)
    plain = reader("plain", internalStatsMaxAgeMs="0")
    assert poll(plain) == first
    assert all(row[5] != "[]" for row in first.values())  # the holes show
