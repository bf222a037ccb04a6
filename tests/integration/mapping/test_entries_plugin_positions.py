"""The mapping's entries source asking cursorsync's broker plugin for every partition's last
position (option ``pluginPositions``, with ``spark.cursor_digests``), pinned against each
partition's consumer on the real test bed (Pulsar 4.0.8, the plugin loaded)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cursorsync.core.positions import Position
from cursorsync.mapping.entries_options import DEFAULT_SUBSCRIPTION
from cursorsync.mapping.entries_tasks import entries_positions
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.entries import entries_reader
from tests.support.replicated import send_with_snapshots
from tests.support.skipped_ids import delivered
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.shares("index_testbed")]


def test_the_plugin_answers_every_last_position_as_the_consumers_do(
        index_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Snapshot markers after a partition's last message, a batched entry last, a partition
    never written, one unloaded after its messages (a new ledger when it loads again): the
    plugin's positions are the consumers' (markers are never the end of a range), and every
    partition has the mapping subscription that keeps its entries."""
    bed = index_testbed
    parts = bed.create_topic(topic_name("last"), partitions=4)
    send_with_snapshots(bed.client("a"), parts[0], 3).close()
    producer = bed.client("a").create_producer(parts[2], batching_enabled=True,
                                               batching_max_publish_delay_ms=60_000)
    for i in range(5):
        producer.send_async(b"b%d" % i, None)
    producer.flush()
    producer.close()
    reloaded = bed.client("a").create_producer(parts[3], batching_enabled=False)
    reloaded.send(b"before the unload")
    reloaded.close()
    bed.admin_call("a", "PUT", TopicName.parse(parts[3]).admin_path("unload"))
    last = delivered(bed, "a", parts[0])[-1][1]
    wait_for("snapshot markers after the last message on a",
             lambda: bed.last_entry("a", parts[0]) > last, timeout_s=60)

    by_consumers = entries_reader(bed, parts)
    by_plugin = entries_reader(bed, parts, pluginPositions="true")
    try:
        expected = by_consumers.latest_positions(parts)
        assert expected[parts[0]] == last
        assert expected[parts[2]] == bed.last_entry("a", parts[2])
        # A broker lists a partition once it knows its position without reading (the
        # first request sets it working one out).
        wait_for("the plugin listing every partition",
                 lambda: len(by_plugin._plugin().read(parts)) == len(parts))
        # The partition never written to as its consumer is told: no entry (-1:-1), not
        # its empty ledger.
        assert by_plugin._plugin().read(parts) == expected
        assert expected[parts[1]] == Position(-1, -1)
        assert by_plugin.latest_positions(parts) == expected
    finally:
        by_consumers.stop()
        by_plugin.stop()
    for p in parts:
        assert DEFAULT_SUBSCRIPTION in bed.internal_stats("a", p).get("cursors", {}), p


def test_the_plugin_lists_the_ledgers_of_ranges_across_ledgers_as_internal_stats_does(
        index_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """A trigger whose ranges cross ledgers (a rolls a ledger every 60 entries) sizes them
    on each partition's ledger list: with the plugin one request per broker lists them
    all, no internalStats request made, and the sizes and admission are those of
    internalStats."""
    bed = index_testbed
    parts = bed.create_topic(topic_name("ledgers"), partitions=3)
    for i, part in enumerate(parts):
        producer = bed.client("a").create_producer(part, batching_enabled=False)
        for j in range(70 + 20 * i):
            producer.send_async(b"m%d" % j, None)
        producer.flush()
        producer.close()
    by_stats = entries_reader(bed, parts, maxRowsPerBatch="100")
    by_plugin = entries_reader(bed, parts, maxRowsPerBatch="100", pluginPositions="true")
    asked: list[str] = []
    admin = by_plugin._admin_client()
    internal_stats = admin.internal_stats
    admin.internal_stats = lambda t: asked.append(str(t)) or internal_stats(t)  # type: ignore[method-assign]
    try:
        start = {"version": 1, "positions": {}}
        wait_for("the plugin listing every partition",
                 lambda: len(by_plugin._plugin().read(parts)) == len(parts))
        expected = by_stats.latestOffset(start, by_stats.getDefaultReadLimit())
        assert by_plugin.latestOffset(start, by_plugin.getDefaultReadLimit()) == expected
        assert by_plugin._ledger_plugin is not None and by_plugin._ledger_plugin.reads == 1
        assert asked == []
        assert {t: lists for t, (_, lists) in by_plugin._ledgers.items()} == {
            t: lists for t, (_, lists) in by_stats._ledgers.items()}
        assert all(len(lists.ids) >= 2 for _, lists in by_plugin._ledgers.values())
        lo = entries_positions(start)
        hi = entries_positions(expected)
        assert sorted(p.entries for p in by_plugin.ranges(lo, hi)) == sorted(
            p.entries for p in by_stats.ranges(lo, hi))
        assert sum(p.entries or 0 for p in by_plugin.ranges(lo, hi)) == 100
    finally:
        by_stats.stop()
        by_plugin.stop()
