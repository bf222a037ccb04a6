"""Reading target batches for the emitter's index acks.

A batch-index ack must go through an id a client delivered: only such an id carries its
batch's acker. The batches are read by a consumer of a subscription of the emitter's own
(:data:`BATCH_READER_SUBSCRIPTION`), never by a Reader, which acks the first message of
every batch it delivers on that acker (pinned in
``tests/integration/pulsar/test_index_acks.py``).
"""

from __future__ import annotations

from typing import Any

import pulsar

from cursorsync.core.positions import Position
from cursorsync.pulsar.msgid import batch_size_of

#: The subscription the emitter reads target batches with, made for one call at a time and
#: removed after it (``cursorsync retire`` removes one a killed process left).
BATCH_READER_SUBSCRIPTION = "cursorsync-batches"
#: Batches this many entries apart or nearer are read on without a seek.
READ_AHEAD = 64
#: Milliseconds the batch reader may take for the next message of a batch.
READ_TIMEOUT_MS = 5000


def open_batch_reader(client: Any, topic: str, consumer_name: str) -> Any:
    """A consumer of :data:`BATCH_READER_SUBSCRIPTION` on ``topic`` (the caller seeks it to
    each batch and unsubscribes it after)."""
    return client.subscribe(topic, BATCH_READER_SUBSCRIPTION,
                            consumer_type=pulsar.ConsumerType.Exclusive,
                            receiver_queue_size=READ_AHEAD, consumer_name=consumer_name,
                            initial_position=pulsar.InitialPosition.Latest)


def read_batch(reader: Any, at: Position, pending: list[Any]) -> tuple[list[Any], list[Any]]:
    """The messages of the entry ``at`` as ``reader`` delivers them, in batch order, and
    what it delivered past them. Empty when the entry is not there (the reader is past
    it, or has nothing more); as many as its batch holds, by the ids' own batch size."""
    got: list[Any] = []
    queue = list(pending)
    while True:
        if queue:
            m = queue.pop(0)
        else:
            try:
                m = reader.receive(READ_TIMEOUT_MS)
            except pulsar.Timeout:
                return got, []
        mid = m.message_id()
        here = Position(mid.ledger_id(), mid.entry_id())
        if here < at:
            continue
        if here > at:
            return got, [m, *queue]
        got.append(m)
        if len(got) >= (batch_size_of(mid) or 1):
            return got, queue
