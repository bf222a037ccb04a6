"""A sync batch's target cursors read on the real test bed: one request per topic, and the
bench's admin client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest

from cursorsync.core.cursor import CursorState
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.mapping.hole_check import AdminHoleCheck
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.sync.target_reads import AdminTargets
from cursorsync_devtools.testbed import TestBed


def _targets_scene(bed: TestBed, topic_name: Callable[[str], str],
                   ) -> tuple[str, str, str]:
    """On b: a topic with subscriptions x (a hole at its second message) and y, a
    2-partition topic with x on partition 1, and the name of a topic b does not have."""
    one = bed.topic(topic_name("targets-one"))
    bed.create_topic(one)
    two = bed.create_topic(topic_name("targets-two"), partitions=2)[1]
    client = bed.client("b")
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
    return one, two, bed.topic(topic_name("targets-missing"))


@pytest.mark.integration
def test_a_batch_s_targets_on_the_bed_one_request_per_topic(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Two subscriptions of one topic, one of a partition of another, a subscription the
    target does not have, and a topic it does not have: one internalStats request per
    topic that exists, each cursor as the broker shows it."""
    one, two, missing = _targets_scene(testbed, topic_name)
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
def test_with_the_plugin_one_request_reads_what_internal_stats_would(
        index_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """``spark.cursor_digests``: the target brokers' plugin answers for the topics it
    serves with both their cursors, in one request per broker; the partition without
    subscription "none" and the missing topic are read on their own. Every cursor equals
    what internalStats alone gives, ledgers included."""
    bed = index_testbed
    one, two, missing = _targets_scene(bed, topic_name)
    pairs = [(one, "x"), (one, "y"), (two, "x"), (two, "none"), (missing, "x")]
    with AdminClient(AdminSettings.from_urls(bed.admin_url("b"), cluster="b")) as admin:
        plain = AdminTargets(admin).many(pairs)
        targets = AdminTargets(admin, plugin=True)
        got = targets.many(pairs)
    assert targets.plugin.reads == 1
    assert targets.requests == 2  # the partition lacking "none", and the missing topic
    for pair in pairs:
        mine, theirs = got[pair], plain[pair]
        if theirs is None:
            assert mine is None, pair
            continue
        assert isinstance(mine, CursorState) and isinstance(theirs, CursorState), pair
        assert (mine.mark_delete, mine.individually_deleted) == (
            theirs.mark_delete, theirs.individually_deleted), pair
        assert mine.ledgers is not None and theirs.ledgers is not None
        assert mine.ledgers.ids.tolist() == theirs.ledgers.ids.tolist(), pair
        assert mine.ledgers.entries.tolist() == theirs.ledgers.entries.tolist(), pair
    x = got[one, "x"]
    assert isinstance(x, CursorState) and x.individually_deleted.count_entries(x.ledgers) == 2
    # The mapping's ledger lists from the plugin too (no subscription asked: every topic).
    keys = [PartitionKey(t) for t in (one, two)]  # concrete names as they are
    with AdminClient(AdminSettings.from_urls(bed.admin_url("b"), cluster="b")) as admin:
        check = AdminHoleCheck(admin, plugin=True)
        check.learn_ledgers({k: plain[t, "x"].ledgers.ids.tolist()[-1]  # type: ignore[union-attr]
                             for k, t in zip(keys, (one, two), strict=True)})
        assert check.requests_by_kind()["plugin-ledger-list"] == 1
        assert check.requests_by_kind()["ledger-list"] == 0
        for key, topic in zip(keys, (one, two), strict=True):
            ids = plain[topic, "x"].ledgers.ids.tolist()  # type: ignore[union-attr]
            assert check.ledgers_between(key, -1, ids[-1] + 1) == ids, topic


@pytest.mark.integration
@pytest.mark.slow  # a benchmark
def test_bench_admin_on_the_bed(testbed: TestBed, tmp_path: Path) -> None:
    """The benchmark reads every partition's cursor at each thread count (it raises if one
    read fails) and in one partitioned request, and polls with and without the topic stats
    first: the second reads none of the partitions nothing changed on; it places a probe
    on every partition one after another and side by side."""
    from cursorsync.pulsar.dispatch_probe import PLACE_WORKERS
    from cursorsync_devtools.bench_admin import bench_admin

    r = bench_admin(20, workers=(1, 4), repeat=2, bed=testbed, work_dir=str(tmp_path))
    assert [row["workers"] for row in r["by_workers"]] == [1, 4]
    assert all(row["seconds"] > 0 and row["requests_per_s"] > 0 for row in r["by_workers"])
    assert r["requests_per_round"] == 20 and r["partitioned_internal_stats_seconds"] > 0
    assert r["source_poll"]["every_poll"]["partitions_read"] == 20
    assert r["source_poll"]["stats_first"]["partitions_read"] == 0
    placed = r["probe_placement"]
    assert set(placed) == {"one_at_a_time", f"{PLACE_WORKERS}_at_a_time"}
    assert all(p["seconds"] > 0 for p in placed.values())
