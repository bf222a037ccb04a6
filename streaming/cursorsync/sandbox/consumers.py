"""Consumers that record what they receive and every ack they send.

The sandbox's admin servers derive cursor stats from these records (see
:mod:`cursorsync.sandbox.state`). Use one per topic partition: pulsar-lite
knows nothing of partitioned metadata, so a partitioned topic's consumers
subscribe to ``<topic>-partition-<i>`` directly.
"""

from __future__ import annotations

from typing import Any

from cursorsync.positions import Position
from cursorsync.sandbox.state import AckEvent, ClusterState, full_topic


class RecordingConsumer:
    """Wraps a ``pulsar.Consumer``; receive/ack pass through and are recorded in ``state``."""

    def __init__(self, consumer: Any, state: ClusterState, topic: str, subscription: str) -> None:
        self._consumer = consumer
        self.state = state
        self.topic = full_topic(topic)
        self.subscription = subscription
        state.subscription(self.topic, subscription).active_consumers += 1
        self._closed = False

    @property
    def consumer(self) -> Any:
        """The wrapped pulsar consumer (acks sent through it directly are NOT recorded)."""
        return self._consumer

    def receive(self, timeout_millis: int | None = None) -> Any:
        msg = self._consumer.receive(timeout_millis)
        self.state.record_received(self.topic, self.subscription, msg.message_id())
        return msg

    def acknowledge(self, message: Any) -> AckEvent:
        """Individual ack: a whole entry, or one batch index of a batched message."""
        self._consumer.acknowledge(message)
        return self.state.record_ack(
            self.topic, self.subscription, message, cumulative=False, source="consumer"
        )

    def acknowledge_cumulative(self, message: Any) -> AckEvent:
        """Cumulative ack (Exclusive/Failover only; the broker refuses it on Shared)."""
        self._consumer.acknowledge_cumulative(message)
        return self.state.record_ack(
            self.topic, self.subscription, message, cumulative=True, source="consumer"
        )

    def negative_acknowledge(self, message: Any) -> None:
        self._consumer.negative_acknowledge(message)

    def close(self) -> None:
        """Close the consumer; acks it grouped are flushed by the client on close."""
        if self._closed:
            return
        self._closed = True
        self._consumer.close()
        self.state.subscription(self.topic, self.subscription).active_consumers -= 1

    def __enter__(self) -> RecordingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe_recording(
    client: Any,
    state: ClusterState,
    topic: str,
    subscription: str,
    **kwargs: Any,
) -> RecordingConsumer:
    """Subscribe with ``client`` and wrap; the cursor starts where the broker starts it.

    ``initial_position=Earliest`` starts before the first entry; otherwise (the
    client's default, Latest) at the topic's last entry when subscribing.
    """
    import pulsar

    name = full_topic(topic)
    state.register_topic(name)
    earliest = kwargs.get("initial_position") == pulsar.InitialPosition.Earliest
    initial: Position | None = None
    if not earliest and (name, subscription) not in state.subs:
        entries = state.log(name).refresh()
        if entries:
            initial = Position(entries[-1].ledger, entries[-1].entry)
    state.subscription(name, subscription, initial_mark_delete=initial)
    consumer = client.subscribe(name, subscription, **kwargs)
    return RecordingConsumer(consumer, state, name, subscription)
