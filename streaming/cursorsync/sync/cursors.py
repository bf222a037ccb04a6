"""``pulsar-cursors``: a Spark streaming source of subscription cursor states (admin polling).

Each micro-batch polls the configured topics on the driver and yields one row
per (topic partition, subscription). Replicator cursors (``pulsar.repl.*``)
are not subscriptions and never appear. The cursors come from ``internalStats``
(``partitioned-internalStats`` for a partitioned topic of at most
WHOLE_READ_MAX_PARTITIONS partitions most of which are read). First the cheap
topic stats are asked (``partitioned-stats``, one request per partitioned topic): a
partition whose counters show no change since its internalStats were read
(:mod:`cursorsync.pulsar.topic_stats`) yields the rows read then, until
``internalStatsMaxAgeMs`` passes. With ``cursorDigests`` the source brokers' cursorsync
plugin is asked instead (:mod:`cursorsync.pulsar.cursor_digests`). A row's
``observed_at`` is when its state was read; ``checked_at`` is when it was last
confirmed: the read, or a later poll whose stats showed no change since. Only the read
is evidence of the state (the sync's continuity check uses ``observed_at``);
``checked_at`` measures how current it is.

A poll comes every ``pollIntervalMs`` (the query's trigger may tick more often: a tick
with no poll runs no batch), or sooner when the request number in ``wakeFile`` grows
(:mod:`cursorsync.sync.follow`). A poll that fails is tried again after the interval.

A poll cannot be repeated, so replays would not be deterministic. Each poll's rows are
therefore written to ``stateDir`` (e.g. next to the query's checkpoint) under their
offset before Spark sees them (:mod:`cursorsync.sync.stored_polls`), and
``readBetweenOffsets`` (Spark's replay path) returns the stored rows.
Offsets are ``{"version": 1, "seq": n}``; seq n is the n-th stored poll.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from cursorsync import wake
from cursorsync.errors import AdminUnavailableError, ConfigError, CursorSyncError
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.cursor_digests import (
    DigestPrint,
    cluster_digests,
    read_print,
    told_print,
)
from cursorsync.pulsar.options import Options
from cursorsync.pulsar.selection import EVERY, Selection
from cursorsync.pulsar.stats import TopicInternalStats
from cursorsync.pulsar.topic_stats import Fingerprint, fingerprint
from cursorsync.pulsar.topics import TopicName, namespaces_of
from cursorsync.sync import poll_health
from cursorsync.sync.follow import WAKE_MIN_GAP
from cursorsync.sync.poll_health import PollHealth
from cursorsync.sync.stored_polls import PollStore, Row, poll_offset, poll_sequence

log = logging.getLogger(__name__)

#: The most partitions whose internalStats are asked in one ``partitioned-internalStats``
#: request. The broker answers it in one piece, gathered from every partition: for 1,000
#: partitions it overran a 10 s admin timeout on the test bed, where 1,000 requests of one
#: partition each, 8 at a time, take about 1.2 s (``cursorsync-dev bench admin``).
WHOLE_READ_MAX_PARTITIONS = 100

#: With ``cursorDigests``, the partitions that moved are read from the brokers' plugin (one
#: request per broker and namespace, every partition it serves in the answer) once at least
#: this share of the polled partitions, and PLUGIN_STATS_MIN, moved; fewer are read one
#: internalStats request each. The plugin's answer with the cursors costs the broker about
#: 0.05 ms a partition it serves, an internalStats request 1.2-2 ms (``cursorsync-dev bench
#: admin --plugin``).
PLUGIN_STATS_SHARE = 0.05
PLUGIN_STATS_MIN = 8

#: Of ``pollIntervalMs``: how much sooner a poll may come (the query's trigger ticks a few
#: times per interval, and a tick a little early would put the poll off by a whole tick).
POLL_SLACK = 0.1

SCHEMA = (
    "cluster string, topic string, partition int, subscription string, "
    "mark_delete string, individually_deleted string, "
    "ledgers array<struct<ledger_id: long, entries: long>>, observed_at timestamp, "
    "messages_consumed_counter long, checked_at timestamp"
)

@dataclass(frozen=True)
class CursorsOptions:
    """Every option of ``pulsar-cursors``, validated once on the driver."""

    cluster: str
    admin: AdminSettings
    selection: Selection
    state_dir: str
    poll_interval_ms: int
    state_retention: int
    #: A partition's internalStats are read again at least this often even while its
    #: topic stats show no change (0: read every poll, no topic stats asked).
    internal_stats_max_age_ms: int = 60_000
    #: Requests to poll before the interval has passed (:mod:`cursorsync.sync.follow`).
    wake_file: str | None = None
    #: Ask the source brokers' cursorsync plugin which partitions moved (one request per
    #: broker and namespace) instead of the topic stats.
    cursor_digests: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> CursorsOptions:
        o = Options(raw)
        cluster = o.required("cluster")
        admin = o.admin(cluster, required=True)
        assert admin is not None
        text = o.get_str("selection")
        if text is not None:
            selection = Selection.from_option(text)
        else:
            topics, namespace, pattern = o.topic_selection()
            subs = o.get_list("subscriptions")
            if not subs:
                raise ConfigError("option subscriptions is required (a list, or * for every "
                                  "one), or option selection")
            selection = Selection.of(topics, namespace=namespace, pattern=pattern,
                                     subscriptions=subs)
        return cls(
            cluster=cluster,
            admin=admin,
            selection=selection,
            state_dir=o.required("stateDir"),
            poll_interval_ms=o.get_int("pollIntervalMs", 0, minimum=0) or 0,
            state_retention=o.get_int("stateRetention", 100, minimum=1) or 100,
            internal_stats_max_age_ms=o.get_int("internalStatsMaxAgeMs", 60_000, minimum=0)
            or 0,
            wake_file=o.get_str("wakeFile"),
            cursor_digests=o.get_bool("cursorDigests", False),
        )


def rows_from_stats(cluster: str, stats: TopicInternalStats, subscriptions: Sequence[str],
                    observed_at: datetime) -> list[Row]:
    """One row per wanted subscription of one topic partition (``*`` = every subscription);
    a wanted subscription the topic does not have yet gives no row."""
    topic = TopicName.parse(stats.topic)
    ledgers = [(int(i), int(n)) for i, n in
               zip(stats.ledgers.ids.tolist(), stats.ledgers.entries.tolist(), strict=True)]
    every = "*" in subscriptions
    rows = []
    for name in sorted(stats.subscriptions):
        if not every and name not in subscriptions:
            continue
        cs = stats.subscriptions[name]
        rows.append((
            cluster, str(topic.base), topic.partition, name, str(cs.state.mark_delete),
            str(cs.state.individually_deleted), ledgers, observed_at,
            cs.messages_consumed_counter, observed_at,
        ))
    return rows


#: How often a poll's success is written down at most (failures: every time).
HEALTH_EVERY_S = 10.0


def _wanted(subscriptions: Sequence[str]) -> Sequence[str] | None:
    return None if EVERY in subscriptions else subscriptions


@dataclass(frozen=True)
class _Known:
    fingerprint: Fingerprint | DigestPrint
    due: float
    rows: list[Row]


class PulsarCursorsStreamReader(SimpleDataSourceStreamReader):
    """Polls on the driver; every poll is stored before it is handed to Spark."""

    def __init__(self, options: CursorsOptions) -> None:
        self.options = options
        self.store = PollStore(options.state_dir)
        self._last_poll = 0.0
        #: The last request to poll early taken (:mod:`cursorsync.sync.follow`).
        self._woken = 0 if options.wake_file is None else wake.requested(options.wake_file)
        #: Per topic partition: its stats' fingerprint when its internalStats were last
        #: read, when they must be read again at the latest, and the rows they gave.
        self._known: dict[str, _Known] = {}
        self.clock = time.monotonic
        #: Of the last poll: partitions whose internalStats were read, and those whose
        #: rows were carried over because their topic stats had not changed.
        self.partitions_read = 0
        self.partitions_unchanged = 0
        #: Polls whose moved partitions were read from the brokers' plugin.
        self.plugin_reads = 0
        #: The brokers' plugin did not answer the last poll's digests (warned once).
        self._no_digests = False
        self.health = poll_health.read(self.store.dir) or PollHealth()
        #: One admin client for every poll, opened at the first: a new one costs a TLS
        #: context (about 30 ms of CPU, TLS or not) and new connections each poll. It is
        #: closed with the worker process (Spark does not pass ``stop`` on to a simple
        #: reader); a connection the broker dropped is opened again by the client.
        self._admin: AdminClient | None = None

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.options.admin)
        return self._admin

    def _note(self, health: PollHealth) -> None:
        """Keep the polls' health for ``status``: at every change, and a success's time
        every HEALTH_EVERY_S at most."""
        before = self.health
        if (not before.failing and not health.failing and before.ok_at and health.ok_at
                and (health.ok_at - before.ok_at).total_seconds() < HEALTH_EVERY_S):
            return  # the file's success time stands
        self.health = health
        try:
            poll_health.write(self.store.dir, health)
        except OSError as err:
            log.warning("cursor poll health not kept in %s: %s", self.store.dir, err)

    def poll(self) -> list[Row]:
        """One poll of every configured topic, concurrently. With
        ``internalStatsMaxAgeMs``, the cheap topic stats come first and only the partitions
        they show changed (or not read for that long) have their internalStats read."""
        o = self.options
        admin = self._admin_client()
        explicit = [TopicName.parse(t.topic) for t in o.selection.topics]
        concrete = [t for t in explicit if t.partition >= 0]
        bases = [t for t in explicit if t.partition < 0]
        for n in o.selection.namespaces:
            concrete.extend(admin.expand_topics((), namespace=n.namespace, pattern=n.regex))
        counts = admin.map_concurrently(admin.partitions, bases)
        partitioned = [t for t in bases if counts[str(t)] > 0]
        concrete.extend(t for t in bases if counts[str(t)] == 0)
        if o.internal_stats_max_age_ms:
            return self._poll_changed(admin, {t: counts[str(t)] for t in partitioned},
                                      concrete)
        stats: list[TopicInternalStats] = []
        whole = [t for t in partitioned if counts[str(t)] <= WHOLE_READ_MAX_PARTITIONS]
        for p in admin.map_concurrently(admin.partitioned_internal_stats, whole).values():
            stats.extend(p.stats.values())
        concrete.extend(t.with_partition(i) for t in partitioned if t not in whole
                        for i in range(counts[str(t)]))
        seen = {s.topic for s in stats}
        todo = sorted({t for t in concrete if str(t) not in seen})
        stats.extend(admin.internal_stats_many(todo).values())
        observed_at = datetime.now(tz=UTC)
        rows: list[Row] = []
        for s in sorted(stats, key=lambda s: s.topic):
            rows.extend(rows_from_stats(o.cluster, s, o.selection.subscriptions_of(s.topic),
                                        observed_at))
        self.partitions_read, self.partitions_unchanged = len(stats), 0
        return rows

    def _poll_changed(self, admin: AdminClient, partitioned: dict[TopicName, int],
                      concrete: list[TopicName]) -> list[Row]:
        """A poll that asks the topic stats first: only the partitions they show changed,
        or not read for internalStatsMaxAgeMs, have their internalStats read."""
        o = self.options
        # Before the stats are asked: what they show unchanged is unchanged since then.
        checked_at = datetime.now(tz=UTC)
        told = self._told(admin, partitioned, concrete) if o.cursor_digests else None
        if told is not None:
            subs = {n: o.selection.subscriptions_of(n) for n in told}
            prints: dict[str, Any] = told
        else:
            docs = self._topic_stats(admin, partitioned, concrete)
            # Taken before the internalStats are read: a change in between shows next time.
            subs = {n: o.selection.subscriptions_of(n) for n in docs}
            prints = {n: fingerprint(n, d, _wanted(subs[n])) for n, d in docs.items()}
        now = self.clock()

        def unchanged(name: str) -> bool:
            known = self._known.get(name)
            return (known is not None and prints[name] is not None
                    and prints[name] == known.fingerprint and now < known.due)

        stale = {n for n in prints if not unchanged(n)}
        stats = self._from_plugin(admin, stale, len(prints)) if told is not None else {}
        stats.update(self._read(admin, partitioned, sorted(stale - stats.keys())))
        observed_at = datetime.now(tz=UTC)
        rows: list[Row] = []
        for name in sorted(prints):
            read = stats.get(name)
            if read is None:
                known = self._known.get(name)
                if known is not None and name not in stale:
                    # The rows as read, with when they were read: a source topic deleted
                    # and created since is judged against that time (see SyncStep), never
                    # a later one the stats only suggest. The check is this poll's.
                    rows.extend((*r[:-1], checked_at) for r in known.rows)
                else:  # in the stats, not in the internalStats (a partition being made)
                    log.debug("%s: no internalStats this poll", name)
                continue
            got = rows_from_stats(o.cluster, read, subs[name], observed_at)
            rows.extend(got)
            self._remember(name, prints[name] if told is None else read_print(
                read, _wanted(subs[name]), prints[name]), got, now)
        for gone in self._known.keys() - prints.keys():
            del self._known[gone]
        self.partitions_read = len(stats)
        self.partitions_unchanged = len(prints) - len(stale)
        log.debug("cursor poll of %s: %d partitions read, %d unchanged", o.cluster,
                  self.partitions_read, self.partitions_unchanged)
        return rows

    def _told(self, admin: AdminClient, partitioned: dict[TopicName, int],
              concrete: list[TopicName]) -> dict[str, DigestPrint | None] | None:
        """What the source brokers' plugin says of every partition polled (None for one no
        broker lists: it is read); None when the plugin cannot be asked (the topic stats
        are asked instead)."""
        names = sorted({*(str(t.with_partition(i)) for t, n in partitioned.items()
                          for i in range(n)), *(str(t) for t in concrete)})
        try:
            digests = cluster_digests(admin, namespaces_of(names))
        except CursorSyncError as err:
            # Once until they answer again: every poll would say it again.
            log.log(logging.DEBUG if self._no_digests else logging.WARNING,
                    "cluster %s: no cursor digests from its brokers' plugin (%s); the topic "
                    "stats are asked instead until it answers", self.options.cluster, err)
            self._no_digests = True
            return None
        if self._no_digests:
            log.info("cluster %s: its brokers' plugin answers the cursor digests again",
                     self.options.cluster)
            self._no_digests = False
        return {n: told_print(digests.get(n), _wanted(self.options.selection.subscriptions_of(n)))
                for n in names}

    def _from_plugin(self, admin: AdminClient, stale: set[str], polled: int,
                     ) -> dict[str, TopicInternalStats]:
        """internalStats of the stale partitions from the brokers' plugin, when enough of
        the polled partitions moved to be worth it (PLUGIN_STATS_SHARE): one request per
        broker and namespace then answers for every partition it serves with what
        internalStats would show of its ledgers and durable cursors. A partition it does not
        answer for, or whose stats lack the entry count and size (an older plugin), is left
        out: it is read on its own."""
        if len(stale) < max(PLUGIN_STATS_MIN, PLUGIN_STATS_SHARE * polled):
            return {}
        try:
            found = cluster_digests(admin, namespaces_of(stale), stats=True)
        except CursorSyncError as err:
            log.warning("cluster %s: no cursor stats from its brokers' plugin (%s); the "
                        "partitions that moved are read one by one", self.options.cluster, err)
            return {}
        out: dict[str, TopicInternalStats] = {}
        for name in stale:
            digest = found.get(name)
            read = None if digest is None else digest.stats
            if read is not None and read.number_of_entries is not None and (
                    read.total_size is not None):
                out[name] = read
        self.plugin_reads += 1
        return out

    @staticmethod
    def _topic_stats(admin: AdminClient, partitioned: dict[TopicName, int],
                     concrete: list[TopicName]) -> dict[str, Any]:
        """The topic stats of every partition, by concrete topic name: a partitioned
        topic's in one request."""
        docs: dict[str, Any] = {}
        for found in admin.map_concurrently(admin.partitioned_topic_stats,
                                            partitioned).values():
            docs.update(found)
        docs.update(admin.map_concurrently(
            admin.topic_stats, sorted({t for t in concrete if str(t) not in docs})))
        return docs

    def _remember(self, name: str, fp: Fingerprint | DigestPrint | None, rows: list[Row],
                  now: float) -> None:
        """A partition's internalStats were read now, and gave ``rows``: they stand for the
        partition while its stats show ``fp``, for up to internalStatsMaxAgeMs."""
        if fp is None:
            self._known.pop(name, None)
            return
        # Spread over half the age to one age, so that partitions read together at a start
        # are not all read again in one poll.
        spread = 0.5 + (zlib.crc32(name.encode()) % 1000) / 2000
        max_age = self.options.internal_stats_max_age_ms / 1000
        self._known[name] = _Known(fp, now + max_age * spread, rows)

    @staticmethod
    def _read(admin: AdminClient, partitioned: dict[TopicName, int], stale: list[str],
              ) -> dict[str, TopicInternalStats]:
        """internalStats of the stale partitions: of a partitioned topic most of whose
        partitions are stale (a start) in one request, up to WHOLE_READ_MAX_PARTITIONS
        partitions; the others one by one, concurrently."""
        of_base: dict[str, list[str]] = {}
        for name in stale:
            of_base.setdefault(str(TopicName.parse(name).base), []).append(name)
        whole = [t for t, n in partitioned.items()
                 if 2 * len(of_base.get(str(t), ())) > n and n <= WHOLE_READ_MAX_PARTITIONS]
        out: dict[str, TopicInternalStats] = {}
        for p in admin.map_concurrently(admin.partitioned_internal_stats, whole).values():
            out.update(p.stats)
        out.update(admin.internal_stats_many([n for n in stale if n not in out]))
        return out

    def initialOffset(self) -> dict[str, Any]:
        return poll_offset(0)

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Row], dict[str, Any]]:
        seq = poll_sequence(start)
        now = self.clock()
        if self._last_poll and not self._due(now - self._last_poll):
            return iter(()), start
        try:
            rows = self.poll()
        except AdminUnavailableError as err:
            # Nothing new this time: polled again after the interval.
            log.warning("cursor poll of cluster %s skipped: %s", self.options.cluster, err)
            self._note(self.health.failed(datetime.now(tz=UTC), str(err)))
            self._last_poll = now
            return iter(()), start
        self._note(self.health.succeeded(datetime.now(tz=UTC)))
        self._last_poll = now
        self.store.write(seq + 1, rows)
        return iter(rows), poll_offset(seq + 1)

    def _due(self, since_s: float) -> bool:
        """Whether a poll is due ``since_s`` after the last: the interval has passed (within
        POLL_SLACK: the query's trigger ticks a few times per interval), or a request to poll
        early came at least half an interval after the last poll."""
        interval = self.options.poll_interval_ms / 1000
        if since_s >= interval * (1 - POLL_SLACK):
            return True
        path = self.options.wake_file
        if path is None or since_s < interval * WAKE_MIN_GAP:
            return False
        asked = wake.requested(path)
        if asked <= self._woken:
            return False
        self._woken = asked
        return True

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Row]:
        lo, hi = poll_sequence(start), poll_sequence(end)
        rows: list[Row] = []
        for seq in range(lo + 1, hi + 1):
            rows.extend(self.store.read(seq))
        return iter(rows)

    def commit(self, end: dict[str, Any]) -> None:
        self.store.prune(poll_sequence(end) - self.options.state_retention)


class PulsarCursorsDataSource(DataSource):
    """``spark.readStream.format("pulsar-cursors")``: polled subscription cursor states."""

    @classmethod
    def name(cls) -> str:
        return "pulsar-cursors"

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema: Any) -> PulsarCursorsStreamReader:
        return PulsarCursorsStreamReader(CursorsOptions.parse(self.options))
