"""A probe subscription on each target partition: the broker's own word on what it filtered.

As a broker dispatches to a subscription it acks there, itself, the entries it filters
out (markers, aborted transactions' messages and markers, unreadable entries). The probe
reads each target partition on a durable subscription of its own and acks only
cumulatively, up to what the mapping has read; past that position its cursor holds as
acked exactly what the broker filtered (:mod:`cursorsync.core.filtered`), which one
internalStats request per partition reads for every id a target reader skipped.

Anything else that acks on the probe's subscription would pass for a filter: message
expiry (TTL), backlog-quota eviction, an operator's skip, clear-backlog, expire or reset
on it. A topic whose applied policies have the first two (read when its probe is placed
and every :data:`HAZARD_CHECK_S`) is not probed; a message the probe received and then
finds acked without having acked it shows the third. Either way the partition's probe is
trusted no more in this process (:attr:`ProbeStats.disturbed`) and its skipped ids go to
the per-id check.

With cursorsync's broker plugin on the target's brokers (``plugin``), the probe cursors
are read from it: one request per broker and namespace returns what those internalStats
requests would of the probe's cursor and the ledgers
(:class:`cursorsync.pulsar.cursor_digests.PluginCursorStats`). A partition it does not
answer for is read on its own, and so is every partition for a while after the plugin
could not be asked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.cursor_digests import PluginCursorStats
from cursorsync.pulsar.stats import TopicInternalStats
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)

#: The probe's subscription on every target partition (``evidence.holes: probe``).
PROBE_SUBSCRIPTION = "cursorsync-probe"
#: How often a probed topic's expiry and backlog-quota policies are read again.
HAZARD_CHECK_S = 60.0
#: How many messages each probe consumer may hold unread: the broker dispatches no
#: further than this ahead of the listener.
PROBE_QUEUE = 1000
#: Probes placed at once: each placement is a subscribe and a seek (after which the client
#: reconnects the consumer), which a thousand partitions would otherwise wait for one after
#: another. A busy broker takes a second or more for one, waiting rather than working: at
#: 1,000 partitions on the test bed 16 at once placed 14-38 a second, 64 at once 19-57.
PLACE_WORKERS = 64


@dataclass
class ProbeStats:
    """Totals since start, for logs and metrics."""

    #: Probe cursors read one internalStats request each.
    cursor_reads: int = 0
    seeks: int = 0
    #: Partitions whose probe found a received message acked by someone else.
    disturbed: int = 0
    #: Placements the broker did not answer in time (or a lost connection): tried again
    #: when the partition is next asked about.
    place_failures: int = 0


@dataclass
class CursorRead:
    """A probe cursor as read: what it holds acked, after which position the probe vouches
    that it acked nothing, and the entry counts of the partition's ledgers."""

    acked: RangeSet
    own: Position
    sizes: dict[int, int]


@dataclass
class _Probe:
    consumer: Any
    #: Nothing after this position was acked by the probe (its seek point or last ack);
    #: None until the probe is placed.
    own: Position | None = None
    #: The last position received since the probe was placed.
    received: Position | None = None
    #: Positions received after ``own``: acked by anyone else, the probe is disturbed.
    delivered: list[Position] = field(default_factory=list)
    trusted: bool = True


def dispatch_hazards(admin: AdminClient, topic: str) -> list[str]:
    """What besides the broker's filter could ack on a probe subscription of ``topic``, as
    its applied policies say (message expiry, backlog eviction); unknown counts."""
    t = TopicName.parse(topic).base
    unknown = lambda r: r.status_code in (405, 412)  # noqa: E731 - topic policies off
    out = []
    ttl = admin.get_json(t.admin_path("messageTTL") + "?applied=true", f"message TTL of {t}",
                         missing_ok=True, none_if=unknown)
    if not isinstance(ttl, int):
        out.append("its message TTL cannot be read (topic policies off)")
    elif ttl > 0:
        out.append(f"a message TTL of {ttl} s")
    quotas = admin.get_json(t.admin_path("backlogQuotaMap") + "?applied=true",
                            f"backlog quotas of {t}", missing_ok=True, none_if=unknown)
    if not isinstance(quotas, dict):
        out.append("its backlog quotas cannot be read (topic policies off)")
        return out
    for kind, quota in sorted(quotas.items()):
        if not isinstance(quota, dict) or quota.get("policy") != "consumer_backlog_eviction":
            continue
        limits = [quota.get(k) for k in ("limit", "limitSize", "limitTime")]
        if any(isinstance(v, int) and v > 0 for v in limits):
            out.append(f"a {kind} backlog quota with consumer_backlog_eviction")
    return out


class DispatchProbe:
    """Probe consumers on the target's partitions, opened on first use."""

    def __init__(self, client: Any, admin: AdminClient, subscription: str, *,
                 plugin: bool = False) -> None:
        self._client, self.admin, self.subscription = client, admin, subscription
        self._plugin = PluginCursorStats(admin, "the probe cursors", enabled=plugin)
        self.stats = ProbeStats()
        self._lock = threading.Lock()
        self._probes: dict[str, _Probe] = {}
        self._hazards: dict[str, tuple[float, list[str]]] = {}

    def _hazardous(self, topic: str) -> bool:
        """Whether ``topic``'s policies let anything but the broker's filter ack on its
        probe (read at most every HAZARD_CHECK_S per topic)."""
        base = str(TopicName.parse(topic).base)
        at, found = self._hazards.get(base, (-HAZARD_CHECK_S, []))
        now = time.monotonic()
        if now - at >= HAZARD_CHECK_S:
            found = dispatch_hazards(self.admin, topic)
            if found and not self._hazards.get(base, (0.0, []))[1]:
                log.error("%s has %s: a probe subscription there could be acked by more "
                          "than the broker's filter, so its skipped ids go to one admin "
                          "request each (evidence.holes: probe)", base, " and ".join(found))
            self._hazards[base] = (now, found)
        return bool(found)

    def _probe(self, topic: str) -> _Probe:
        with self._lock:
            probe = self._probes.get(topic)
            if probe is None:
                probe = _Probe(None)
                self._probes[topic] = probe
        if probe.consumer is None:
            import pulsar

            probe.consumer = self._client.subscribe(
                topic, self.subscription, consumer_type=pulsar.ConsumerType.Exclusive,
                initial_position=pulsar.InitialPosition.Latest,
                receiver_queue_size=PROBE_QUEUE,
                message_listener=lambda _, msg, p=probe: self._received(p, msg))
        return probe

    def _received(self, probe: _Probe, msg: Any) -> None:
        mid = msg.message_id()
        at = Position(mid.ledger_id(), mid.entry_id())
        with self._lock:
            if (probe.own is not None and at > probe.own
                    and (probe.received is None or at > probe.received)):
                probe.received = at
                probe.delivered.append(at)

    def place(self, topic: str, first: Position) -> None:
        """Read ``topic`` again from ``first``: the probe vouches for every id from there
        on (a probe is placed once per process, at the first ids it is asked about)."""
        import pulsar

        own = Position(first.ledger, first.entry - 1)
        if self._hazardous(topic):  # not probed at all
            with self._lock:
                self._probes[topic] = probe = _Probe(None, own)
            self._distrust(probe)
            return
        try:
            probe = self._probe(topic)
            with self._lock:
                probe.own, probe.received, probe.delivered = own, None, []
            probe.consumer.seek(pulsar.MessageId(-1, first.ledger, first.entry, -1))
        except (pulsar.Timeout, pulsar.ConnectError) as exc:
            # A busy broker (a thousand subscribes and seeks at once) is no reason to stop
            # the mapping: unplaced, the probe vouches for nothing and is placed again later.
            with self._lock:
                if (found := self._probes.get(topic)) is not None:
                    found.own = None
                self.stats.place_failures += 1
            log.debug("%s: the probe was not placed (%s)", topic, exc)
            return
        with self._lock:
            self.stats.seeks += 1

    def place_all(self, places: Mapping[str, Position], workers: int = PLACE_WORKERS) -> None:
        """:meth:`place` for several topics, ``workers`` at a time (the policies of each
        partitioned topic read once, first)."""
        if not places:
            return
        firsts: dict[str, str] = {}
        for topic in places:
            firsts.setdefault(str(TopicName.parse(topic).base), topic)
        for topic in firsts.values():
            self._hazardous(topic)
        failed = self.stats.place_failures
        if len(places) == 1 or workers <= 1:
            for topic, first in places.items():
                self.place(topic, first)
        else:
            with ThreadPoolExecutor(max_workers=min(workers, len(places)),
                                    thread_name_prefix="probe-place") as pool:
                list(pool.map(self.place, places.keys(), places.values()))
        if failed := self.stats.place_failures - failed:
            log.warning("%d of %d probes were not placed (the broker did not answer in time); "
                        "their skipped ids go to the per-id check, and each is placed again "
                        "when next asked", failed, len(places))

    def is_placed(self, topic: str) -> bool:
        """Whether the probe of ``topic`` was placed in this process (disturbed or not)."""
        probe = self._probes.get(topic)
        return probe is not None and probe.own is not None

    def vouches_after(self, topic: str) -> Position | None:
        """The position after which the probe of ``topic`` acked nothing, or None when it
        is not placed or not trusted."""
        probe = self._probes.get(topic)
        if probe is None or not probe.trusted:
            return None
        return probe.own

    def wait_past(self, wanted: Mapping[str, Position], timeout_s: float) -> set[str]:
        """The topics whose probe received a message after their wanted position, waiting
        up to ``timeout_s`` for the rest."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                done = {t for t, pos in wanted.items()
                        if (p := self._probes.get(t)) is not None and p.received is not None
                        and p.received > pos}
            if len(done) == len(wanted) or time.monotonic() >= deadline:
                return done
            time.sleep(0.05)

    def read(self, topics: list[str]) -> dict[str, CursorRead]:
        """The probe cursors of ``topics``, from the plugin or one internalStats request
        each; a topic whose probe turns out disturbed is left out (and trusted no more)."""
        found = self._from_plugin(topics)
        rest = [t for t in topics if t not in found]
        if rest:
            found.update(self.admin.map_concurrently(self.admin.internal_stats, rest))
            self.stats.cursor_reads += len(rest)
        out: dict[str, CursorRead] = {}
        for topic in topics:
            stats = found[topic]
            cursor = stats.subscriptions.get(self.subscription)
            probe = self._probes[topic]
            if cursor is None or probe.own is None or not probe.trusted:
                continue
            if self._hazardous(topic):
                self._distrust(probe)
                continue
            acked = cursor.state.acked()
            with self._lock:
                own, delivered = probe.own, list(probe.delivered)
            if delivered and acked.contains_many(delivered).any():
                self._distrust(probe)
                log.error("%s: a message the probe subscription %r received and never "
                          "acked is acked there (message expiry, backlog eviction or an "
                          "operator's skip or reset on it): its skipped ids go to one "
                          "admin request each from now on", topic, self.subscription)
                continue
            sizes = dict(zip(stats.ledgers.ids.tolist(), stats.ledgers.entries.tolist(),
                             strict=True))
            out[topic] = CursorRead(acked, own, sizes)
        return out

    def _from_plugin(self, topics: list[str]) -> dict[str, TopicInternalStats]:
        """What the brokers' plugin says of ``topics``' probe cursors (nothing when off)."""
        return self._plugin.read({t: (self.subscription,) for t in topics})

    @property
    def plugin_reads(self) -> int:
        """Requests to the brokers' plugin since start, each for many probe cursors."""
        return self._plugin.reads

    def _distrust(self, probe: _Probe) -> None:
        if probe.trusted:
            probe.trusted = False
            self.stats.disturbed += 1

    def release(self, positions: Mapping[str, Position]) -> None:
        """Ack each topic's probe cumulatively up to its position (what the mapping has read
        and classified), so the probe subscription holds no backlog behind it."""
        import pulsar

        for topic, pos in positions.items():
            probe = self._probes.get(topic)
            if probe is None or probe.consumer is None or probe.own is None or pos <= probe.own:
                continue
            probe.consumer.acknowledge_cumulative(
                pulsar.MessageId(-1, pos.ledger, pos.entry, -1))
            with self._lock:
                probe.own = pos
                probe.delivered = [p for p in probe.delivered if p > pos]

    def close(self) -> None:
        """Close the probe consumers and the client (the probe's own)."""
        for probe in self._probes.values():
            if probe.consumer is not None:
                try:
                    probe.consumer.close()
                except Exception as err:  # closing: nothing left to save
                    log.debug("closing a probe consumer: %s", err)
        self._client.close()


__all__ = ["PROBE_SUBSCRIPTION", "CursorRead", "DispatchProbe", "ProbeStats", "dispatch_hazards"]
