"""A sync batch's target cursors read on the real test bed: one request per topic, and the
bench's admin client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest

from cursorsync.core.positions import Position
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.sync.target_reads import AdminTargets
from cursorsync_devtools.testbed import TestBed


@pytest.mark.integration
def test_a_batch_s_targets_on_the_bed_one_request_per_topic(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Two subscriptions of one topic, one of a partition of another, a subscription the
    target does not have, and a topic it does not have: one internalStats request per
    topic that exists, each cursor as the broker shows it."""
    one = testbed.topic(topic_name("targets-one"))
    testbed.create_topic(one)
    two = testbed.create_topic(topic_name("targets-two"), partitions=2)[1]
    client = testbed.client("b")
    for topic, sub in ((one, "x"), (one, "y"), (two, "x")):
        client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest).close()
    producer = client.create_producer(one, batching_enabled=False)
    for i in range(4):
        producer.send(f"m{i}".encode())
    producer.close()
    consumer = client.subscribe(one, "x", consumer_type=pulsar.ConsumerType.Shared)
    for _ in range(4):
        msg = consumer.receive(timeout_millis=10_000)
        if msg.data() != b"m1":
            consumer.acknowledge(msg)  # a hole: m1 stays unacked
    consumer.close()
    missing = testbed.topic(topic_name("targets-missing"))

    with AdminClient(AdminSettings.from_urls(testbed.admin_url("b"), cluster="b")) as admin:
        targets = AdminTargets(admin)
        got = targets.many([(one, "x"), (one, "y"), (two, "x"), (two, "none"),
                            (missing, "x")])
    assert targets.requests == 3  # the missing topic is asked too, and answers 404
    stats = testbed.internal_stats("b", one)["cursors"]
    x, y = got[one, "x"], got[one, "y"]
    assert x is not None and y is not None
    assert str(x.mark_delete) == stats["x"]["markDeletePosition"]
    assert x.individually_deleted.count_entries(x.ledgers) == 2  # m2 and m3 past the hole at m1
    assert str(y.mark_delete) == stats["y"]["markDeletePosition"]
    assert not y.individually_deleted
    fresh = got[two, "none"]
    assert fresh is not None and fresh.mark_delete.entry == -1  # nobody acked: fresh
    assert got[two, "x"] is not None
    assert got[missing, "x"] is None
    ledger = Position.parse(stats["x"]["markDeletePosition"]).ledger
    assert x.ledgers is not None and ledger in x.ledgers.ids.tolist()


@pytest.mark.integration
@pytest.mark.slow  # a benchmark
def test_bench_admin_on_the_bed(testbed: TestBed, tmp_path: Path) -> None:
    """The benchmark reads every partition's cursor at each thread count (it raises if one
    read fails) and in one partitioned request, and polls with and without the topic stats
    first: the second reads none of the partitions nothing changed on; it places a probe
    on every partition one after another and side by side."""
    from cursorsync_devtools.bench_admin import bench_admin

    r = bench_admin(20, workers=(1, 4), repeat=2, bed=testbed, work_dir=str(tmp_path))
    assert [row["workers"] for row in r["by_workers"]] == [1, 4]
    assert all(row["seconds"] > 0 and row["requests_per_s"] > 0 for row in r["by_workers"])
    assert r["requests_per_round"] == 20 and r["partitioned_internal_stats_seconds"] > 0
    assert r["source_poll"]["every_poll"]["partitions_read"] == 20
    assert r["source_poll"]["stats_first"]["partitions_read"] == 0
    placed = r["probe_placement"]
    assert set(placed) == {"one_at_a_time", "16_at_a_time"}
    assert all(p["seconds"] > 0 for p in placed.values())
