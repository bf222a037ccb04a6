"""Batch indexes carried to the target on real brokers: a's partly acked batches (read with
cursorsync's broker plugin) become index acks on b's copies, sent by the emitter through
ids a Reader on b delivers. After the sync, a consumer on b gets exactly what a consumer
restarting on a gets: no acked message again, no unacked one missing."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pulsar
import pytest

from cursorsync.core.batches import PartialBatch
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import guard
from cursorsync.core.positions import Position
from cursorsync.core.segments import SegmentSet, TopicMapping
from cursorsync.core.translate import translate, with_index_acks
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.batch_acks import BatchAcks, fetch_batch_acks
from cursorsync.pulsar.emitter import PulsarEmitter
from cursorsync.pulsar.index_acks import BATCH_READER_SUBSCRIPTION
from cursorsync_devtools.testbed import TestBed
from tests.support.entries import send_batches

pytestmark = pytest.mark.integration

BATCH = 5
#: Per batch, the indexes a's consumer acks (None: all of them).
PATTERN: list[frozenset[int] | None] = [
    frozenset({0, 3, 4}), None, frozenset({1}), frozenset(), frozenset({2, 3}), None]


def _entries(bed: TestBed, cluster: str, topic: str, n: int) -> dict[bytes, Position]:
    """Each message's payload -> the entry it is in, read from the start."""
    reader = bed.client(cluster).create_reader(topic, pulsar.MessageId.earliest)
    out: dict[bytes, Position] = {}
    deadline = time.monotonic() + 60
    try:
        while len(out) < n and time.monotonic() < deadline:
            try:
                m = reader.read_next(2000)
            except pulsar.Timeout:
                continue
            mid = m.message_id()
            out[m.data()] = Position(mid.ledger_id(), mid.entry_id())
    finally:
        reader.close()
    assert len(out) == n, f"{cluster} holds {len(out)} of the {n} messages"
    return out


def _ask(bed: TestBed, cluster: str, topic: str) -> BatchAcks:
    with AdminClient(AdminSettings.from_urls(bed.admin_url(cluster), cluster=cluster)) as admin:
        return fetch_batch_acks(admin, topic, "s")


def _received(bed: TestBed, cluster: str, topic: str) -> list[bytes]:
    consumer = bed.client(cluster).subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                             batch_index_ack_enabled=True)
    out = []
    try:
        while True:
            out.append(consumer.receive(3000).data())
    except pulsar.Timeout:
        pass
    finally:
        consumer.close()
    return out


def _source(bed: TestBed, name: str, topic: str, want: dict[Position, frozenset[int]],
            ) -> CursorState:
    """a's cursor with its partly acked batches, once the plugin names them all."""
    deadline = time.monotonic() + 20
    while True:
        answer = _ask(bed, "a", topic)
        if answer.acked == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer.acked == want
    cursor = bed.internal_stats("a", name)["cursors"]["s"]
    state = CursorState.parse(cursor["markDeletePosition"], cursor["individuallyDeletedMessages"])
    return CursorState(state.mark_delete, state.individually_deleted,
                       batches=answer.batches)


def _produce_and_ack(bed: TestBed, topic: str) -> tuple[Any, dict[Position, frozenset[int]]]:
    client = bed.client("a")
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    send_batches(client, topic, BATCH * len(PATTERN), BATCH)
    got = [consumer.receive(10_000) for _ in range(BATCH * len(PATTERN))]
    by_entry: dict[Position, list[Any]] = {}
    for m in got:
        mid = m.message_id()
        by_entry.setdefault(Position(mid.ledger_id(), mid.entry_id()), []).append(m)
    assert [len(v) for v in by_entry.values()] == [BATCH] * len(PATTERN)
    want = {}
    for (pos, msgs), part in zip(sorted(by_entry.items()), PATTERN, strict=True):
        for m in msgs:
            if part is None or m.message_id().batch_index() in part:
                consumer.acknowledge(m)
        if part:
            want[pos] = part
    return consumer, want


def test_the_target_holds_the_sources_batch_indexes_after_the_sync(index_testbed: TestBed) -> None:
    bed, name = index_testbed, "index-acks"
    topic = bed.topic(name)
    n = BATCH * len(PATTERN)
    # The subscription on b first, as the emitter would make it: nothing acked.
    bed.client("b").subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest).close()
    consumer, want = _produce_and_ack(bed, topic)
    on_a, on_b = _entries(bed, "a", topic, n), _entries(bed, "b", topic, n)
    pairs = sorted({(on_a[k], on_b[k]) for k in on_a})
    segments = SegmentSet.from_pairs(*(np.array(v, np.int64) for v in zip(
        *((s.ledger, s.entry, t.ledger, t.entry) for s, t in pairs), strict=True)))
    mapping = TopicMapping(segments=segments)
    source = _source(bed, name, topic, want)
    cursor = bed.internal_stats("b", name)["cursors"]["s"]
    target = CursorState.parse(cursor["markDeletePosition"], cursor["individuallyDeletedMessages"])
    plan = with_index_acks(translate(source, mapping, target), source, segments, target)
    assert {a.target: a.indexes for a in plan.index_acks} == {
        segments.lookup(p): ix for p, ix in want.items()}
    with PulsarEmitter(bed.service_url("b"), batch_index_acks=True) as emitter:
        sent = emitter.apply(topic, "s", guard(plan, source, mapping, target), cumulative=False)
    assert sent.index_acks == sum(len(ix) for ix in want.values())
    # The batch reader's subscription is gone again.
    assert BATCH_READER_SUBSCRIPTION not in bed.internal_stats("b", name)["cursors"]
    deadline = time.monotonic() + 20
    while (held := _ask(bed, "b", topic).acked) != {a.target: a.indexes
                                                    for a in plan.index_acks}:
        assert time.monotonic() < deadline, f"b holds {held}"
        time.sleep(0.2)
    consumer.close()
    again_on_a = sorted(_received(bed, "a", topic))
    after_failover = sorted(_received(bed, "b", topic))
    # No acked message comes again from b, and every unacked one does.
    assert after_failover == again_on_a
    assert len(again_on_a) == n - sum(BATCH if p is None else len(p) for p in PATTERN)


def test_a_readers_ids_carry_the_first_index_of_their_batch(index_testbed: TestBed) -> None:
    """Why the emitter reads batches with a consumer: a Reader acks the first message of
    each batch it delivers on the batch's acker, so an index ack through a Reader's id takes
    index 0 with it."""
    bed, name = index_testbed, "reader-acker"
    topic = bed.topic(name)
    client = bed.client("b")
    acker = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                             receiver_queue_size=0, batch_index_ack_enabled=True,
                             initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=BATCH,
                                      batching_max_publish_delay_ms=1000)
    for i in range(BATCH):
        producer.send_async(f"r{i}".encode(), None)
    producer.flush()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    batch = [reader.read_next(10_000) for _ in range(BATCH)]
    acker.acknowledge(batch[2].message_id())
    entry = batch[0].message_id()
    deadline = time.monotonic() + 20
    while (held := _ask(bed, "b", topic).acked) != {
            Position(entry.ledger_id(), entry.entry_id()): frozenset({0, 2})}:
        assert time.monotonic() < deadline, f"b holds {held}"
        time.sleep(0.2)
    reader.close()
    acker.close()


def test_a_target_broker_that_keeps_no_batch_indexes_ignores_index_acks(
        testbed: TestBed) -> None:
    """The session's test bed keeps Pulsar 4.0's default (batch-index acknowledgement off
    in the brokers). Index acks the emitter sends there are ignored: the batch stays unacked
    and comes again whole after a failover (duplicates, never a loss), while a whole entry
    acked on the source is acked on the target as ever. The source side is given as the
    plugin reports it on a broker that keeps indexes."""
    bed, name = testbed, "index-acks-off"
    topic = bed.topic(name)
    bed.create_topic(name)
    bed.client("b").subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest).close()
    send_batches(bed.client("a"), topic, 2 * BATCH, BATCH, prefix="o")
    on_a, on_b = _entries(bed, "a", topic, 2 * BATCH), _entries(bed, "b", topic, 2 * BATCH)
    first, second = sorted(set(on_a.values()))
    assert first.ledger == second.ledger and second.entry == first.entry + 1
    pairs = sorted({(on_a[k], on_b[k]) for k in on_a})
    segments = SegmentSet.from_pairs(*(np.array(v, np.int64) for v in zip(
        *((s.ledger, s.entry, t.ledger, t.entry) for s, t in pairs), strict=True)))
    mapping = TopicMapping(segments=segments)
    # On a: indexes 0 and 3 of the first batch acked, the second batch acked whole.
    parsed = CursorState.parse(f"{first.ledger}:{first.entry - 1}",
                               f"[({first.ledger}:{first.entry}..{second.ledger}:{second.entry}]]")
    source = CursorState(parsed.mark_delete, parsed.individually_deleted,
                         batches=(PartialBatch(first, BATCH, frozenset({0, 3})),))
    cursor = bed.internal_stats("b", name)["cursors"]["s"]
    target = CursorState.parse(cursor["markDeletePosition"], cursor["individuallyDeletedMessages"])
    plan = with_index_acks(translate(source, mapping, target), source, segments, target)
    assert [(a.target, a.indexes) for a in plan.index_acks] == [
        (segments.lookup(first), frozenset({0, 3}))]
    with PulsarEmitter(bed.service_url("b"), batch_index_acks=True) as emitter:
        sent = emitter.apply(topic, "s", guard(plan, source, mapping, target), cumulative=False)
    assert sent.index_acks == 2
    # The whole entry is acked on b; the first batch stays unacked.
    copy, batch_copy = segments.lookup(second), segments.lookup(first)
    assert copy is not None and batch_copy is not None
    deadline = time.monotonic() + 20
    while True:
        cursor = bed.internal_stats("b", name)["cursors"]["s"]
        state = CursorState.parse(cursor["markDeletePosition"],
                                  cursor["individuallyDeletedMessages"])
        if state.acked().contains(copy) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert state.acked().contains(copy), cursor
    assert not state.acked().contains(batch_copy), cursor
    time.sleep(1.0)  # an index ack, had the broker kept it, would show by now
    after_failover = sorted(_received(bed, "b", topic))
    # The first batch whole, acked indexes too (the duplicates); nothing of it missing.
    assert after_failover == sorted(k for k, p in on_a.items() if p == first)
