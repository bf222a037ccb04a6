"""``pulsar-entries``: a Spark streaming source of the messages of a set of Pulsar topics.

One row per message, never the payload itself: its size and an identity
digest (cursorsync.core.identity) are what the mapping builder needs.

Offsets: ``{"version": 1, "positions": {"<topic partition>": "L:E", ...}}``
(keys sorted), the last entry included per topic partition; ``"-1:-1"`` is
"before every entry". A batch reads the entries in (start, end], start
exclusive and end inclusive, always whole entries, so a batched entry is
never split between two batches.

Where things run (see SPARK-DELTA-NOTES.md): the driver finds the latest
positions with a durable, zero-queue subscription consumer per topic
partition (``get_last_message_id``), and acknowledges ``end`` cumulatively on
it in ``commit(end)``, so retention keeps every entry not mapped yet.
Executors read with a pulsar-client Reader created inside ``read()``.

Pinned behaviour (tests/test_sources.py): a Reader started at ``L:E:-1``
exclusive re-delivers the messages of entry L:E when it is a batch (the
client compares batch index -1 as "before index 0"), so ``read()`` drops every
message at or before the start entry itself. The batch size has no accessor
in the Python client, but a received batched message id serialises with it
(MessageIdData.batch_size): ``read()`` takes it from there and reads each
entry to its last message.

The broker's last message id is its last *dispatchable* entry (markers are
never the end of a range), but a reader cannot deliver every id up to it: a
chunked message whose first chunks lie before the reader's start is dropped
by the client, and one whose last chunk lies past the end arrives after it.
So when a reader has been silent for ``tailCheckMs`` short of the end, the
ids it has not delivered are looked up on the admin API: if each is a marker
or a chunk, the range is complete (chunks carry no evidence, so a chunked
message is never mapped); anything else is waited for, up to ``readTimeoutMs``.

``rowsPer=entry`` yields one row per entry (its first message, with the
whole entry's digest and batch size) instead of one per message: what the
mapping builder needs, at a fraction of the rows crossing into the JVM.

What the mapping job asks for on top (each cuts what crosses into the JVM):
``columns=evidence`` (the builder's columns only); ``identityScope=batched``
(digest batched entries only: with brokers that stamp the source position,
unbatched replicas carry it where consumers see it); ``identityRowsOnly``
(the source side: only entries with a digest, the only ones identity
evidence can use). ``read()`` hands Spark Arrow record batches.

``layout=arrow`` (the mapping job's): each Spark row carries a whole Arrow
record batch of the selected columns, as an Arrow IPC stream (schema
``PACKED_SCHEMA``: cluster, rows, arrow); ``unpack`` turns a batch of them back
into the rows. The mapping sink takes its batch to the driver as Arrow at once
(``toArrow``), so Spark's per-row work (Arrow -> rows on the executors, rows ->
Arrow again for the collect) bought nothing there: ``cursorsync bench layout``
measures the JVM's CPU on that path at 0.6 of what a row per entry costs
(README). Offsets, admission control, tasks and replay are the same in both
layouts.

Admission control (``maxRowsPerBatch``, or Spark's ReadMaxRows): the budget
is counted in ENTRIES, shared fairly across topic partitions; an entry holds
at least one message, so a batch of batched entries has more rows than the
budget (the driver cannot count messages without reading them).

Tasks: small ranges share a Spark task (``entriesPerTask``, default 10,000
entries, and ``rangesPerTask``, default 32), read one after the other; a range
is never split, and one of ``entriesPerTask`` entries or more has a task of its
own (``pack_ranges``). A range that spans ledgers is sized from the topic's
ledger list (admin ``internalStats``), which the driver reads for admission
control anyway.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from cursorsync.core.identity import (
    DEFAULT_IDENTITY_FIELDS,
    REPL_SOURCE_POSITION_PROPERTY,
    Digester,
    entry_digest,
    parse_identity_fields,
)
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import ConfigError, CursorSyncError
from cursorsync.pulsar.admin import AdminClient, AdminConfig
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.msgid import batch_size_of, first_chunk_of
from cursorsync.pulsar.options import Options
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)

#: A row as read() yields it, in SCHEMA order.
Row = tuple[Any, ...]

OFFSET_VERSION = 1
BEFORE_ALL = Position(-1, -1)
DEFAULT_SUBSCRIPTION = "cursorsync-mapping"
#: Pulsar's default receiver queue (messages).
DEFAULT_RECEIVER_QUEUE = 1000
#: How long read() waits for its queue at a time.
READ_POLL_MS = 100
#: Silent this long short of the range's end: look up what is left (option tailCheckMs).
TAIL_CHECK_MS = 1000
#: How ranges are packed into Spark tasks (options entriesPerTask, rangesPerTask).
DEFAULT_ENTRIES_PER_TASK = 10_000
DEFAULT_RANGES_PER_TASK = 32

#: Every column, in row order.
SCHEMA = StructType([
    StructField("cluster", StringType()), StructField("topic", StringType()),
    StructField("partition", IntegerType()), StructField("ledger", LongType()),
    StructField("entry", LongType()), StructField("batch_index", IntegerType()),
    StructField("batch_size", IntegerType()), StructField("producer_name", StringType()),
    StructField("publish_time", LongType()), StructField("event_time", LongType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("partition_key", StringType()), StructField("ordering_key", StringType()),
    StructField("source_position", StringType()), StructField("identity", BinaryType()),
    StructField("entry_identity", BinaryType()), StructField("payload_size", LongType()),
])
COLUMNS: tuple[str, ...] = tuple(SCHEMA.fieldNames())
#: What the mapping builder reads (option ``columns=evidence``).
EVIDENCE_COLUMNS: tuple[str, ...] = (
    "cluster", "topic", "partition", "ledger", "entry", "batch_index", "batch_size",
    "source_position", "entry_identity",
)
#: Rows per Arrow record batch handed to Spark.
ARROW_BATCH_ROWS = 4096
#: ``layout=arrow``: each Spark row carries an Arrow IPC stream of the selected columns
#: (``rows`` of them) read from ``cluster``.
PACKED_SCHEMA = StructType([
    StructField("cluster", StringType()), StructField("rows", LongType()),
    StructField("arrow", BinaryType()),
])


def schema_of(columns: Sequence[str]) -> StructType:
    """The schema of a column selection (always in row order)."""
    return StructType([f for f in SCHEMA.fields if f.name in set(columns)])


def output_schema(columns: Sequence[str], packed: bool) -> StructType:
    """What a Spark row is: the selected columns, or (``layout=arrow``) a record batch of
    them packed in one row."""
    return PACKED_SCHEMA if packed else schema_of(columns)


def parse_layout(o: Options) -> bool:
    """Option ``layout``: ``rows`` (default) or ``arrow``; True when packed."""
    return o.choice("layout", ("rows", "arrow"), "rows") == "arrow"


def parse_columns(spec: str | None) -> tuple[str, ...]:
    """Option ``columns``: ``all`` (default), ``evidence``, or a comma-separated list."""
    if spec is None or spec.strip().lower() == "all":
        return COLUMNS
    if spec.strip().lower() == "evidence":
        return EVIDENCE_COLUMNS
    names = {c.strip() for c in spec.split(",") if c.strip()}
    unknown = sorted(names - set(COLUMNS))
    if unknown or not names:
        raise ConfigError(f"option columns: {', '.join(unknown) or 'nothing'} is not a column; "
                          f"use all, evidence or names from: {', '.join(COLUMNS)}")
    return tuple(c for c in COLUMNS if c in names)


class EntriesReadError(CursorSyncError):
    """A topic partition could not be read between two offsets; names the topic and range."""


@dataclass(frozen=True)
class EntriesOptions:
    """Every option of ``pulsar-entries``, validated once on the driver."""

    cluster: str
    client: ClientSettings
    topics: tuple[str, ...]
    namespace: str | None
    topic_pattern: str | None
    admin: AdminConfig | None
    subscription: str
    starting_position: str
    max_rows_per_batch: int | None
    identity_fields: tuple[str, ...]
    identity: bool
    identity_batched_only: bool
    identity_rows_only: bool
    position_evidence: bool
    per_entry: bool
    columns: tuple[str, ...]
    receiver_queue_size: int
    source_position_property: str
    read_timeout_ms: int
    tail_check_ms: int
    discovery_interval_ms: int
    entries_per_task: int = DEFAULT_ENTRIES_PER_TASK
    ranges_per_task: int = DEFAULT_RANGES_PER_TASK
    packed: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> EntriesOptions:
        o = Options(raw)
        cluster = o.required("cluster")
        service_url = o.required("serviceUrl")
        if not service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise ConfigError(f"option serviceUrl: {service_url!r} is not a pulsar:// URL")
        topics, namespace, pattern = o.topic_selection()
        admin = o.admin(cluster, required=True)
        fields_spec = o.get_str("identityFields")
        return cls(
            cluster=cluster,
            client=o.client(service_url),
            topics=tuple(topics),
            namespace=namespace,
            topic_pattern=pattern,
            admin=admin,
            subscription=o.get_str("subscription", DEFAULT_SUBSCRIPTION) or DEFAULT_SUBSCRIPTION,
            starting_position=o.choice("startingPosition", ("earliest", "latest"), "earliest"),
            max_rows_per_batch=o.get_int("maxRowsPerBatch", None, minimum=1),
            identity_fields=(parse_identity_fields(fields_spec) if fields_spec
                             else DEFAULT_IDENTITY_FIELDS),
            identity=o.get_bool("identity", True),
            identity_batched_only=o.choice("identityScope", ("all", "batched"), "all")
            == "batched",
            identity_rows_only=o.get_bool("identityRowsOnly", False),
            position_evidence=o.get_bool("positionEvidence", True),
            per_entry=o.choice("rowsPer", ("message", "entry"), "message") == "entry",
            columns=parse_columns(o.get_str("columns")),
            receiver_queue_size=o.get_int("receiverQueueSize", DEFAULT_RECEIVER_QUEUE,
                                          minimum=1) or DEFAULT_RECEIVER_QUEUE,
            source_position_property=o.get_str("sourcePositionProperty",
                                               REPL_SOURCE_POSITION_PROPERTY)
            or REPL_SOURCE_POSITION_PROPERTY,
            read_timeout_ms=o.get_int("readTimeoutMs", 30_000, minimum=1) or 30_000,
            tail_check_ms=o.get_int("tailCheckMs", TAIL_CHECK_MS, minimum=1) or TAIL_CHECK_MS,
            discovery_interval_ms=o.get_int("discoveryIntervalMs", 60_000, minimum=0) or 0,
            entries_per_task=o.get_int("entriesPerTask", DEFAULT_ENTRIES_PER_TASK, minimum=1)
            or DEFAULT_ENTRIES_PER_TASK,
            ranges_per_task=o.get_int("rangesPerTask", DEFAULT_RANGES_PER_TASK, minimum=1)
            or DEFAULT_RANGES_PER_TASK,
            packed=parse_layout(o),
        )


# -- offsets -----------------------------------------------------------------


def make_offset(positions: Mapping[str, Position]) -> dict[str, Any]:
    """The offset JSON value: version first, topics sorted."""
    return {"version": OFFSET_VERSION,
            "positions": {k: str(positions[k]) for k in sorted(positions)}}


def parse_offset(offset: Mapping[str, Any]) -> dict[str, Position]:
    """Offset JSON -> {topic: position}; ConfigError for a version we do not know."""
    if isinstance(offset, str):
        offset = json.loads(offset)
    version = offset.get("version")
    if version != OFFSET_VERSION:
        raise ConfigError(
            f"pulsar-entries offset version {version!r} is not supported (expected "
            f"{OFFSET_VERSION}); the checkpoint was written by another cursorsync version"
        )
    return {k: Position.parse(v) for k, v in offset.get("positions", {}).items()}


# -- partitions and read() (executors) ----------------------------------------


@dataclass(frozen=True)
class EntriesPartition(InputPartition):
    """Read (start, end] of one topic partition. Plain data: it is pickled to executors."""

    cluster: str
    topic: str
    start: str
    end: str
    client: ClientSettings
    identity_fields: tuple[str, ...]
    identity: bool
    per_entry: bool
    source_position_property: str
    read_timeout_ms: int
    columns: tuple[str, ...] = COLUMNS
    receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE
    identity_batched_only: bool = False
    identity_rows_only: bool = False
    #: The stamp is evidence of its own (strategy position-property): a stamped target
    #: entry needs no digest. Off, every entry in the identity scope is digested.
    position_evidence: bool = True
    #: ``layout=arrow``: the task's record batches go to Spark packed, one per row.
    packed: bool = False
    #: The admin API, to look up ids the reader does not deliver (see the module doc).
    admin: AdminConfig | None = None
    tail_check_ms: int = TAIL_CHECK_MS
    #: Entries in (start, end] when the range spans ledgers, as the driver counted them
    #: from the ledger list (only a size hint for packing ranges into tasks).
    entries: int | None = None

    def entry_count(self) -> int | None:
        """Entries in (start, end]: exact within one ledger (ids are dense there), else the
        driver's count, None when it has none."""
        start, end = Position.parse(self.start), Position.parse(self.end)
        if start.ledger == end.ledger:
            return end.entry - start.entry
        return self.entries


@dataclass(frozen=True)
class EntriesTask(InputPartition):
    """The ranges one Spark task reads, one after the other, in order."""

    ranges: tuple[EntriesPartition, ...]


def pack_ranges(ranges: Sequence[EntriesPartition], entries_per_task: int,
                ranges_per_task: int) -> list[EntriesTask]:
    """Small ranges share a task; a range is never split.

    A task per topic partition would make a batch over 100,000 partitions with a few new
    entries each 100,000 Spark tasks (each a Python worker round trip and a reader opened).
    So ranges are packed in order, a task closed when the next range would take it past
    ``entries_per_task`` entries or it holds ``ranges_per_task`` ranges (each opens a
    reader, one after the other). A range of unknown size or of ``entries_per_task`` or
    more gets a task of its own.
    """
    tasks: list[EntriesTask] = []
    current: list[EntriesPartition] = []
    size = 0
    for r in ranges:
        n = r.entry_count()
        big = n is None or n >= entries_per_task
        if current and (big or size + (n or 0) > entries_per_task
                        or len(current) >= ranges_per_task):
            tasks.append(EntriesTask(tuple(current)))
            current, size = [], 0
        if big:
            tasks.append(EntriesTask((r,)))
            continue
        current.append(r)
        size += n or 0
    if current:
        tasks.append(EntriesTask(tuple(current)))
    return tasks


#: Columns that need a message's own fields beyond its id and properties.
_MESSAGE_FIELD_COLUMNS = frozenset({"producer_name", "publish_time", "event_time",
                                    "partition_key", "ordering_key", "identity", "payload_size"})


#: A message's replicated fields, in Digester argument order: producer name, sequence id
#: (the Python client has no accessor), publish time, event time, partition key,
#: ordering key, properties, payload.
_Fields = tuple[str, None, int, int | None, str | None, bytes | None, dict[str, str], bytes]


def _fields_of(msg: Any, props: dict[str, str]) -> _Fields:
    okey = msg.ordering_key() or None
    return (msg.producer_name(), None, msg.publish_timestamp(), msg.event_timestamp() or None,
            msg.partition_key() or None,
            okey.encode("utf-8") if isinstance(okey, str) else okey, props, msg.data())


def _row_values(part: EntriesPartition, where: tuple[str, int], entry: _Entry,
                wide: bool, digest: Digester) -> list[Row]:
    """Rows of one entry's messages (all of them, in batch order, or the first with
    rowsPer=entry). ``where`` is the topic's (base name, partition index), worked out once
    per read; ``wide`` says the selected columns need each message's own fields.

    A digest is only used to align entries without the source-position property, and
    it is the most expensive part of a row, so it is computed only where usable; the
    other fields are only extracted where a selected column or the digest needs them.
    """
    prop = part.source_position_property
    # A chunked message carries no evidence: it is never mapped,
    # so never acked on the target, and comes again whole after a failover.
    identity = (part.identity and not entry.chunked
                and (entry.batched or not part.identity_batched_only))
    if part.identity_rows_only and not identity:
        return []  # an entry identity evidence will not use: no row at all
    per_entry = part.per_entry
    digests: list[bytes | None] = []
    rows: list[tuple[Any, _Fields | None, dict[str, str], bytes | None]] = []
    for i, msg in enumerate(entry.messages):
        props = msg.properties()  # a new dict per call
        # On the target, a stamped entry is mapped by its stamp; on the source side
        # (identity_rows_only) a stamp from a third cluster means nothing here.
        digest_it = identity and (part.identity_rows_only or not part.position_evidence
                                  or prop not in props)
        row_wanted = i == 0 or not per_entry
        fields = _fields_of(msg, props) if digest_it or (row_wanted and wide) else None
        d = digest(*fields) if digest_it and fields is not None else None
        digests.append(d)
        if row_wanted:
            rows.append((entry.ids[i], fields, props, d))
        if not identity and per_entry:
            break  # one row, no entry digest: the other messages add nothing
    edigest = (entry_digest(digests)  # type: ignore[arg-type]  # no None in it: checked
               if identity and None not in digests else None)
    if part.identity_rows_only and edigest is None:
        return []
    size = len(entry.messages)
    ledger, entry_id = entry.pos
    chunked = entry.chunked
    out: list[Row] = []
    for mid, f, props, d in rows:
        if f is None:
            out.append((part.cluster, where[0], where[1], ledger, entry_id, mid.batch_index(),
                        size, None, None, None, props, None, None,
                        None if chunked else props.get(prop), d, edigest,
                        None))
            continue
        okey = f[5]
        out.append((
            part.cluster, where[0], where[1], ledger, entry_id,
            mid.batch_index(), size, f[0], f[2], f[3], props, f[4],
            None if okey is None else okey.decode(),
            None if chunked else props.get(prop), d, edigest, len(f[7]),
        ))
    return out


class _Entry:
    """The messages of one entry read so far, each batch index once (a plain class: one is
    made per entry read)."""

    __slots__ = ("_seen", "batched", "chunked", "ids", "messages", "pos", "size")

    def __init__(self, pos: tuple[int, int], size: int | None, mid: Any, msg: Any,
                 index: int, chunked: bool = False) -> None:
        self.pos = pos
        self.size = size
        self.batched = index >= 0
        self.chunked = chunked  # a chunked message's last chunk, handed on without evidence
        self.ids = [mid]
        self.messages = [msg]
        self._seen = {index}

    def add(self, mid: Any, msg: Any) -> None:
        index = mid.batch_index()
        if index in self._seen:
            return  # re-delivered within the entry
        self._seen.add(index)
        self.ids.append(mid)
        self.messages.append(msg)

    @property
    def complete(self) -> bool:
        return self.size is not None and len(self.messages) >= self.size


#: One pulsar-client per connection settings and worker process. PySpark reuses its
#: workers, so a task does not pay for a client's start and shutdown (about 10 ms
#: each); readers are still opened and closed per task. At most CLIENTS_KEPT are kept
#: (settings change when a token does): the least recently used one is closed.
_CLIENTS: dict[Any, Any] = {}
_CLIENTS_LOCK = threading.Lock()
CLIENTS_KEPT = 8


def _client(settings: ClientSettings) -> Any:
    with _CLIENTS_LOCK:
        c = _CLIENTS.pop(settings, None)
        if c is None:
            if not _CLIENTS:
                atexit.register(_close_clients)
            c = settings.connect()
            while len(_CLIENTS) >= CLIENTS_KEPT:
                oldest = next(iter(_CLIENTS))
                with contextlib.suppress(Exception):  # its tasks are done; best effort
                    _CLIENTS.pop(oldest).close()
        _CLIENTS[settings] = c  # most recently used last
        return c


def _close_clients() -> None:
    """At exit, while our logger still exists: a client destroyed later logs at DEBUG to
    stdout (seen after ``--json`` output)."""
    with _CLIENTS_LOCK:
        for c in _CLIENTS.values():
            with contextlib.suppress(Exception):  # best effort, at exit
                c.close()
        _CLIENTS.clear()


def read_entries(part: EntriesPartition) -> Iterator[Row]:
    """Every message of the entries in (start, end] of one topic partition, in order.

    Deterministic: the same (start, end] always yields the same rows while the
    entries are retained (the driver's subscription holds them until commit).
    The batch size from a batched message's id says when its entry ends.
    Messages delivered again (a reader's stream is in order, so anything at or
    before an entry already yielded, or a batch index already seen) are dropped:
    every entry is yielded once. An entry first seen behind one already yielded
    fails the task (a reader delivers in order; skipping it would be a hole).
    Positions are (ledger, entry) tuples here: this loop runs once per message.
    """
    import pulsar

    topic = TopicName.parse(part.topic)
    where_ = (str(topic.base), topic.partition)
    wide = not _MESSAGE_FIELD_COLUMNS.isdisjoint(part.columns)
    digest = Digester(part.identity_fields, (part.source_position_property,))
    start = Position.parse(part.start)
    end_pos = Position.parse(part.end)
    if end_pos <= start:
        return
    end = (end_pos.ledger, end_pos.entry)
    where = f"cluster {part.cluster} topic {part.topic} range ({start}..{end_pos}]"
    client = _client(part.client)
    start_id = (pulsar.MessageId.earliest if start.ledger < 0
                else pulsar.MessageId(topic.partition, start.ledger, start.entry, -1))
    reader = client.create_reader(part.topic, start_id,
                                  receiver_queue_size=part.receiver_queue_size)
    try:
        before = (start.ledger, start.entry)  # exclusive: not this range's
        done_to = before  # the last entry yielded, or the start
        yielded: set[tuple[int, int]] = set()
        current: _Entry | None = None
        waited = 0
        checked_at = 0  # ``waited`` at the last tail check of this silence
        while True:
            if current is not None and current.complete:
                yield from _row_values(part, where_, current, wide, digest)
                done_to = current.pos
                yielded.add(done_to)
                current = None
                if done_to >= end:
                    return
            mid_batch = current is not None and current.size is not None
            try:
                # The receiver queue is usually full: ask the broker whether anything is
                # left only when it runs dry, not once per entry (a round trip each).
                msg = reader.read_next(READ_POLL_MS)
            except pulsar.Timeout as e:
                # Never return part of (start, end]: end is at or before the latest entry
                # the driver saw, so entries are missing, not absent, and a skipped entry
                # would later look like a marker hole to the mapping builder (and be acked).
                # Unless the admin API says nothing left is for a reader to deliver.
                waited += READ_POLL_MS
                incomplete = current is not None and (current.size is None
                                                      or not current.complete)
                if waited - checked_at >= part.tail_check_ms and not (
                        incomplete and current is not None and current.size is not None):
                    checked_at = waited
                    after = current.pos if current is not None else done_to
                    if _nothing_to_deliver(part, after, end):
                        if current is not None:
                            yield from _row_values(part, where_, current, wide, digest)
                        return
                if waited >= part.read_timeout_ms:
                    more = "" if mid_batch else (
                        f" (the broker says more available: {reader.has_message_available()})")
                    raise EntriesReadError(
                        f"{where}: stopped before {end_pos}: no message within "
                        f"{part.read_timeout_ms} ms{more}; the task fails rather than "
                        f"return a partial range"
                    ) from e
                continue
            waited = checked_at = 0
            mid = msg.message_id()
            pos = (mid.ledger_id(), mid.entry_id())
            if pos <= done_to:
                if pos <= before or pos in yielded:
                    continue  # the start entry (batch index -1 compares low) or a re-delivery
                # Never yielded yet behind one that was: skipping it would leave a hole the
                # builder takes for a marker (and acks), so fail the task instead.
                raise EntriesReadError(f"{where}: entry {pos[0]}:{pos[1]} arrived after "
                                       f"{done_to[0]}:{done_to[1]}, out of order")
            if pos > end:
                break
            if current is not None:
                if pos == current.pos:
                    current.add(mid, msg)
                    continue
                # An entry ends here when its size is unknown, or when its batch was not
                # delivered whole: its digest then matches nothing, so it stays unmapped.
                yield from _row_values(part, where_, current, wide, digest)
                done_to = current.pos
                yielded.add(done_to)
            index = mid.batch_index()
            first = first_chunk_of(mid) if index < 0 else None
            current = _Entry(pos, 1 if index < 0 else batch_size_of(mid), mid, msg, index,
                             chunked=first is not None)
        if current is not None:
            if current.size is not None and not current.complete:
                raise EntriesReadError(
                    f"{where}: entry {current.pos[0]}:{current.pos[1]} ended after "
                    f"{len(current.messages)} of its {current.size} messages"
                )
            yield from _row_values(part, where_, current, wide, digest)
    finally:
        reader.close()


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


#: Heap freezes left in this worker process (see _freeze_worker_heap).
_FREEZES_LEFT = 2


def _freeze_worker_heap() -> None:
    """Keep the worker's long-lived objects out of the cyclic collector.

    A reused PySpark worker runs a full ``gc.collect()`` after every task, over every
    object it holds (pyspark, pyarrow, pandas, pulsar...): measured as the largest
    single cost of a warm worker. Those objects live as long as the process, so they
    are collected once and frozen, twice: at the first task, after our imports, and at
    the second, because the first task's own work loads more (pyspark imports pandas
    and about 340 other modules while it serializes the first batch: 32,000 objects
    that every later collection walked, 8-30 ms per task). After that the heap a task
    starts with stays the same size (measured), so there is nothing more to freeze.
    Each task's garbage is still collected after it; only the second freeze can catch
    objects of its own task, once, which bounds what it may keep.
    """
    global _FREEZES_LEFT
    if not _FREEZES_LEFT:
        return
    import pulsar  # noqa: F401 - loaded before the freeze: it lives as long as the worker

    to_arrow_schema(SCHEMA, timezone="UTC")
    gc.collect()
    gc.freeze()
    _FREEZES_LEFT -= 1


def arrow_batches(rows: Iterator[Row], columns: Sequence[str],
                  size: int = ARROW_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Rows -> Arrow record batches of the selected columns.

    Spark converts tuples a read() yields cell by cell in Python (a converter
    call per column per row); a record batch it passes through as it is.
    """
    schema = to_arrow_schema(schema_of(columns), timezone="UTC")
    picks = [COLUMNS.index(c) for c in schema.names]
    while True:
        chunk = list(itertools.islice(rows, size))
        if not chunk:
            return
        cols = list(zip(*chunk, strict=True))
        yield pa.RecordBatch.from_arrays(
            [pa.array(cols[i], type=f.type) for i, f in zip(picks, schema, strict=True)],
            schema=schema)


def packed_batches(batches: Iterator[pa.RecordBatch], cluster: str) -> Iterator[pa.RecordBatch]:
    """Each record batch as one row holding its Arrow IPC stream (``layout=arrow``).

    The stream is written into one buffer and handed on without a copy.
    """
    schema = to_arrow_schema(PACKED_SCHEMA, timezone="UTC")
    for rb in batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rb.schema) as w:
            w.write_batch(rb)
        blob = sink.getvalue()
        offsets = pa.array([0, blob.size], pa.int32()).buffers()[1]
        yield pa.RecordBatch.from_arrays(
            [pa.array([cluster]), pa.array([rb.num_rows], pa.int64()),
             pa.Array.from_buffers(pa.binary(), 1, [None, offsets, blob])], schema=schema)


def unpack(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The rows of a ``layout=arrow`` batch (``PACKED_SCHEMA`` rows), as one table of the
    selected columns; EntriesReadError if a row holds other columns (executors running
    another cursorsync version than the driver)."""
    schema = to_arrow_schema(schema_of(columns), timezone="UTC")
    parts = [pa.ipc.open_stream(blob.as_buffer()).read_all()
             for chunk in table.column("arrow").chunks for blob in chunk]
    for part in parts:
        if not part.schema.equals(schema):
            raise EntriesReadError(
                f"pulsar-entries layout=arrow: a row holds columns {part.schema.names}, "
                f"expected {schema.names}; are the executors on another cursorsync version "
                f"than the driver?")
    return pa.concat_tables(parts) if parts else schema.empty_table()


# -- the driver side ----------------------------------------------------------


def _first_entry_after(ledgers: Ledgers, position: Position) -> Position | None:
    """The first entry of the ledger list after ``position``, None if there is none."""
    for lid, n in zip(ledgers.ids.tolist(), ledgers.entries.tolist(), strict=True):
        if lid == position.ledger and position.entry + 1 < n:
            return Position(lid, position.entry + 1)
        if lid > position.ledger and n > 0:
            return Position(lid, 0)
    return None


def _nth_entry_after(ledgers: Ledgers, position: Position, k: int) -> Position | None:
    """The ``k``-th entry (k >= 1) of the ledger list after ``position``, None past its end."""
    for lid, n in zip(ledgers.ids.tolist(), ledgers.entries.tolist(), strict=True):
        if lid < position.ledger:
            continue
        first = position.entry + 1 if lid == position.ledger else 0
        here = max(0, n - first)
        if k <= here:
            return Position(lid, first + k - 1)
        k -= here
    return None


def allocate(available: Mapping[str, int | None], budget: int) -> dict[str, int]:
    """Share ``budget`` entries fairly over topics (None = unknown, unbounded).

    Water-filling in name order: each round gives every topic still wanting
    an equal share (at least 1), so small topics finish and leave the rest to
    the others. Deterministic for the same inputs.
    """
    alloc = {t: 0 for t in available}
    pending = sorted(t for t, a in available.items() if a is None or a > 0)
    remaining = budget
    while pending and remaining > 0:
        share = max(1, remaining // len(pending))
        still: list[str] = []
        for t in pending:
            if remaining == 0:
                break
            cap = available[t]
            want = share if cap is None else min(share, cap - alloc[t])
            give = min(want, remaining)
            alloc[t] += give
            remaining -= give
            if cap is None or alloc[t] < cap:
                still.append(t)
        pending = still
    return alloc


class PulsarEntriesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets, latest positions, admission control and retention acks."""

    def __init__(self, options: EntriesOptions) -> None:
        self.options = options
        self._client: Any = None
        self._consumers: dict[str, Any] = {}
        self._topics: list[str] | None = None
        self._discovered_at = 0.0
        self._available_now: dict[str, Position] | None = None
        #: Per topic, the ledger list the last latestOffset read for a range starting in
        #: another ledger than it ends: (start, ledgers). It sizes the ranges from that
        #: start (a restarted driver has none, and packs them as of unknown size).
        self._ledgers: dict[str, tuple[Position, Ledgers]] = {}

    # -- resources (driver only; never pickled with partitions) --

    def _pulsar(self) -> Any:
        if self._client is None:
            self._client = self.options.client.connect()
        return self._client

    def _consumer(self, topic: str) -> Any:
        c = self._consumers.get(topic)
        if c is None:
            import pulsar

            c = self._pulsar().subscribe(
                topic, self.options.subscription,
                consumer_type=pulsar.ConsumerType.Failover,
                receiver_queue_size=0,
                initial_position=pulsar.InitialPosition.Earliest,
            )
            self._consumers[topic] = c
        return c

    def topics(self) -> list[str]:
        """The concrete topic partitions, re-discovered every discoveryIntervalMs."""
        o = self.options
        now = time.monotonic()
        stale = now - self._discovered_at >= o.discovery_interval_ms / 1000.0
        if self._topics is None or (o.admin is not None and stale):
            if o.admin is None:
                names = sorted({str(TopicName.parse(t)) for t in o.topics})
            else:
                with AdminClient(o.admin) as admin:
                    found = admin.expand_topics(o.topics, namespace=o.namespace,
                                                pattern=o.topic_pattern)
                names = sorted(str(t) for t in found)
            self._topics = names
            self._discovered_at = now
        return list(self._topics)

    def latest_position(self, topic: str) -> Position:
        """The last dispatchable entry of the topic partition (the broker's last message id
        skips markers), BEFORE_ALL when it has none."""
        import pulsar

        try:
            mid = self._consumer(topic).get_last_message_id()
        except pulsar.PulsarException as e:
            raise EntriesReadError(
                f"cluster {self.options.cluster} topic {topic}: cannot get the last message "
                f"id: {e}") from e
        pos = Position(mid.ledger_id(), mid.entry_id())
        return BEFORE_ALL if pos.entry < 0 and pos.ledger < 0 else pos

    def _ledger_list(self, topic: str) -> Ledgers:
        assert self.options.admin is not None  # required by EntriesOptions.parse
        with AdminClient(self.options.admin) as admin:
            return admin.internal_stats(topic).ledgers

    # -- DataSourceStreamReader --

    def initialOffset(self) -> dict[str, Any]:
        topics = self.topics()
        if self.options.starting_position == "latest":
            return make_offset({t: self.latest_position(t) for t in topics})
        return make_offset({t: BEFORE_ALL for t in topics})

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: fix the target now; later entries wait for the next run."""
        self._available_now = {t: self.latest_position(t) for t in self.topics()}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_rows_per_batch
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = parse_offset(start)
        latest = dict(begin)
        if self._available_now is not None:
            for t, pos in self._available_now.items():
                latest[t] = max(latest.get(t, BEFORE_ALL), pos)
        else:
            for t in self.topics():
                latest.setdefault(t, BEFORE_ALL)  # a newly discovered partition: from its start
                latest[t] = max(latest[t], self.latest_position(t))
        if not isinstance(limit, ReadMaxRows):
            return make_offset(latest)
        return make_offset(self._limit(begin, latest, limit.max_rows))

    def _limit(self, begin: Mapping[str, Position], latest: Mapping[str, Position],
               budget: int) -> dict[str, Position]:
        available: dict[str, int | None] = {}
        first: dict[str, Position] = {}
        for t, hi in latest.items():
            lo = begin.get(t, BEFORE_ALL)
            if hi <= lo:
                available[t] = 0
            elif lo.ledger == hi.ledger:
                first[t] = Position(lo.ledger, lo.entry + 1)
                available[t] = hi.entry - lo.entry
            else:
                ledgers = self._ledger_list(t)
                self._ledgers[t] = (lo, ledgers)
                nxt = _first_entry_after(ledgers, lo)
                if nxt is None or nxt > hi:
                    available[t] = 0
                    continue
                first[t] = nxt
                available[t] = RangeSet.of((lo, hi)).count_entries(ledgers)
        shares = allocate(available, budget)
        out: dict[str, Position] = {}
        for t, hi in latest.items():
            lo = begin.get(t, BEFORE_ALL)
            k = shares.get(t, 0)
            if k <= 0:
                out[t] = lo
                continue
            seen = self._ledgers.get(t)
            if seen is not None and seen[0] == lo:
                # Across ledgers: the k-th entry after lo in the ledger list. A batch that
                # stopped at every ledger's end would be a ledger's worth at most.
                end = _nth_entry_after(seen[1], lo, k)
                out[t] = hi if end is None else min(hi, end)
            else:
                f = first[t]
                out[t] = min(hi, Position(f.ledger, f.entry + k - 1))
        return out

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        lo = parse_offset(start)
        hi = parse_offset(end)
        o = self.options
        return pack_ranges(self.ranges(lo, hi), o.entries_per_task, o.ranges_per_task)

    def ranges(self, lo: Mapping[str, Position], hi: Mapping[str, Position],
               ) -> list[EntriesPartition]:
        """(lo, hi] of every topic partition that has new entries, in topic order."""
        o = self.options
        return [
            EntriesPartition(
                cluster=o.cluster, topic=t, start=str(lo.get(t, BEFORE_ALL)), end=str(p),
                entries=self._size_hint(t, lo.get(t, BEFORE_ALL), p),
                admin=o.admin, tail_check_ms=o.tail_check_ms,
                client=o.client, identity_fields=o.identity_fields, identity=o.identity,
                per_entry=o.per_entry, columns=o.columns,
                receiver_queue_size=o.receiver_queue_size,
                identity_batched_only=o.identity_batched_only,
                identity_rows_only=o.identity_rows_only,
                position_evidence=o.position_evidence,
                packed=o.packed,
                source_position_property=o.source_position_property,
                read_timeout_ms=o.read_timeout_ms,
            )
            for t, p in sorted(hi.items())
            if p > lo.get(t, BEFORE_ALL)
        ]

    def _size_hint(self, topic: str, start: Position, end: Position) -> int | None:
        seen = self._ledgers.get(topic)
        if seen is None or seen[0] != start or start.ledger == end.ledger:
            return None
        return RangeSet.of((start, end)).count_entries(seen[1])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, EntriesTask)
        _freeze_worker_heap()
        first = partition.ranges[0]  # the output options are the same for every range
        rows = itertools.chain.from_iterable(read_entries(r) for r in partition.ranges)
        batches = arrow_batches(rows, first.columns)
        return packed_batches(batches, first.cluster) if first.packed else batches

    def commit(self, end: dict[str, Any]) -> None:
        """Ack ``end`` cumulatively on the mapping subscription: retention may drop it now."""
        import pulsar

        for t, pos in parse_offset(end).items():
            if pos.ledger < 0 or pos.entry < 0:
                continue
            mid = pulsar.MessageId(TopicName.parse(t).partition, pos.ledger, pos.entry, -1)
            try:
                self._consumer(t).acknowledge_cumulative(mid)
            except pulsar.PulsarException as e:
                # Retention only: the next commit acks further. Logged, not hidden.
                log.warning("cluster %s topic %s: cumulative ack of %s on subscription %s "
                            "failed: %s", self.options.cluster, t, pos,
                            self.options.subscription, e)

    def stop(self) -> None:
        for c in self._consumers.values():
            c.close()
        self._consumers.clear()
        if self._client is not None:
            self._client.close()
            self._client = None


class PulsarEntriesDataSource(DataSource):
    """``spark.readStream.format("pulsar-entries")``: one row per message of the topics."""

    @classmethod
    def name(cls) -> str:
        return "pulsar-entries"

    def schema(self) -> StructType:
        return output_schema(parse_columns(self.options.get("columns")),
                             parse_layout(Options(self.options)))

    def streamReader(self, schema: Any) -> PulsarEntriesStreamReader:
        return PulsarEntriesStreamReader(EntriesOptions.parse(self.options))
