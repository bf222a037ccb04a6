"""The test bed's one-request-per-topic internalStats (what the benchmarks' watchers poll)
against the per-partition request, on the real test bed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cursorsync_devtools.testbed import TestBed, TestBedError

pytestmark = pytest.mark.integration


def test_internal_stats_of_partitions_and_a_plain_topic_match_one_by_one(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    parts = testbed.create_topic(topic_name("stats-of"), partitions=3)
    (plain,) = testbed.create_topic(topic_name("stats-of-plain"))
    a = testbed.client("a")
    for i, topic in enumerate([*parts, plain]):
        consumer = a.subscribe(topic, "watched")
        producer = a.create_producer(topic, batching_enabled=False)
        for n in range(i + 2):
            producer.send(b"m%d" % n)
        msg = consumer.receive(10_000)
        consumer.acknowledge(msg)  # the first of each: cursors that differ per topic
        producer.close()
        consumer.close()
    wanted = [parts[2], plain, parts[0]]
    got = testbed.internal_stats_of("a", wanted)
    assert set(got) == set(wanted)
    sent = {parts[0]: 2, parts[2]: 4, plain: 5}
    for topic in wanted:
        assert got[topic]["entriesAddedCounter"] == sent[topic]
        one = testbed.internal_stats("a", topic)
        assert got[topic]["cursors"]["watched"]["markDeletePosition"] == (
            one["cursors"]["watched"]["markDeletePosition"])
        assert got[topic]["lastConfirmedEntry"] == one["lastConfirmedEntry"]
        assert got[topic]["entriesAddedCounter"] == one["entriesAddedCounter"]
    assert testbed.internal_stats_of("a", []) == {}
    with pytest.raises(TestBedError, match="partition-7"):
        testbed.internal_stats_of("a", [parts[0].replace("partition-0", "partition-7")])
