"""The redelivery forecast's live reads on the test bed: the source cursor now against the
state the last sync used, and each entry's message count from the raw-entry endpoint.

The tables hold a last sync made by hand from a's cursor as it was (what the sync query
writes); then a consumer acks more on a, one batch in part. The forecast must count the
acks since exactly, in entries and messages, and bound the partly acked batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pulsar
import pytest

from cursorsync.app.forecast_read import forecast
from cursorsync.app.status import subscription_status
from cursorsync.core.cursor import AckPlan
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.stats import parse_internal_stats
from cursorsync.tables import open_store
from cursorsync.tables.rows import cursor_state_rows, mapping_rows, sync_progress_rows
from cursorsync_devtools.testbed import TestBed

pytestmark = pytest.mark.integration

BATCH = 4


def _acked_on_a(bed: TestBed, name: str, want: str) -> None:
    deadline = time.monotonic() + 30
    while bed.internal_stats("a", name)["cursors"]["s"]["markDeletePosition"] != want:
        assert time.monotonic() < deadline, bed.internal_stats("a", name)["cursors"]["s"]
        time.sleep(0.2)


def test_acks_since_the_last_sync_are_counted_from_the_source_now(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    bed = testbed
    name = topic_name("orders")
    topic = bed.topic(name)
    client = bed.client("a")
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_messages=BATCH,
                                      batching_max_publish_delay_ms=1000)
    for i in range(4 * BATCH):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    got = [consumer.receive(10_000) for _ in range(4 * BATCH)]
    entries = sorted({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got})
    assert len(entries) == 4, entries
    first = Position(*entries[0])
    # The last sync saw the first batch acked.
    for m in got[:BATCH]:
        consumer.acknowledge(m)
    _acked_on_a(bed, name, str(first))
    then = parse_internal_stats(topic, bed.internal_stats("a", name)).subscriptions["s"]

    store = open_store("delta-rs", str(tmp_path / "tables"))
    key = PartitionKey(topic, -1)
    clusters = {"source_cluster": "a", "target_cluster": "b"}
    now = datetime.now(tz=UTC)
    store.append("mappings", mapping_rows(key, TopicMapping(SegmentSet.of(
        [Segment(first.ledger, first.entry, 900, 0, 4)])), source_cluster="a",
        target_cluster="b", written_at=now),
        app_id="m", batch_id=0)
    store.append("cursor_states", cursor_state_rows(
        [ObservedCursor(key, "s", then.state, now)], **clusters), app_id="s", batch_id=0)
    plan = AckPlan(Position(900, 0), RangeSet(), RangeSet.parse("[(900:-1..900:0]]"),
                   Position(900, -1), 0, 0, 0, 0, "exact")  # type: ignore[arg-type]
    store.append("sync_progress", sync_progress_rows(
        [SyncRecord(key, "s", plan, 1, False, now, now)], **clusters), app_id="s", batch_id=0)

    # Since then: the third batch wholly, two messages of the second.
    for m in got[2 * BATCH:3 * BATCH] + got[BATCH:BATCH + 2]:
        consumer.acknowledge(m)
    third = Position(*entries[2])
    deadline = time.monotonic() + 30
    while bed.internal_stats("a", name)["cursors"]["s"]["individuallyDeletedMessages"] != (
            f"[({entries[1][0]}:{entries[1][1]}..{third}]]"):
        assert time.monotonic() < deadline, bed.internal_stats("a", name)["cursors"]["s"]
        time.sleep(0.2)

    rows = subscription_status(store)
    with AdminClient(AdminSettings.from_urls(bed.admin_url("a"), cluster="a")) as a, \
            AdminClient(AdminSettings.from_urls(bed.admin_url("b"), cluster="b")) as b:
        [f] = forecast(store, rows, source=a, target=b)
        [blind] = forecast(store, rows)
    consumer.close()
    assert f.source_read
    c = f.causes
    assert (c["acked_since_sync"].entries, c["acked_since_sync"].messages,
            c["acked_since_sync"].basis) == (1, BATCH, "exact")
    # Acked at the last sync and mapped: nothing unmapped, no chunk.
    assert (c["acked_unmapped"].messages, c["acked_unmapped"].basis) == (0, "exact")
    assert (c["chunks"].messages, c["chunks"].basis) == (0, "exact")
    # The second and fourth batches are unacked on a: at most 3 acked messages each.
    partial = c["partial_batches"]
    assert (partial.entries, partial.messages, partial.basis) == (2, 2 * (BATCH - 1), "bound")
    assert not blind.source_read and blind.causes["acked_since_sync"].basis == "unknown"
