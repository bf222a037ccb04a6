"""``pulsar-entries``: a Spark streaming source of the messages of a set of Pulsar topics.

The data source and its driver side live here; options in ``entries_options``, offsets
and tasks in ``entries_tasks``, rows in ``entries_rows``, the executors' reading in
``entries_read``.

One row per message, never the payload itself: its size and an identity
digest (cursorsync.core.identity) are what the mapping builder needs.

Offsets: ``{"version": 1, "positions": {"<topic partition>": "L:E", ...}}``
(keys sorted), the last entry included per topic partition; ``"-1:-1"`` is
"before every entry". A batch reads the entries in (start, end], start
exclusive and end inclusive, always whole entries, so a batched entry is
never split between two batches. With the ``wakeFile`` option an offset may also
carry ``"tick": n``, which moves when the mapping sink asks for a batch
(:mod:`cursorsync.wake`): then a batch runs with no new entries.

Where things run: the driver finds the latest
positions with a durable, zero-queue subscription consumer per topic
partition (``get_last_message_id``), or with ``pluginPositions`` from
cursorsync's broker plugin (one request per broker and namespace; a partition
it does not list is asked on its consumer; the ledger lists that size ranges
across ledgers as well), and acknowledges ``end``
cumulatively on the consumer in ``commit(end)``, so retention keeps every
entry not mapped yet.
Executors read with a pulsar-client Reader created inside ``read()``.

Pinned behaviour (tests/integration/mapping/test_entries_reading.py): a Reader started at ``L:E:-1``
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
or a chunk, the range is complete (chunks are mapped one by one by the hole
check, as skipped ids); anything else is waited for, up to ``readTimeoutMs``.

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
``PACKED_SCHEMA``: cluster, rows, arrow); ``unpack_batches`` turns a batch of them back
into the rows. The mapping sink takes its batch to the driver as Arrow at once
(``toArrow``), so Spark's per-row work (Arrow -> rows on the executors, rows ->
Arrow again for the collect) bought nothing there (``cursorsync-dev bench layout``
measures the JVM's CPU on both paths). Offsets, admission control, tasks and replay
are the same in both layouts.

Admission control (``maxRowsPerBatch``, or Spark's ReadMaxRows): the budget
is counted in ENTRIES, shared fairly across topic partitions; an entry holds
at least one message, so a batch of batched entries has more rows than the
budget (the driver cannot count messages without reading them).

Tasks: small ranges share a Spark task (``entriesPerTask``, default 10,000
entries, and ``rangesPerTask``, default 128), up to 4 at once; a range
is never split, and one of ``entriesPerTask`` entries or more has a task of its
own (:func:`cursorsync.mapping.entries_tasks.pack_ranges`). A range that spans
ledgers is sized from the topic's ledger list (admin ``internalStats``), which
the driver reads for admission control anyway.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from cursorsync import wake
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.mapping.entries_options import (
    EntriesOptions,
    EntriesReadError,
    StartingPosition,
    output_schema,
    parse_columns,
    parse_layout,
)
from cursorsync.mapping.entries_read import freeze_worker_heap, read_ranges
from cursorsync.mapping.entries_rows import arrow_batches, pack_batches
from cursorsync.mapping.entries_tasks import (
    BEFORE_ALL,
    EntriesPartition,
    EntriesTask,
    allocate,
    entries_offset,
    entries_positions,
    first_entry_after,
    nth_entry_after,
    pack_ranges,
)
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.cursor_digests import PluginCursorStats
from cursorsync.pulsar.dispatchable import PluginPositions
from cursorsync.pulsar.options import Options
from cursorsync.pulsar.stats import TopicInternalStats
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)

#: How long the last message id is asked for again while the broker answers with a
#: transient error (an unloaded topic's consumer reconnecting) before the batch fails.
LAST_ID_RETRY_S = 30.0


class PulsarEntriesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets, latest positions, admission control and retention acks."""

    def __init__(self, options: EntriesOptions) -> None:
        self.options = options
        self._client: Any = None
        #: One admin client for the reader's life: a client is a TLS context and a
        #: connection pool, too dear to make per request at every trigger.
        self._admin: AdminClient | None = None
        self._consumers: dict[str, Any] = {}
        self._topics: list[str] | None = None
        self._discovered_at = 0.0
        self._available_now: dict[str, Position] | None = None
        #: Per topic, the ledger list the last latestOffset read for a range starting in
        #: another ledger than it ends: (start, ledgers). It sizes the ranges from that
        #: start (a restarted driver has none, and packs them as of unknown size).
        self._ledgers: dict[str, tuple[Position, Ledgers]] = {}
        self._plugin_positions: PluginPositions | None = None
        self._ledger_plugin: PluginCursorStats | None = None
        #: Per topic, the position the last commit acked.
        self._committed: dict[str, Position] = {}

    # -- resources (driver only; never pickled with partitions) --

    def _pulsar(self) -> Any:
        if self._client is None:
            self._client = self.options.client.connect()
        return self._client

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            assert self.options.admin is not None  # required by EntriesOptions.parse
            self._admin = AdminClient(self.options.admin)
        return self._admin

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
        if self._topics is None or stale:
            self._topics = sorted(str(t) for t in o.selection.expand(self._admin_client()))
            self._discovered_at = now
        return list(self._topics)

    def latest_position(self, topic: str) -> Position:
        """The last dispatchable entry of the topic partition (the broker's last message id
        skips markers), BEFORE_ALL when it has none."""
        import pulsar

        # A topic unloaded (the brokers' load balancing moves bundles all the time) answers
        # "consumer not found" or not at all until its consumer has reconnected.
        transient = (pulsar.BrokerMetadataError, pulsar.ConsumerNotFound, pulsar.NotConnected,
                     pulsar.Timeout, pulsar.ConnectError, pulsar.ServiceUnitNotReady,
                     pulsar.LookupError, pulsar.TooManyLookupRequestException)
        retrying = Retrying(stop=stop_after_delay(LAST_ID_RETRY_S),
                            wait=wait_exponential(multiplier=0.2, max=2.0),
                            retry=retry_if_exception_type(transient), reraise=True)
        try:
            mid = retrying(lambda: self._consumer(topic).get_last_message_id())
        except pulsar.PulsarException as e:
            raise EntriesReadError(
                f"cluster {self.options.cluster} topic {topic}: cannot get the last message "
                f"id: {e}") from e
        return _dispatchable(Position(mid.ledger_id(), mid.entry_id()))

    def latest_positions(self, topics: Sequence[str]) -> dict[str, Position]:
        """:meth:`latest_position` of each topic partition: with ``pluginPositions``, those
        the brokers' plugin lists from its answers (a request per broker); the rest asked on
        up to the admin's ``max_workers`` threads (one round trip to a broker each: one
        after the other, a thousand partitions take seconds)."""
        if not topics:
            return {}
        self._pulsar()  # opened once, before the threads share it
        listed = self._plugin().read(topics) if self.options.plugin_positions else {}
        # Every partition has its mapping subscription (what retention keeps) from the
        # trigger that first reads it, whoever answers its position.
        rest = [t for t in topics if t not in listed]
        new = [t for t in listed if t not in self._consumers]
        asked: dict[str, Position] = {}
        if rest or new:
            assert self.options.admin is not None  # required by EntriesOptions.parse
            workers = min(self.options.admin.max_workers, max(len(rest), len(new)))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                asked = dict(zip(rest, pool.map(self.latest_position, rest), strict=True))
                list(pool.map(self._consumer, new))
        if listed:
            log.debug("cluster %s: last positions of %d partitions from the plugin, %d from "
                      "their consumers", self.options.cluster, len(listed), len(asked))
        return {t: asked[t] if t in asked else _dispatchable(listed[t]) for t in topics}

    def _plugin(self) -> PluginPositions:
        if self._plugin_positions is None:
            self._plugin_positions = PluginPositions(self._admin_client())
        return self._plugin_positions

    def _ledger_lists(self, topics: Sequence[str]) -> dict[str, Ledgers]:
        """Each topic partition's ledger list (a batch after ledgers rolled everywhere asks
        for most partitions'): with ``pluginPositions`` from the brokers' plugin, a request
        per broker and namespace; the rest read concurrently, an internalStats each."""
        admin = self._admin_client()
        listed: dict[str, TopicInternalStats] = {}
        if self.options.plugin_positions:
            # Every partition read has the mapping subscription (latest_positions made it);
            # asking for its cursor alone keeps the answer small.
            listed = self._plugin_stats().read(
                {t: (self.options.subscription,) for t in topics})
        rest = [t for t in topics if t not in listed]
        lists = (admin.map_concurrently(lambda t: admin.internal_stats(t).ledgers, rest)
                 if rest else {})
        if listed:
            log.debug("cluster %s: ledger lists of %d partitions from the plugin, %d from "
                      "internalStats", self.options.cluster, len(listed), len(rest))
        return {t: listed[t].ledgers if t in listed else lists[str(TopicName.parse(t))]
                for t in topics}

    def _plugin_stats(self) -> PluginCursorStats:
        if self._ledger_plugin is None:
            self._ledger_plugin = PluginCursorStats(self._admin_client(), "the ledger lists")
        return self._ledger_plugin

    # -- DataSourceStreamReader --

    def initialOffset(self) -> dict[str, Any]:
        topics = self.topics()
        if self.options.starting_position is StartingPosition.LATEST:
            return entries_offset(self.latest_positions(topics))
        return entries_offset({t: BEFORE_ALL for t in topics})

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: fix the target now; later entries wait for the next run."""
        self._available_now = self.latest_positions(self.topics())

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_rows_per_batch
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        end = self._latest_offset(start, limit)
        tick = int((json.loads(start) if isinstance(start, str) else start).get("tick") or 0)
        path = self.options.wake_file
        if path is not None and self._available_now is None:
            tick = max(tick, wake.requested(path))  # a larger one: a batch without entries
        if tick:
            end["tick"] = tick
        return end

    def _latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = entries_positions(start)
        latest = dict(begin)
        if self._available_now is not None:
            for t, pos in self._available_now.items():
                latest[t] = max(latest.get(t, BEFORE_ALL), pos)
        else:
            for t, pos in self.latest_positions(self.topics()).items():
                # A newly discovered partition: from its start.
                latest[t] = max(latest.get(t, BEFORE_ALL), pos)
        if not isinstance(limit, ReadMaxRows):
            return entries_offset(latest)
        return entries_offset(self._limit(begin, latest, limit.max_rows))

    def _limit(self, begin: Mapping[str, Position], latest: Mapping[str, Position],
               budget: int) -> dict[str, Position]:
        """Where each topic's share of ``budget`` entries after ``begin`` ends."""
        available, first = self._available(begin, latest)
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
                end = nth_entry_after(seen[1], lo, k)
                out[t] = hi if end is None else min(hi, end)
            else:
                f = first[t]
                out[t] = min(hi, Position(f.ledger, f.entry + k - 1))
        return out

    def _available(self, begin: Mapping[str, Position], latest: Mapping[str, Position],
                   ) -> tuple[dict[str, int | None], dict[str, Position]]:
        """Per topic, the entries in (begin, latest] and the first of them (topics with
        none have no first); a range across ledgers is counted on the ledger list, kept
        for :meth:`_limit` and the size hints."""
        available: dict[str, int | None] = {}
        first: dict[str, Position] = {}
        across = [t for t, hi in latest.items()
                  if hi > begin.get(t, BEFORE_ALL) and begin.get(t, BEFORE_ALL).ledger != hi.ledger]
        lists = self._ledger_lists(across) if across else {}
        for t, hi in latest.items():
            lo = begin.get(t, BEFORE_ALL)
            if hi <= lo:
                available[t] = 0
            elif lo.ledger == hi.ledger:
                first[t] = Position(lo.ledger, lo.entry + 1)
                available[t] = hi.entry - lo.entry
            else:
                ledgers = lists[t]
                self._ledgers[t] = (lo, ledgers)
                nxt = first_entry_after(ledgers, lo)
                if nxt is None or nxt > hi:
                    available[t] = 0
                    continue
                first[t] = nxt
                available[t] = RangeSet.of((lo, hi)).count_entries(ledgers)
        return available, first

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        lo = entries_positions(start)
        hi = entries_positions(end)
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
                kept_readers=o.kept_readers,
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
        freeze_worker_heap()
        first = partition.ranges[0]  # the output options are the same for every range
        rows = read_ranges(partition.ranges)
        batches = arrow_batches(rows, first.columns)
        return pack_batches(batches, first.cluster) if first.packed else batches

    def commit(self, end: dict[str, Any]) -> None:
        """Ack ``end`` cumulatively on the mapping subscription: retention may drop it now."""
        import pulsar

        for t, pos in entries_positions(end).items():
            # A partition without new entries was acked as far in an earlier commit.
            if pos.ledger < 0 or pos.entry < 0 or self._committed.get(t) == pos:
                continue
            mid = pulsar.MessageId(TopicName.parse(t).partition, pos.ledger, pos.entry, -1)
            try:
                self._consumer(t).acknowledge_cumulative(mid)
                self._committed[t] = pos
            except pulsar.PulsarException as e:
                # Retention only: the next commit acks further. Logged, not hidden.
                log.warning("cluster %s topic %s: cumulative ack of %s on subscription %s "
                            "failed: %s", self.options.cluster, t, pos,
                            self.options.subscription, e)

    def stop(self) -> None:
        for c in self._consumers.values():
            c.close()
        self._consumers.clear()
        self._committed.clear()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def _dispatchable(pos: Position) -> Position:
    """A broker's last dispatchable position as an offset: BEFORE_ALL for none."""
    return BEFORE_ALL if pos.entry < 0 and pos.ledger < 0 else pos


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
