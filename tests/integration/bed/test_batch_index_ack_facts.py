"""What Pulsar 4.0.8 shows of a partially acked batch, with batch-index acknowledgement on in
the broker (``acknowledgmentAtBatchIndexLevelEnabled``, the default from 4.1): the redelivery
forecast rests on it.

The broker keeps the acked indexes (a consumer that reconnects gets only the rest), but no
statistic names them: internalStats shows the entry unacked, with nothing about its
indexes, and the subscription's stats carry no field for them. So cursorsync, reading
entries, can only bound what a partially acked batch redelivers after a failover. The
raw-entry endpoint gives each entry's message count, which the forecast reads.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed, TestBedConfig

# A test bed of its own (batch-index acks on): facts for the forecast and issue 38, kept out
# of the default run for CI's time (CURSORSYNC_SLOW=1 runs them).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

BATCH = 5


@pytest.fixture(scope="module")
def batch_index_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    on = {"acknowledgmentAtBatchIndexLevelEnabled": "true"}
    config = TestBedConfig(work_dir=tmp_path_factory.mktemp("batch-index"),
                           settings={"a": on, "b": on})
    with TestBed(config) as bed:
        yield bed


def _two_batches(bed: TestBed, name: str, *, index_acks: bool) -> tuple[Any, list[Any]]:
    """Two batches of BATCH on a; every message received, 2 of the first batch and all of
    the second acked. Returns the consumer (still open) and the messages."""
    client = bed.client("a")
    topic = bed.topic(name)
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=index_acks)
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_messages=BATCH,
                                      batching_max_publish_delay_ms=500)
    for i in range(2 * BATCH):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    got = [consumer.receive(10_000) for _ in range(2 * BATCH)]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 2
    for m in got[:2] + got[BATCH:]:
        consumer.acknowledge(m)
    return consumer, got


def _cursor_settled(bed: TestBed, name: str, want: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        cursor: dict[str, Any] = bed.internal_stats("a", name)["cursors"]["s"]
        if cursor["individuallyDeletedMessages"] == want or time.monotonic() > deadline:
            return cursor
        time.sleep(0.2)


def _redelivered(bed: TestBed, name: str, *, index_acks: bool) -> list[int]:
    consumer = bed.client("a").subscribe(bed.topic(name), "s",
                                         consumer_type=pulsar.ConsumerType.Shared,
                                         batch_index_ack_enabled=index_acks)
    out = []
    try:
        while True:
            out.append(consumer.receive(3000).message_id().batch_index())
    except pulsar.Timeout:
        pass
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("index_acks", [True, False])
def test_a_partially_acked_batch_is_an_unacked_entry_in_every_statistic(
        batch_index_bed: TestBed, index_acks: bool) -> None:
    bed = batch_index_bed
    name = f"partly-acked-{int(index_acks)}"
    consumer, got = _two_batches(bed, name, index_acks=index_acks)
    first = got[0].message_id()
    ledger, entry = first.ledger_id(), first.entry_id()
    cursor = _cursor_settled(bed, name, f"[({ledger}:{entry}..{ledger}:{entry + 1}]]")
    # The first batch's entry is unacked, the second's acked; nothing names acked indexes.
    assert cursor["markDeletePosition"] == f"{ledger}:{entry - 1}"
    assert cursor["individuallyDeletedMessages"] == f"[({ledger}:{entry}..{ledger}:{entry + 1}]]"
    assert not [k for k in cursor if "batch" in k.lower() or "ackset" in k.lower()], cursor
    stats = bed.admin_call("a", "GET", TopicName.parse(bed.topic(name)).admin_path("stats"),
                           ok=(200,))["subscriptions"]["s"]
    assert stats["msgBacklog"] == 1  # entries
    assert not [k for k in stats if "batchindex" in k.lower() or "ackset" in k.lower()], stats
    consumer.close()
    # The broker kept the acked indexes when the client sent them: only the rest comes again.
    again = _redelivered(bed, name, index_acks=index_acks)
    assert again == ([2, 3, 4] if index_acks else [0, 1, 2, 3, 4])
    # The raw entry says how many messages the batch holds.
    with AdminClient(AdminSettings.from_urls(bed.admin_url("a"), cluster="a")) as admin:
        raw = admin.raw_entry(bed.topic(name), ledger, entry)
    assert raw is not None and raw.messages == BATCH and raw.chunk_id is None


def test_an_unbatched_entry_holds_one_message(batch_index_bed: TestBed,
                                              tmp_path: Path) -> None:
    bed = batch_index_bed
    topic = bed.topic("unbatched")
    producer = bed.client("a").create_producer(topic, batching_enabled=False)
    mid = producer.send(b"one")
    with AdminClient(AdminSettings.from_urls(bed.admin_url("a"), cluster="a")) as admin:
        raw = admin.raw_entry(topic, mid.ledger_id(), mid.entry_id())
    assert raw is not None and raw.messages == 1


@pytest.mark.parametrize("how", ["constructed", "deserialized"])
def test_the_python_client_acks_a_whole_entry_for_an_id_it_did_not_deliver(
        batch_index_bed: TestBed, how: str) -> None:
    """Only an id the client delivered (its batch's acker attached) acks one batch index.
    An id built from numbers, or read back from bytes, is acked as its whole entry, batch
    index or not, with batch-index acknowledgement on in the broker and the consumer: so
    cursorsync's emitter acks whole entries only, and exact batches on the target cannot
    go through pulsar-client."""
    bed = batch_index_bed
    name = f"whole-entry-{how}"
    consumer, got = _two_batches(bed, name, index_acks=True)
    first = got[0].message_id()
    ledger, entry = first.ledger_id(), first.entry_id()
    # Index 2 of the first batch, which the consumer above left unacked (with 3 and 4).
    built = pulsar.MessageId(first.partition(), ledger, entry, 2)
    if how == "deserialized":
        built = pulsar.MessageId.deserialize(got[2].message_id().serialize())
    assert (built.ledger_id(), built.entry_id(), built.batch_index()) == (ledger, entry, 2)
    consumer.acknowledge(built)
    whole = f"{ledger}:{entry + 1}"  # both entries acked whole
    deadline = time.monotonic() + 30
    while True:
        cursor = bed.internal_stats("a", name)["cursors"]["s"]
        if cursor["markDeletePosition"] == whole or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (cursor["markDeletePosition"], cursor["individuallyDeletedMessages"]) == (whole, "[]")
    consumer.close()
    assert _redelivered(bed, name, index_acks=True) == []  # 3 and 4 with them
