"""``pulsar-entries``' columns and options, validated once on the driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

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
    parse_identity_fields,
)
from cursorsync.errors import ConfigError, CursorSyncError
from cursorsync.pulsar.admin import AdminSettings
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.options import Options
from cursorsync.pulsar.selection import Selection

#: A row as read() yields it, in SCHEMA order.
Row = tuple[Any, ...]

DEFAULT_SUBSCRIPTION = "cursorsync-mapping"
#: Pulsar's default receiver queue (messages).
DEFAULT_RECEIVER_QUEUE = 1000
#: Readers a worker process keeps open between ranges (option keptReaders; see
#: cursorsync.mapping.kept_readers): a thousand partitions on each of two clusters.
DEFAULT_KEPT_READERS = 2048
#: How long read() waits for its queue at a time.
READ_POLL_MS = 100
#: Silent this long short of the range's end: look up what is left (option tailCheckMs).
TAIL_CHECK_MS = 1000
#: How ranges are packed into Spark tasks (options entriesPerTask, rangesPerTask).
DEFAULT_ENTRIES_PER_TASK = 10_000
#: A range read on a kept reader takes about a millisecond, a Spark task's round trip to a
#: Python worker tens of them: at 1,000 partitions, 32 ranges a task left the two task
#: slots of the test bed idle for half of a batch's reads.
DEFAULT_RANGES_PER_TASK = 128

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
    # A chunked message's first chunk ("ledger:entry"; its row is at its last chunk).
    StructField("first_chunk", StringType()),
])
COLUMNS: tuple[str, ...] = tuple(SCHEMA.fieldNames())
#: What the mapping builder reads (option ``columns=evidence``).
EVIDENCE_COLUMNS: tuple[str, ...] = (
    "cluster", "topic", "partition", "ledger", "entry", "batch_index", "batch_size",
    "producer_name", "publish_time", "source_position", "entry_identity", "first_chunk",
)
#: Evidence columns filled only in rows whose entry is digested (identity alignment
#: orders those by producer and publish time): the digest reads these fields anyway, and
#: no other row pays for them.
DIGESTED_ONLY_COLUMNS = frozenset({"producer_name", "publish_time"})
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


class StartingPosition(StrEnum):
    """Option ``startingPosition``: where the first batch of a new checkpoint starts (a topic
    partition discovered later starts before its first entry either way)."""

    EARLIEST = "earliest"
    LATEST = "latest"


class EntriesReadError(CursorSyncError):
    """A topic partition could not be read between two offsets; names the topic and range."""


@dataclass(frozen=True)
class EntriesOptions:
    """Every option of ``pulsar-entries``, validated once on the driver."""

    cluster: str
    client: ClientSettings
    selection: Selection
    admin: AdminSettings | None
    subscription: str
    starting_position: StartingPosition
    max_rows_per_batch: int | None
    identity_fields: tuple[str, ...]
    identity: bool
    identity_batched_only: bool
    identity_rows_only: bool
    position_evidence: bool
    per_entry: bool
    columns: tuple[str, ...]
    receiver_queue_size: int
    kept_readers: int
    source_position_property: str
    read_timeout_ms: int
    tail_check_ms: int
    discovery_interval_ms: int
    entries_per_task: int = DEFAULT_ENTRIES_PER_TASK
    ranges_per_task: int = DEFAULT_RANGES_PER_TASK
    packed: bool = False
    #: Offsets carry a ``tick`` that moves when the mapping sink asks for a batch in this
    #: file (:mod:`cursorsync.wake`); None: never.
    wake_file: str | None = None
    #: Option ``pluginPositions``: the partitions' last positions, and the ledger lists of
    #: ranges across ledgers, from cursorsync's broker plugin, a request per broker (a
    #: consumer's GetLastMessageId, an internalStats, for any it does not list).
    plugin_positions: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> EntriesOptions:
        o = Options(raw)
        cluster = o.required("cluster")
        service_url = o.required("serviceUrl")
        if not service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise ConfigError(f"option serviceUrl: {service_url!r} is not a pulsar:// URL")
        text = o.get_str("selection")
        if text is not None:
            selection = Selection.from_option(text)
        else:
            topics, namespace, pattern = o.topic_selection()
            selection = Selection.of(topics, namespace=namespace, pattern=pattern)
        admin = o.admin(cluster, required=True)
        fields_spec = o.get_str("identityFields")
        return cls(
            cluster=cluster,
            client=o.client(service_url),
            selection=selection,
            admin=admin,
            subscription=o.get_str("subscription", DEFAULT_SUBSCRIPTION) or DEFAULT_SUBSCRIPTION,
            starting_position=StartingPosition(o.choice(
                "startingPosition", tuple(StartingPosition), StartingPosition.EARLIEST)),
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
            kept_readers=o.get_int("keptReaders", DEFAULT_KEPT_READERS, minimum=0) or 0,
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
            wake_file=o.get_str("wakeFile"),
            plugin_positions=o.get_bool("pluginPositions", False),
        )
