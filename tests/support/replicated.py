"""A replicated subscription on the real test bed: messages sent so that the brokers write
snapshot markers between them, and what a reader on b sees of them."""

from __future__ import annotations

import time
from typing import Any

import pulsar

from cursorsync.core.positions import Position
from cursorsync_devtools.testbed import TestBed

#: The property a's replicator stamps on each copy it writes to b: the source position.
STAMP = "__MSG_PROP_REPL_SOURCE_POSITION"
#: Brokers take a snapshot while there is new traffic, every 1 s: messages this far apart
#: have snapshot markers between them.
SNAPSHOT_GAP_S = 1.2


def send_with_snapshots(client: Any, topic: str, count: int, *, subscription: str = "rs",
                        ) -> Any:
    """A replicated Shared subscription on ``client``'s cluster (from the earliest message),
    then ``count`` messages (``m0``, ``m1``, ...) sent SNAPSHOT_GAP_S apart; returns the
    subscription's consumer."""
    consumer = client.subscribe(topic, subscription, replicate_subscription_state_enabled=True,
                                consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send(b"m%d" % i)
        time.sleep(SNAPSHOT_GAP_S)
    producer.close()
    return consumer


def source_positions_on_b(bed: TestBed, topic: str) -> dict[Position, Position]:
    """Each message a reader on b returns, in order: its position on b -> its position on a
    (the replicator's stamp)."""
    reader = bed.client("b").create_reader(topic, pulsar.MessageId.earliest)
    out = {}
    try:
        while reader.has_message_available():
            m = reader.read_next(10_000)
            mid = m.message_id()
            out[Position(mid.ledger_id(), mid.entry_id())] = Position.parse(m.properties()[STAMP])
    finally:
        reader.close()
    return out
