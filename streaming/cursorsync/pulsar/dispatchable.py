"""Whether a topic partition holds an entry past a position that a consumer could receive,
asked of its broker in one round trip.

A broker answers a consumer's GetLastMessageId with its last *dispatchable* position
(Pulsar 4.0, ``PersistentTopic.getLastDispatchablePosition``): from the last confirmed
entry (with transactions, the max read position) backwards past markers and aborted
transactions' messages, kept up to date as messages that are not markers are written. A
reader started at the entry after ``after`` and asked whether a message is available
compares that answer with its start. No means every entry the partition holds past
``after`` is a marker or an aborted transaction's message: none of them is ever delivered
to a consumer or sent by a replicator as data. A chunk, a delayed message or an open
transaction's message counts as dispatchable, so it always gives yes.
"""

from __future__ import annotations

import threading
from typing import Any

from cursorsync.core.positions import Position
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.topics import TopicName


class DispatchableTail:
    """Asks a cluster's brokers whether a partition holds a dispatchable entry past a
    position (the sync step's tail check, on the source). Thread-safe: checks of different
    partitions run at once on one client."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._lock = threading.Lock()
        #: Checks made (each a reader opened, one GetLastMessageId, the reader closed).
        self.checks = 0

    def nothing_dispatchable_after(self, topic: str, after: Position) -> bool:
        """True when every entry of the concrete ``topic`` past ``after`` (a stored entry) is
        one no consumer ever receives; False when one may be received."""
        import pulsar

        name = TopicName.parse(topic)
        start = pulsar.MessageId(name.partition, after.ledger, after.entry + 1, -1)
        try:
            reader = self._connected().create_reader(
                topic, start, start_message_id_inclusive=True, receiver_queue_size=1)
            try:
                available = reader.has_message_available()
            finally:
                reader.close()
        except pulsar.PulsarException as err:
            raise CursorSyncError(
                f"cannot ask the brokers of {self.settings.service_url} for the last "
                f"dispatchable entry of {topic}: {err}") from err
        with self._lock:
            self.checks += 1
        return not available

    def _connected(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self.settings.connect()
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


__all__ = ["DispatchableTail"]
