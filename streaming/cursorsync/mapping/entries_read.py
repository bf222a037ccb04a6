"""Executors reading ``pulsar-entries`` ranges: a pulsar-client Reader per range, every
entry exactly once, and the admin API asked about the ids a reader never delivers."""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.pandas.types import to_arrow_schema

from cursorsync.core.identity import Digester
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.mapping.entries_options import (
    DIGESTED_ONLY_COLUMNS,
    EVIDENCE_COLUMNS,
    READ_POLL_MS,
    SCHEMA,
    EntriesReadError,
    Row,
)
from cursorsync.mapping.entries_rows import MESSAGE_FIELD_COLUMNS, Entry, row_values
from cursorsync.mapping.entries_tasks import EntriesPartition
from cursorsync.mapping.kept_readers import (
    FORWARD_MAX,
    KEEP_RANGE_MAX,
    KEPT_QUEUE,
    KeptReader,
    KeptReaders,
)
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.msgid import batch_size_of, first_chunk_of
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)


#: One pulsar-client per connection settings and worker process. PySpark reuses its
#: workers, so a task does not pay for a client's start and shutdown (about 10 ms
#: each); readers are still opened and closed per task. At most CLIENTS_KEPT are kept
#: (settings change when a token does): the least recently used one is closed.
_CLIENTS: dict[Any, Any] = {}
_CLIENTS_LOCK = threading.Lock()
CLIENTS_KEPT = 8


def _client(settings: ClientSettings) -> Any:
    """This worker's client for ``settings`` (opened once, the least recently used closed)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.pop(settings, None)
        if client is None:
            if not _CLIENTS:
                atexit.register(_close_clients)
            client = settings.connect()
            while len(_CLIENTS) >= CLIENTS_KEPT:
                oldest = next(iter(_CLIENTS))
                KEPT.forget(oldest)  # closed with their client
                with contextlib.suppress(Exception):  # its tasks are done; best effort
                    _CLIENTS.pop(oldest).close()
        _CLIENTS[settings] = client  # most recently used last
        return client


def _close_clients() -> None:
    """At exit, while our logger still exists: a client destroyed later logs at DEBUG to
    stdout (seen after ``--json`` output)."""
    with _CLIENTS_LOCK:
        for settings in _CLIENTS:
            KEPT.forget(settings)  # closed with their client
        for client in _CLIENTS.values():
            with contextlib.suppress(Exception):  # best effort, at exit
                client.close()
        _CLIENTS.clear()


#: Ranges of one task read at the same time, each on its own reader: opening a reader is a
#: round trip to a broker, and most of a task's ranges hold a few entries each.
RANGES_AT_ONCE = 4


def read_ranges(ranges: Sequence[EntriesPartition]) -> Iterator[Row]:
    """The rows of every range, range after range in the order given (each range's rows
    as :func:`read_entries` yields them), up to RANGES_AT_ONCE ranges read at once. A task
    holds at most ``entriesPerTask`` entries unless it is one range, read as it streams."""
    if len(ranges) == 1:
        yield from read_entries(ranges[0])
        return
    with ThreadPoolExecutor(max_workers=min(RANGES_AT_ONCE, len(ranges))) as pool:
        for rows in pool.map(lambda r: list(read_entries(r)), ranges):
            yield from rows


def read_entries(part: EntriesPartition) -> Iterator[Row]:
    """Every message of the entries in (start, end] of one topic partition, in order.

    Deterministic: the same (start, end] always yields the same rows while the
    entries are retained (the driver's subscription holds them until commit), whether
    they are read on a reader opened at the start or on one kept from an earlier range
    (:mod:`cursorsync.mapping.kept_readers`).
    """
    import pulsar

    start = Position.parse(part.start)
    end = Position.parse(part.end)
    if end <= start:
        return
    topic = TopicName.parse(part.topic)
    before = (start.ledger, start.entry)
    size = part.entry_count()
    keep = part.kept_readers > 0 and size is not None and size <= KEEP_RANGE_MAX
    client = _client(part.client)
    if not keep:
        KEPT.drop(part.client, part.topic)  # this read passes it
    else:
        kept = KEPT.take(part.client, part.topic, before)
        if kept is not None:
            try:
                yield from _read_on(part, topic, kept, start, end, keep=True,
                                    forward_max=FORWARD_MAX)
                return
            except _TooFarBehind:
                pass  # nothing yielded yet: read the range on a new reader
    start_id = (pulsar.MessageId.earliest if start.ledger < 0
                else pulsar.MessageId(topic.partition, start.ledger, start.entry, -1))
    reader = client.create_reader(
        part.topic, start_id,
        receiver_queue_size=min(KEPT_QUEUE, part.receiver_queue_size) if keep
        else part.receiver_queue_size)
    yield from _read_on(part, topic, KeptReader(reader, before), start, end, keep=keep,
                        forward_max=None)


#: This worker process's kept readers (see cursorsync.mapping.kept_readers).
KEPT = KeptReaders()


class _TooFarBehind(Exception):
    """A kept reader would drop more than FORWARD_MAX messages to reach the range's start."""


def _read_on(part: EntriesPartition, topic: TopicName, kept: KeptReader, start: Position,
             end: Position, *, keep: bool, forward_max: int | None) -> Iterator[Row]:
    """The rows of (start, end] of ``topic`` (``part.topic``, parsed) read on ``kept``'s
    reader; the reader is kept for the next range when ``keep`` and the range was read to
    its end, else closed."""
    where = (str(topic.base), topic.partition)
    fields = MESSAGE_FIELD_COLUMNS - (DIGESTED_ONLY_COLUMNS if part.columns == EVIDENCE_COLUMNS
                                      else frozenset())
    wide = not fields.isdisjoint(part.columns)
    digester = Digester(part.identity_fields, (part.source_position_property,))
    done = False
    try:
        for entry in _whole_entries(part, kept, start, end, forward_max):
            yield from row_values(part, where, entry, wide, digester)
        done = True
    finally:
        if done and keep:
            kept.at = (end.ledger, end.entry)
            KEPT.keep(part.client, part.topic, kept, part.kept_readers)
        else:
            KEPT.close(kept)  # read to its end and not kept, or a failed or abandoned read


def _whole_entries(part: EntriesPartition, kept: KeptReader, start: Position,
                   end_pos: Position, forward_max: int | None = None) -> Iterator[Entry]:
    """The entries in (start, end_pos] as ``kept``'s reader delivers them, each once and
    whole; the message delivered past ``end_pos``, if any, is left in ``kept.pending``.

    The batch size from a batched message's id says when its entry ends.
    Messages delivered again (a reader's stream is in order, so anything at or
    before an entry already yielded, or a batch index already seen) are dropped:
    every entry is yielded once. An entry first seen behind one already yielded
    fails the task (a reader delivers in order; skipping it would be a hole).
    A reader that stopped before ``start`` delivers what lies before it first: dropped,
    and _TooFarBehind once more than ``forward_max`` of them (before anything is
    yielded). So is a chunked message whose first chunk is at or before ``start``: a
    reader opened at ``start`` never delivers it.
    """
    import pulsar

    reader = kept.reader
    # The client's own reader under pulsar.Reader, where there is one: its wrapper makes a
    # Python Message object around each message, and every accessor is then one more
    # Python call; the native message has the same accessors.
    read_next = getattr(reader, "_reader", reader).read_next
    pending, kept.pending = kept.pending, None
    read = _RangeRead(part, start, end_pos)
    dropped = 0
    while True:
        if read.current is not None and read.current.complete:
            yield read.finish()
            if read.done_to >= read.end:
                return
        if pending is not None:
            msg, pending = pending, None
        else:
            try:
                # The receiver queue is usually full: ask the broker whether anything is
                # left only when it runs dry, not once per entry (a round trip each).
                msg = read_next(READ_POLL_MS)
            except pulsar.Timeout as e:
                if read.complete_after_silence(reader, e):
                    if read.current is not None:
                        yield read.current
                    return
                continue
        read.waited = read.checked_at = 0  # the silence is over
        mid = msg.message_id()
        pos = (mid.ledger_id(), mid.entry_id())
        if pos <= read.done_to:
            if forward_max is not None and pos <= read.before:
                dropped += 1
                if dropped > forward_max:
                    raise _TooFarBehind
            read.check_redelivered(pos)
            continue
        if pos > read.end:
            kept.pending = msg
            break
        if read.current is not None and pos == read.current.pos:
            read.current.add(mid, msg)
            continue
        entry = _begin_entry(pos, mid, msg)
        if entry.first_chunk is not None and entry.first_chunk <= read.before:
            continue
        if read.current is not None:
            # An entry ends here when its size is unknown, or when its batch was not
            # delivered whole: its digest then matches nothing, so it stays unmapped.
            yield read.finish()
        read.current = entry
    if read.current is not None:
        read.check_whole()
        yield read.current


def _begin_entry(pos: tuple[int, int], mid: Any, msg: Any) -> Entry:
    """The entry at ``pos``, begun with ``msg``, the first of its messages delivered."""
    index = mid.batch_index()
    first = first_chunk_of(mid) if index < 0 else None
    return Entry(pos, 1 if index < 0 else batch_size_of(mid), mid, msg, index, first)


class _RangeRead:
    """Where reading one range is: the entry being assembled, the entries yielded, how long
    the reader has been silent. Positions are (ledger, entry) tuples here: the read loop
    runs once per message."""

    __slots__ = ("before", "checked_at", "current", "done_to", "end", "end_pos", "part",
                 "waited", "where", "yielded")

    def __init__(self, part: EntriesPartition, start: Position, end_pos: Position) -> None:
        self.part = part
        self.end_pos = end_pos
        self.end = (end_pos.ledger, end_pos.entry)
        self.where = f"cluster {part.cluster} topic {part.topic} range ({start}..{end_pos}]"
        self.before = (start.ledger, start.entry)  # exclusive: not this range's
        self.done_to = self.before  # the last entry yielded, or the start
        self.yielded: set[tuple[int, int]] = set()
        self.current: Entry | None = None
        self.waited = 0  # ms the reader has been silent
        self.checked_at = 0  # ``waited`` at the last tail check of this silence

    def finish(self) -> Entry:
        """The entry being assembled, to be yielded: it is done with."""
        entry = self.current
        assert entry is not None
        self.done_to = entry.pos
        self.yielded.add(entry.pos)
        self.current = None
        return entry

    def check_redelivered(self, pos: tuple[int, int]) -> None:
        """A message at or before the last entry yielded: a re-delivery, or the start entry
        (batch index -1 compares low). One never yielded yet would leave a hole the builder
        takes for a marker (and acks), so it fails the task instead."""
        if pos <= self.before or pos in self.yielded:
            return
        raise EntriesReadError(f"{self.where}: entry {pos[0]}:{pos[1]} arrived after "
                               f"{self.done_to[0]}:{self.done_to[1]}, out of order")

    def complete_after_silence(self, reader: Any, timeout: Exception) -> bool:
        """After a poll that timed out: whether the range is complete (the admin API says
        nothing left is for a reader to deliver); EntriesReadError once silent for the
        read timeout.

        Never return part of (start, end]: end is at or before the latest entry the
        driver saw, so entries are missing, not absent, and a skipped entry would later
        look like a marker hole to the mapping builder (and be acked)."""
        part, current = self.part, self.current
        self.waited += READ_POLL_MS
        # Waiting for the rest of a batch (a complete entry is yielded before the next poll):
        # no lookup says its messages are not coming.
        mid_batch = current is not None and current.size is not None
        if self.waited - self.checked_at >= part.tail_check_ms and not mid_batch:
            self.checked_at = self.waited
            after = current.pos if current is not None else self.done_to
            if _nothing_to_deliver(part, after, self.end):
                return True
        if self.waited >= part.read_timeout_ms:
            more = "" if mid_batch else (
                f" (the broker says more available: {reader.has_message_available()})")
            raise EntriesReadError(
                f"{self.where}: stopped before {self.end_pos}: no message within "
                f"{part.read_timeout_ms} ms{more}; the task fails rather than "
                f"return a partial range"
            ) from timeout
        return False

    def check_whole(self) -> None:
        """The last entry, past which the reader moved: EntriesReadError if its batch size
        is known and not all its messages came."""
        current = self.current
        if current is not None and current.size is not None and not current.complete:
            raise EntriesReadError(
                f"{self.where}: entry {current.pos[0]}:{current.pos[1]} ended after "
                f"{len(current.messages)} of its {current.size} messages"
            )


def _nothing_to_deliver(part: EntriesPartition, after: tuple[int, int],
                        end: tuple[int, int]) -> bool:
    """Whether every entry in (after, end] is one a reader of this range never delivers: a
    marker, or a chunk (of a chunked message begun before the reader's start or ended after
    the range's end). The entries are those of the topic's ledger list: an id past a closed
    ledger's end, or in a ledger no longer listed, is none (the broker answers the first
    with a 500). An end past the last stored entry is not complete: what is not written
    yet may be a message. Looked up on the admin API, stopping at the first other entry;
    False without an admin API."""
    if part.admin is None or after >= end:
        return after >= end
    with AdminClient(part.admin) as admin:
        ledgers = admin.internal_stats(part.topic).ledgers
        last = ledgers.last_position()
        if last is None or Position(*end) > last:
            return False
        for pos in RangeSet.of((Position(*after), Position(*end))).iter_entries(ledgers):
            raw = admin.raw_entry(part.topic, pos.ledger, pos.entry)
            if raw is None or raw.is_marker:
                continue
            if raw.chunk_id is None:
                return False
    log.info("cluster %s topic %s: (%d:%d..%d:%d] holds only markers and chunks; the range "
             "is complete", part.cluster, part.topic, *after, *end)
    return True


#: Heap freezes left in this worker process (see freeze_worker_heap).
_FREEZES_LEFT = 2


def freeze_worker_heap() -> None:
    """Keep the worker's long-lived objects out of the cyclic collector.

    A reused PySpark worker runs a full ``gc.collect()`` after every task, over every
    object it holds (pyspark, pyarrow, pandas, pulsar...), the largest single cost of a
    warm worker. Those objects live as long as the process, so they are collected once
    and frozen, twice: at the first task, after our imports, and at the second, because
    the first task's own work loads more (pyspark imports pandas and hundreds of other
    modules while it serializes the first batch). After that the heap a task starts
    with stays the same size, so there is nothing more to freeze. Each task's garbage is
    still collected after it; only the second freeze can catch objects of its own task,
    once, which bounds what it may keep.
    """
    global _FREEZES_LEFT
    if not _FREEZES_LEFT:
        return
    import pulsar  # noqa: F401 - loaded before the freeze: it lives as long as the worker

    to_arrow_schema(SCHEMA, timezone="UTC")
    gc.collect()
    gc.freeze()
    _FREEZES_LEFT -= 1
