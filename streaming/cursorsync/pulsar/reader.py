"""A pulsar Reader that is opened again when it stalls.

Seen with pulsar-lite (about one read in ten of a 2,800-message topic with a
1,000-message queue, once the client ran at full speed): the broker logs
every remaining entry as sent, yet the Reader never delivers them; the
broker answers ``has_message_available`` True and nothing arrives, ever. A
fresh Reader from the last entry delivered reads on. So a Reader that has
delivered nothing for ``stall_ms`` while the broker says more is there (or
in the middle of a batch, where ``has_message_available`` cannot be trusted)
is closed and opened again just past the last entry it delivered.

One cause, found in pulsar-lite's debug log: the pulsar client's Reader acks
cumulatively what it reads, and when its ack of entry X reaches the broker
while it dispatches X+1, the broker takes X+1 for acked ("Acked tracked
message"), does not send it, and dispatches nothing more until the client
grants permits again. A reader whose queue holds its whole range makes no
further grant, so only a reopen ends such a stall.

A broker that is slow rather than stuck (a first read from tiered storage
can take seconds) must not be reopened for ever, each reopen starting its
read again: after every reopen that brings nothing, the wait before the next
doubles (up to ``MAX_STALL_MS``), and it is back to ``stall_ms`` once a
message arrives.

What the caller sees: messages again from that entry on. Opened at
``L:E:-1`` exclusive, a Reader re-delivers entry L:E when it is a batch and
starts after it otherwise, so a caller must drop messages it has already
seen by position, as every reader loop here does: the order never goes back
before the last entry delivered.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from cursorsync.pulsar.msgid import batch_size_of
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)

#: Nothing delivered for this long while more is there: the Reader has stalled.
DEFAULT_STALL_MS = 2000
#: The longest wait before a reopen, after reopens that brought nothing.
MAX_STALL_MS = 60_000


class ResumingReader:
    """``read_next``/``has_message_available``/``close`` of a pulsar Reader, reopened on a
    stall; ``reopened`` counts how often."""

    def __init__(self, client: Any, topic: str, start: Any, *, receiver_queue_size: int = 1000,
                 stall_ms: int = DEFAULT_STALL_MS) -> None:
        self._client = client
        self.topic = topic
        self._start = start
        self._partition = TopicName.parse(topic).partition  # of the ids to reopen at
        self._queue = receiver_queue_size
        self.stall_ms = stall_ms
        self._last: Any = None  # the last message delivered
        self._idle_ms = 0  # waited since then (or since the last reopen or stall check)
        self._patience = stall_ms  # idle time that counts as a stall, doubled per reopen
        self.reopened = 0
        self._reader = self._open(start)

    def _open(self, start: Any) -> Any:
        return self._client.create_reader(self.topic, start, receiver_queue_size=self._queue)

    def read_next(self, timeout_ms: int) -> Any:
        """The next message, or ``pulsar.Timeout`` after ``timeout_ms`` with none; a stall
        inside that time is resolved by reopening. No clock is read per message: this
        runs for every message the entries source reads."""
        import pulsar

        left = timeout_ms
        while True:
            wait = min(left, self._patience - self._idle_ms)
            try:
                msg = self._reader.read_next(max(1, wait))
            except pulsar.Timeout:
                left -= wait
                self._idle_ms += wait
                if self._idle_ms >= self._patience:
                    if self._stalled():
                        self._reopen()
                        self._patience = min(2 * self._patience, MAX_STALL_MS)
                    self._idle_ms = 0  # stalled or idle: look again a while later
                if left <= 0:
                    raise
                continue
            self._last = msg
            self._idle_ms = 0
            self._patience = self.stall_ms
            return msg

    def _last_id(self) -> Any:
        return None if self._last is None else self._last.message_id()

    def has_message_available(self) -> bool:
        return bool(self._reader.has_message_available())

    def _stalled(self) -> bool:
        import pulsar

        last = self._last_id()
        if last is not None and last.batch_index() >= 0:
            size = batch_size_of(last)
            if size is not None and last.batch_index() < size - 1:
                return True  # the rest of a batch arrives with it: it is overdue
        try:
            return bool(self._reader.has_message_available())
        except pulsar.PulsarException:
            return False  # cannot tell (pulsar-lite errors on an empty topic): keep waiting

    def _reopen(self) -> None:
        import pulsar

        last = self._last_id()
        start = (self._start if last is None
                 else pulsar.MessageId(self._partition, last.ledger_id(), last.entry_id(), -1))
        log.warning("reader of %s stalled %d ms after %s with more available; reopening it",
                    self.topic, self.stall_ms,
                    "its start" if last is None else f"{last.ledger_id()}:{last.entry_id()}")
        with contextlib.suppress(pulsar.PulsarException):  # it is being replaced anyway
            self._reader.close()
        self._reader = self._open(start)
        self.reopened += 1

    def close(self) -> None:
        self._reader.close()
