"""Geo-replication A -> B emulated with pulsar-client, entry for entry.

pulsar-lite has no geo-replication, so a thread per topic partition reads
the source with a Reader and republishes every entry on the target:

- one target entry per source entry, in source order (each entry is
  confirmed before the next is sent, so producers never race each other);
- a source batch of k messages becomes ONE target entry with the same k
  messages at the same batch indexes: a batching producer with unbounded
  limits gets the k messages with ``send_async`` and is then ``flush()``-ed,
  which closes exactly that batch. A reader receives a batch's messages
  together (the client unpacks the whole entry into its queue at once); the
  batch is complete when it holds the size its message ids declare
  (cursorsync.pulsar.msgid), or else when the next message belongs to another
  entry or none arrives within ``batch_gap_ms``. A message index seen twice
  (the reader re-delivered part of a batch, seen under load) is dropped. The
  target message ids are checked
  (same ledger:entry, indexes 0..k-1) and a mismatch stops the replicator
  with :class:`ReplicationError`;
- a non-batched entry goes through a non-batching producer (the C++ client
  sends even a 1-message batch in batch format, so the two stay distinct);
- preserved per message: producer name (one target producer per source
  producer name; pulsar-lite allows a batching and a non-batching producer
  of the same name on one topic, real brokers refuse duplicates), event
  time, properties, partition key, ordering key, payload;
- the source position ``"ledgerId:entryId"`` under ``__MSG_PROP_REPL_SOURCE_POSITION``
  (name configurable, switch off to emulate brokers older than
  3.0.11 / 3.3.6 / 4.0.4). Real brokers put it in the ENTRY metadata, which
  consumers of a batched entry do not see (they get each message's own
  properties); ``position_on_batched="hidden"`` (default) reproduces that by
  adding it to non-batched entries only, ``"each_message"`` adds it to every
  message of a batch.

Not preserved (pulsar-client cannot set or cannot read them):

- ``publish_time``: set by the target producer at send time (so it differs
  from the source's, and is later);
- ``sequence_id``: the Python client does not expose the source's; the target
  producer numbers its own messages;
- ``replicated_from``: not settable from a client, so target entries look
  locally produced (real replicated entries carry the source cluster);
- entry-level properties of batched entries, see above; schema version,
  compression, encryption, chunking (the workload uses none of them).

Identity alignment on the sandbox must therefore use producer name, event
time, properties (minus the source-position property), partition key,
ordering key, payload and batch composition (message count per entry), and
never publish time or sequence id. The replicator records every
(source entry -> target entry) pair it produced: ground truth for tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from cursorsync.errors import CursorSyncError
from cursorsync.positions import Position
from cursorsync.pulsar.msgid import batch_size_of
from cursorsync.pulsar.reader import ResumingReader
from cursorsync.sandbox.state import STALL_MS, ClusterState, entries_up_to, full_topic

log = logging.getLogger(__name__)

SOURCE_POSITION_PROPERTY = "__MSG_PROP_REPL_SOURCE_POSITION"


class ReplicationError(CursorSyncError):
    """The emulated replicator could not reproduce an entry faithfully; names the entry."""


@dataclass(frozen=True)
class ReplicatorOptions:
    """How the emulated replicator behaves."""

    source_cluster: str = "A"
    target_cluster: str = "B"
    stamp_source_position: bool = True
    source_position_property: str = SOURCE_POSITION_PROPERTY
    position_on_batched: Literal["hidden", "each_message"] = "hidden"
    batch_gap_ms: int = 50
    poll_ms: int = 100
    send_timeout_s: float = 30.0


@dataclass(frozen=True)
class ReplicatedEntry:
    """Ground truth: one source entry and the target entry it became."""

    topic: str
    source: Position
    target: Position
    batch_size: int  # 0: non-batched
    producer_name: str
    replicated_at: float


class Replicator:
    """Replicates a list of topic partitions from a source to a target cluster in threads."""

    def __init__(
        self,
        source_client: Any,
        target_client: Any,
        topics: Iterable[str],
        options: ReplicatorOptions | None = None,
        *,
        source_state: ClusterState | None = None,
        target_state: ClusterState | None = None,
    ) -> None:
        self.options = options or ReplicatorOptions()
        self._src = source_client
        self._dst = target_client
        self.topics = [full_topic(t) for t in topics]
        self._source_state = source_state
        self._target_state = target_state
        self._lock = threading.Lock()
        self._entries: list[ReplicatedEntry] = []
        self._last: dict[str, Position] = {}
        self._producers: dict[tuple[str, str, bool], Any] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._flight = threading.Condition()
        self._in_flight = 0
        self.errors: list[BaseException] = []
        for t in self.topics:
            for state in (source_state, target_state):
                if state is not None and not state.knows(t):
                    state.register_topic(t)

    # -- lifecycle
    def start(self) -> Replicator:
        if self._threads:
            raise ReplicationError("replicator is already running; stop() it first")
        self._stop.clear()
        for topic in self.topics:
            th = threading.Thread(
                target=self._run, args=(topic,), name=f"replicator-{topic}", daemon=True
            )
            th.start()
            self._threads.append(th)
        return self

    def stop(self) -> None:
        """Stop all threads and close the target producers (a restart resumes where it was)."""
        self._stop.set()
        for th in self._threads:
            th.join(timeout=10)
        self._threads = []
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for p in producers:
            p.close()

    def pause(self) -> None:
        """Stop replicating; returns once no entry is in flight (readers stay open)."""
        with self._flight:
            self._running.clear()
            self._flight.wait_for(lambda: self._in_flight == 0, timeout=self.options.send_timeout_s)

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def __enter__(self) -> Replicator:
        if not self._threads:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- ground truth and progress
    def entries(self, topic: str | None = None) -> list[ReplicatedEntry]:
        """Every entry replicated so far (of one topic partition, or all), in order."""
        with self._lock:
            if topic is None:
                return list(self._entries)
            name = full_topic(topic)
            return [e for e in self._entries if e.topic == name]

    def pairs(self, topic: str) -> list[tuple[Position, Position]]:
        """(source, target) position pairs of one topic partition."""
        return [(e.source, e.target) for e in self.entries(topic)]

    def last_replicated(self, topic: str) -> Position | None:
        with self._lock:
            return self._last.get(full_topic(topic))

    def lag(self) -> dict[str, int]:
        """Source entries not replicated yet, per topic (needs ``source_state``)."""
        if self._source_state is None:
            raise ReplicationError("lag() needs the source ClusterState; pass source_state=")
        out: dict[str, int] = {}
        for topic in self.topics:
            entries = self._source_state.log(topic).refresh()
            last = self.last_replicated(topic)
            out[topic] = len(entries) - (0 if last is None else entries_up_to(entries, last))
        return out

    def wait_caught_up(self, timeout_s: float = 30.0) -> None:
        """Block until lag() is 0 everywhere; raises ReplicationError on timeout or failure."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            lag = self.lag()
            if not any(lag.values()):
                return
            if time.monotonic() > deadline:
                raise ReplicationError(f"replication did not catch up in {timeout_s}s: lag {lag}")
            time.sleep(0.05)

    def check(self) -> None:
        """Raise the first error a replication thread stopped on."""
        if self.errors:
            raise ReplicationError(f"replicator failed: {self.errors[0]}") from self.errors[0]

    # -- the work
    def _run(self, topic: str) -> None:
        import pulsar

        reader = None
        try:
            reader = ResumingReader(self._src, topic, pulsar.MessageId.earliest,
                                    stall_ms=STALL_MS)
            pending: list[Any] = []
            while not self._stop.is_set():
                if not self._running.is_set():
                    time.sleep(0.02)
                    continue
                timeout = self.options.batch_gap_ms if pending else self.options.poll_ms
                try:
                    msg = reader.read_next(timeout)
                except pulsar.Timeout:
                    if pending:
                        self._replicate(topic, pending)
                        pending = []
                    continue
                mid = msg.message_id()
                last = self.last_replicated(topic)
                if last is not None and Position(mid.ledger_id(), mid.entry_id()) <= last:
                    continue  # replicated before a restart
                if pending:
                    head = pending[0].message_id()
                    if (head.ledger_id(), head.entry_id()) != (mid.ledger_id(), mid.entry_id()):
                        self._replicate(topic, pending)
                        pending = []
                    elif any(p.message_id().batch_index() == mid.batch_index() for p in pending):
                        continue  # the reader delivered part of this batch again (seen under load)
                pending.append(msg)
                size = batch_size_of(mid)
                if mid.batch_index() < 0 or (size is not None and len(pending) == size):
                    self._replicate(topic, pending)
                    pending = []
            if pending:
                self._replicate(topic, pending)
        except BaseException as exc:
            log.error("replicator for %s stopped: %s", topic, exc)
            self.errors.append(exc)
        finally:
            if reader is not None:
                reader.close()

    def _producer(self, topic: str, name: str, batched: bool) -> Any:
        key = (topic, name, batched)
        with self._lock:
            p = self._producers.get(key)
        if p is not None:
            return p
        if batched:
            p = self._dst.create_producer(
                topic,
                producer_name=name,
                batching_enabled=True,
                batching_max_messages=1_000_000,
                batching_max_allowed_size_in_bytes=1 << 30,
                batching_max_publish_delay_ms=24 * 3600 * 1000,
                max_pending_messages=100_000,
                block_if_queue_full=True,
            )
        else:
            p = self._dst.create_producer(topic, producer_name=name, batching_enabled=False)
        with self._lock:
            self._producers[key] = p
        return p

    def _replicate(self, topic: str, messages: list[Any]) -> None:
        with self._flight:
            while not self._running.is_set() and not self._stop.is_set():
                self._flight.wait(0.05)
            self._in_flight += 1
        try:
            self._replicate_entry(topic, messages)
        finally:
            with self._flight:
                self._in_flight -= 1
                self._flight.notify_all()

    def _replicate_entry(self, topic: str, messages: list[Any]) -> None:
        import pulsar

        opts = self.options
        first = messages[0].message_id()
        source = Position(first.ledger_id(), first.entry_id())
        batched = first.batch_index() >= 0
        indexes = [m.message_id().batch_index() for m in messages]
        if batched and indexes != list(range(len(messages))):
            raise ReplicationError(
                f"{topic} entry {source}: read batch indexes {indexes}, "
                f"expected 0..{len(indexes) - 1}"
            )
        name = messages[0].producer_name()
        producer = self._producer(topic, name, batched)
        stamp = opts.stamp_source_position and (
            not batched or opts.position_on_batched == "each_message"
        )
        results: list[tuple[Any, Any] | None] = [None] * len(messages)
        done = threading.Event()
        remaining = [len(messages)]
        lock = threading.Lock()

        def callback_for(i: int) -> Any:
            def cb(res: Any, msg_id: Any) -> None:
                results[i] = (res, msg_id)
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()

            return cb

        for i, m in enumerate(messages):
            if m.producer_name() != name:
                raise ReplicationError(f"{topic} entry {source}: two producer names in one entry")
            props = dict(m.properties())
            if stamp:
                props[opts.source_position_property] = f"{source.ledger}:{source.entry}"
            producer.send_async(
                m.data(),
                callback_for(i),
                properties=props,
                partition_key=m.partition_key() or None,
                ordering_key=m.ordering_key() or None,
                event_timestamp=m.event_timestamp() or None,
            )
        producer.flush()
        if not done.wait(opts.send_timeout_s):
            raise ReplicationError(f"{topic} entry {source}: target did not confirm the send")
        target: Position | None = None
        for i, r in enumerate(results):
            assert r is not None
            res, mid = r
            if res != pulsar.Result.Ok:
                raise ReplicationError(f"{topic} entry {source}: target send failed: {res}")
            pos = Position(mid.ledger_id(), mid.entry_id())
            want_index = i if batched else -1
            if (target is not None and pos != target) or mid.batch_index() != want_index:
                raise ReplicationError(
                    f"{topic} entry {source}: message {i} landed at {mid} on the target, "
                    f"breaking the entry's batch composition"
                )
            target = pos
        assert target is not None
        entry = ReplicatedEntry(
            topic, source, target, len(messages) if batched else 0, name, time.time()
        )
        with self._lock:
            self._entries.append(entry)
            self._last[topic] = source
        if self._source_state is not None:
            self._source_state.set_replicator_cursor(
                topic, f"pulsar.repl.{opts.target_cluster}", source
            )
