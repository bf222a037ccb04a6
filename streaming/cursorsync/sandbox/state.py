"""What the sandbox knows about each cluster: topics, their entries, and recorded acks.

pulsar-lite has no admin API, so the sandbox's admin servers derive every
stat from two honest sources:

- **entries** are read back from the broker with a non-durable Reader
  (:class:`TopicLog`): ledger id, entry id and batch size of every entry, as
  any client sees them. Readers do not create subscriptions, so they do not
  show up as cursors (real brokers do not list non-durable cursors in
  internalStats either).
- **acks** are recorded as they are sent (:class:`AckBook`): by the
  :class:`~cursorsync.sandbox.consumers.RecordingConsumer` wrappers the
  workload uses, by :meth:`AckBook.record_ack` for anyone else, and on B by
  the ack-sniffing proxy in front of the broker. They are folded with the
  broker's rules (:func:`cursorsync.ranges.fold`): a batched entry counts as
  acked only when all its messages are acked (PIP-54 state is not visible in
  stats); a cumulative ack on batch index i of a batch of k acks entries
  before it and, when i < k - 1, leaves that entry partially acked.

The folded cursor is what a real broker would report for the acks sent,
which is not always what pulsar-lite itself applies: it ignores individual
acks of entries it never dispatched on the subscription, and it treats a
batch-index ack as an ack of the whole entry (both pinned by tests).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cursorsync.errors import CursorSyncError
from cursorsync.positions import MessageId, Position
from cursorsync.pulsar.msgid import batch_size_of
from cursorsync.pulsar.reader import ResumingReader
from cursorsync.ranges import Ledgers, RangeSet, fold

PARTITION_SUFFIX = "-partition-"
#: The sandbox's readers are reopened after this long without a message (see
#: cursorsync.pulsar.reader): pulsar-lite on loopback delivers in milliseconds.
STALL_MS = 500


class SandboxTopicError(CursorSyncError, KeyError):
    """A topic the sandbox was asked about is not registered on that cluster."""


def full_topic(name: str, tenant: str = "public", namespace: str = "default") -> str:
    """``orders`` -> ``persistent://public/default/orders``; full names pass through."""
    if "://" in name:
        return name
    if name.count("/") == 2:
        return f"persistent://{name}"
    return f"persistent://{tenant}/{namespace}/{name}"


def partition_topic(topic: str, index: int) -> str:
    """The topic of one partition: ``<topic>-partition-<index>``."""
    return f"{full_topic(topic)}{PARTITION_SUFFIX}{index}"


def split_partition(topic: str) -> tuple[str, int]:
    """``...x-partition-3`` -> (``...x``, 3); a plain topic -> (topic, -1)."""
    base, sep, tail = topic.rpartition(PARTITION_SUFFIX)
    if sep and tail.isdigit():
        return base, int(tail)
    return topic, -1


@dataclass(frozen=True)
class EntryInfo:
    """One entry as a reader saw it. ``batch_size`` 0 means a non-batched message."""

    ledger: int
    entry: int
    batch_size: int
    size: int
    publish_time_ms: int


@dataclass(frozen=True)
class AckEvent:
    """One ack as sent by a client (whole entry when ``batch_index`` is -1)."""

    cluster: str
    topic: str
    subscription: str
    ledger: int
    entry: int
    batch_index: int
    cumulative: bool
    at: float
    source: str


class TopicLog:
    """The entries of one topic partition, discovered by a Reader and grown on demand."""

    def __init__(self, client: Any, topic: str) -> None:
        self.topic = topic
        self._client = client
        self._reader: Any = None
        self._lock = threading.Lock()
        self._entries: list[EntryInfo] = []
        self._pending: list[Any] = []  # messages of the entry being read
        self.created_at = time.time()
        self.batch_gap_ms = 50

    def refresh(self, timeout_ms: int = 2000) -> list[EntryInfo]:
        """Read everything the broker has now; returns all entries, oldest first."""
        import pulsar

        with self._lock:
            if self._reader is None:
                self._reader = ResumingReader(
                    self._client, self.topic, pulsar.MessageId.earliest,
                    receiver_queue_size=1000, stall_ms=STALL_MS)
            while True:
                # has_message_available() can answer False in the middle of a batch (the
                # broker's last id has no batch index): a batch is read to its size.
                if self._batch_incomplete() or self._has_more():
                    self._add(self._reader.read_next(timeout_ms))
                    continue
                if self._pending and self._pending[0].message_id().batch_index() >= 0:
                    try:  # a batch of unknown size: complete once nothing more comes
                        self._add(self._reader.read_next(self.batch_gap_ms))
                        continue
                    except pulsar.Timeout:
                        pass
                break
            self._close_pending()
            return list(self._entries)

    def _batch_incomplete(self) -> bool:
        if not self._pending:
            return False
        size = batch_size_of(self._pending[0].message_id())
        return size is not None and len(self._pending) < size

    def _has_more(self) -> bool:
        import pulsar

        try:
            return bool(self._reader.has_message_available())
        except pulsar.UnknownError:
            # pulsar-lite answers GetLastMessageId on a topic with no entries with an
            # error ("Topic has no messages") instead of an empty position (pinned by a test).
            if self._entries or self._pending:
                raise
            return False

    def _add(self, msg: Any) -> None:
        mid = msg.message_id()
        pos = (mid.ledger_id(), mid.entry_id())
        if self._entries and pos <= (self._entries[-1].ledger, self._entries[-1].entry):
            return  # delivered again (a reopened reader re-delivers its last entry)
        if self._pending:
            head = self._pending[0].message_id()
            if (head.ledger_id(), head.entry_id()) != pos:
                self._close_pending()
            elif any(m.message_id().batch_index() == mid.batch_index() for m in self._pending):
                return  # part of this batch again
        self._pending.append(msg)
        if mid.batch_index() < 0 or len(self._pending) == batch_size_of(mid):
            self._close_pending()

    def _close_pending(self) -> None:
        if not self._pending:
            return
        first = self._pending[0]
        mid = first.message_id()
        batched = mid.batch_index() >= 0
        self._entries.append(
            EntryInfo(
                ledger=mid.ledger_id(),
                entry=mid.entry_id(),
                batch_size=len(self._pending) if batched else 0,
                size=sum(len(m.data()) for m in self._pending),
                publish_time_ms=first.publish_timestamp(),
            )
        )
        self._pending = []

    def entries(self) -> list[EntryInfo]:
        with self._lock:
            return list(self._entries)

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


def entries_up_to(entries: Sequence[EntryInfo], pos: Position) -> int:
    """How many of ``entries`` (in position order, as a reader returns them) are at or
    before ``pos``: a binary search, since the admin server and the replicator's lag
    count over a topic's whole log on every call."""
    return bisect.bisect_right(entries, (pos.ledger, pos.entry), key=_position_key)


def _position_key(e: EntryInfo) -> tuple[int, int]:
    return (e.ledger, e.entry)


def ledgers_of(entries: Iterable[EntryInfo]) -> Ledgers:
    """Entry counts per ledger (entries of a ledger are dense from 0 on pulsar-lite)."""
    counts: dict[int, int] = {}
    for e in entries:
        counts[e.ledger] = max(counts.get(e.ledger, 0), e.entry + 1)
    return Ledgers.of(counts.items())


@dataclass
class SubscriptionAcks:
    """Acks sent on one subscription of one topic partition, and how far it was dispatched."""

    initial_mark_delete: Position | None  # None: before the first entry (Earliest)
    whole: set[tuple[int, int]] = field(default_factory=set)
    indexes: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    cumulative: MessageId | None = None
    consumed: int = 0
    last_received: Position | None = None
    last_ack_at: float = 0.0
    active_consumers: int = 0

    def add(self, event: AckEvent) -> None:
        pos = (event.ledger, event.entry)
        if event.cumulative:
            mid = MessageId(event.ledger, event.entry, -1, event.batch_index)
            if self.cumulative is None or _cum_key(mid) > _cum_key(self.cumulative):
                self.cumulative = mid
        elif event.batch_index < 0:
            self.whole.add(pos)
        else:
            self.indexes.setdefault(pos, set()).add(event.batch_index)
        self.last_ack_at = max(self.last_ack_at, event.at)


def _cum_key(mid: MessageId) -> tuple[int, int, int]:
    # A whole-entry cumulative ack (-1) reaches past every batch index of that entry.
    return (mid.ledger, mid.entry, mid.batch_index if mid.batch_index >= 0 else 1 << 62)


@dataclass(frozen=True)
class CursorView:
    """A folded cursor: what internalStats reports for one subscription."""

    mark_delete: Position
    individually_deleted: RangeSet
    read_position: Position
    acked_entries: int
    partially_acked_entries: int


def fold_cursor(acks: SubscriptionAcks, entries: list[EntryInfo]) -> CursorView:
    """Apply the broker's folding rule to the recorded acks over the known entries."""
    ledgers = ledgers_of(entries)
    first_ledger = entries[0].ledger if entries else -1
    start = acks.initial_mark_delete or Position(first_ledger, -1)
    batch = {(e.ledger, e.entry): e.batch_size for e in entries}
    acked: set[tuple[int, int]] = set(acks.whole)
    partial = 0
    for pos, idx in acks.indexes.items():
        k = batch.get(pos)
        if k is not None and (k == 0 or sum(1 for i in idx if i < k) >= k):
            acked.add(pos)
    cum_md = start
    if acks.cumulative is not None:
        c = acks.cumulative
        k = batch.get((c.ledger, c.entry))
        whole_entry = c.batch_index < 0 or (k is not None and c.batch_index >= k - 1)
        if not whole_entry:
            done = acks.indexes.get((c.ledger, c.entry), set()) | set(range(c.batch_index + 1))
            if k is not None and sum(1 for i in done if i < k) >= k:
                whole_entry = True
        cum_md = max(start, Position(c.ledger, c.entry if whole_entry else c.entry - 1))
    for pos in acks.indexes:
        if pos not in acked and Position(*pos) > cum_md:
            partial += 1
    rows = np.array([(lg, en - 1, lg, en) for lg, en in sorted(acked)], dtype=np.int64)
    md, remaining = fold(cum_md, RangeSet(rows.reshape(-1, 4)), ledgers if entries else None)
    md = _canonical_mark_delete(md, ledgers, entries)
    read = md if acks.last_received is None or acks.last_received < md else acks.last_received
    read_position = Position(read.ledger, read.entry + 1)
    acked_count = RangeSet.up_to(md).count_entries(ledgers) if entries else 0
    acked_count += remaining.count_entries(ledgers) if entries else 0
    return CursorView(md, remaining, read_position, acked_count, partial)


def _canonical_mark_delete(md: Position, ledgers: Ledgers, entries: list[EntryInfo]) -> Position:
    # fold() may leave L:-1 of a later ledger; the broker reports an existing entry or L:-1
    # of the first ledger.
    if not entries:
        return md
    canon = RangeSet.up_to(md).canonical(ledgers)
    if not canon:
        return md
    return Position(int(canon.bounds[0, 2]), int(canon.bounds[0, 3]))


class ClusterState:
    """Topics (with partition counts), their logs, and the acks recorded on one cluster."""

    def __init__(self, name: str, client: Any) -> None:
        self.name = name
        self._client = client
        self._lock = threading.RLock()
        self.partitioned: dict[str, int] = {}  # full parent topic -> partitions
        self.topics: set[str] = set()  # full names of non-partitioned topics and partitions
        self.logs: dict[str, TopicLog] = {}
        self.subs: dict[tuple[str, str], SubscriptionAcks] = {}
        self.events: list[AckEvent] = []
        self.replicator_cursors: dict[str, dict[str, Position]] = {}  # topic -> {name: md}

    # -- topics
    def register_topic(self, topic: str, partitions: int = 0) -> list[str]:
        """Declare a topic (``partitions`` > 0: partitioned); returns its partition topics."""
        name = full_topic(topic)
        with self._lock:
            if partitions > 0:
                self.partitioned[name] = max(partitions, self.partitioned.get(name, 0))
                parts = [partition_topic(name, i) for i in range(partitions)]
            else:
                parts = [name]
            self.topics.update(parts)
            return parts

    def partitions_of(self, topic: str) -> int:
        with self._lock:
            return self.partitioned.get(full_topic(topic), 0)

    def knows(self, topic: str) -> bool:
        with self._lock:
            return full_topic(topic) in self.topics

    def list_topics(self, tenant: str, namespace: str) -> list[str]:
        """Like the namespace listing: partitions are listed, partitioned parents are not."""
        prefix = f"persistent://{tenant}/{namespace}/"
        with self._lock:
            return sorted(t for t in self.topics if t.startswith(prefix))

    def log(self, topic: str) -> TopicLog:
        name = full_topic(topic)
        with self._lock:
            if name not in self.topics:
                raise SandboxTopicError(f"topic {name} is not registered on cluster {self.name}")
            if name not in self.logs:
                self.logs[name] = TopicLog(self._client, name)
            return self.logs[name]

    # -- subscriptions and acks
    def subscription(
        self, topic: str, subscription: str, *, initial_mark_delete: Position | None = None
    ) -> SubscriptionAcks:
        """The ack record of a subscription, created on first use."""
        name = full_topic(topic)
        with self._lock:
            self.topics.add(name)
            key = (name, subscription)
            if key not in self.subs:
                self.subs[key] = SubscriptionAcks(initial_mark_delete)
            return self.subs[key]

    def record_ack(
        self,
        topic: str,
        subscription: str,
        message_id: Any,
        *,
        cumulative: bool = False,
        source: str = "record_ack",
    ) -> AckEvent:
        """Record one ack of a pulsar Message or MessageId, a MessageId, a Position or "L:E"."""
        ledger, entry, batch_index = _id_parts(message_id)
        event = AckEvent(
            self.name,
            full_topic(topic),
            subscription,
            ledger,
            entry,
            batch_index,
            cumulative,
            time.time(),
            source,
        )
        with self._lock:
            self.subscription(topic, subscription).add(event)
            self.events.append(event)
        return event

    def record_received(self, topic: str, subscription: str, message_id: Any) -> None:
        ledger, entry, _ = _id_parts(message_id)
        with self._lock:
            acks = self.subscription(topic, subscription)
            acks.consumed += 1
            pos = Position(ledger, entry)
            if acks.last_received is None or pos > acks.last_received:
                acks.last_received = pos

    def subscriptions_of(self, topic: str) -> dict[str, SubscriptionAcks]:
        name = full_topic(topic)
        with self._lock:
            return {s: a for (t, s), a in self.subs.items() if t == name}

    def set_replicator_cursor(self, topic: str, name: str, mark_delete: Position) -> None:
        """A replicator (``pulsar.repl.<cluster>``) cursor, as real source brokers list them."""
        with self._lock:
            self.replicator_cursors.setdefault(full_topic(topic), {})[name] = mark_delete

    def replicator_cursors_of(self, topic: str) -> dict[str, Position]:
        with self._lock:
            return dict(self.replicator_cursors.get(full_topic(topic), {}))

    def ack_events(self) -> list[AckEvent]:
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        with self._lock:
            for log in self.logs.values():
                log.close()
            self.logs.clear()


def _id_parts(message_id: Any) -> tuple[int, int, int]:
    if isinstance(message_id, str):
        p = Position.parse(message_id)
        return p.ledger, p.entry, -1
    if isinstance(message_id, Position):
        return message_id.ledger, message_id.entry, -1
    if isinstance(message_id, MessageId):
        return message_id.ledger, message_id.entry, message_id.batch_index
    if hasattr(message_id, "message_id") and callable(message_id.message_id):
        message_id = message_id.message_id()
    if hasattr(message_id, "ledger_id"):
        return message_id.ledger_id(), message_id.entry_id(), message_id.batch_index()
    raise TypeError(
        f"cannot read a position from {message_id!r}: pass a pulsar MessageId or Message, "
        "a cursorsync MessageId, a Position or 'ledger:entry'"
    )
