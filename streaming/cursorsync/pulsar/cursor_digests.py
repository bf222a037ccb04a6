"""Which cursors moved, from cursorsync's optional broker plugin (streaming/broker-plugin):
``GET /cursorsync/cursors?namespace=TENANT/NS[&subscription=S...]``, asked of one broker.

The broker answers for every persistent topic of the namespace that it serves (no redirect:
each broker is asked for its own)::

    {"plugin": "cursorsync", "broker": "host:8080", "brokers": ["host:8080", ...],
     "namespace": "t/n",
     "topics": [{"topic": "persistent://t/n/x-partition-0", "ledgers": "120:5400:12:3",
                 "cursors": {"s": {"acks": "0f1e2d3c4b5a6978", "batches": "..."}}}]}

``ledgers`` (entries:bytes:last confirmed entry) changes with every entry added and ledger
trimmed. Each cursor has two digests (16 hex digits each): ``acks``, a hash of its
individually deleted ranges and markDeletePosition, exactly what ``internalStats`` shows of
it (:func:`acks_digest` computes the same from an internalStats answer), and ``batches``, a
hash of its partly acked batches, which the topic stats show only while a consumer is
connected. Equal digests mean an unchanged cursor but for a 64-bit hash collision. One
request per broker covers all its topics of the namespace, where topic stats cost one
request per topic and a read of every partition's stats inside the broker.

With ``&stats=true`` each topic also carries ``stats``: its ledgers and the cursors asked
for in internalStats' own shape (``lastConfirmedEntry``, ``ledgers``, ``cursors`` with
``markDeletePosition`` and ``individuallyDeletedMessages``), each cursor's two read together
under its lock and the ledgers after them. :func:`cluster_cursor_stats` reads chosen
cursors of many partitions that way (the probe's, the sync's target cursors), a request per
broker and namespace instead of one per partition.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar
from urllib.parse import urlencode

import numpy as np
import numpy.typing as npt

from cursorsync.core.positions import Position, parse_range_bounds
from cursorsync.errors import CursorSyncError, MalformedAdminOutputError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.batch_acks import plugin_answer, plugin_get
from cursorsync.pulsar.stats import TopicInternalStats, parse_internal_stats
from cursorsync.pulsar.topics import TopicName, namespaces_of

log = logging.getLogger(__name__)

#: Where the plugin answers on a broker's web port.
CURSORS_PATH = "/cursorsync/cursors"
_DIGEST = re.compile(r"[0-9a-f]{16}")
_LEDGERS = re.compile(r"\d+:\d+:-?\d+:-?\d+")
_BROKER = re.compile(r"[^\s/:]+(:\d+)?|\[[0-9a-fA-F:.]+\](:\d+)?")


@dataclass(frozen=True)
class CursorDigest:
    """A cursor's two digests."""

    #: Of its individually deleted ranges and markDeletePosition (:func:`acks_digest`).
    acks: str
    #: Of its partly acked batches' words.
    batches: str


@dataclass(frozen=True)
class TopicDigest:
    """One topic as a broker's plugin saw it."""

    #: entries:bytes:last confirmed entry, over the ledgers the topic keeps.
    ledgers: str
    #: Subscription -> its cursor's digests.
    cursors: Mapping[str, CursorDigest]
    #: Its ledgers and those cursors as internalStats shows them, when asked for.
    stats: TopicInternalStats | None = None


@dataclass(frozen=True)
class CursorDigests:
    """One broker's answer: the topics of a namespace it serves, by full name."""

    broker: str
    namespace: str
    topics: Mapping[str, TopicDigest]
    #: The cluster's available brokers (ids, host:web port), the answering one among them.
    brokers: tuple[str, ...] = ()


def fetch_cursor_digests(admin: AdminClient, namespace: str,
                         subscriptions: Sequence[str] = (), *,
                         stats: bool = False) -> CursorDigests:
    """Ask the broker behind ``admin`` about the topics of ``namespace`` it serves, and of
    each the cursors of ``subscriptions`` (none: every durable one); with ``stats``, also
    their ledgers and those cursors as internalStats shows them (:attr:`TopicDigest.stats`).

    BatchAcksPluginAbsentError when the broker has no plugin, BatchAcksNotFoundError when
    its plugin has no such endpoint (an older build), MalformedAdminOutputError for an
    answer that is not the plugin's; otherwise the AdminClient's errors."""
    params = [("namespace", namespace), *(("subscription", s) for s in subscriptions),
              *((("stats", "true"),) if stats else ())]
    what = f"cursor digests of namespace {namespace}"
    doc = plugin_get(admin, f"{CURSORS_PATH}?{urlencode(params)}", what)
    return parse_cursor_digests(namespace, doc)


class BrokerAnswer(Protocol):
    """One broker's answer about the topics of a namespace it serves."""

    @property
    def broker(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def brokers(self) -> tuple[str, ...]: ...
    @property
    def topics(self) -> Mapping[str, Any]: ...


A = TypeVar("A", bound=BrokerAnswer)


def cluster_answers(admin: AdminClient, namespaces: Sequence[str],
                    fetch: Callable[[AdminClient, str], A], what: str) -> dict[str, Any]:
    """What every broker of ``admin``'s cluster answers (``fetch``: one broker, one
    namespace) of the topics of ``namespaces`` it serves, by topic: the broker behind
    ``admin``'s URL first, then each other broker it lists at its own web address (with
    ``admin``'s settings; the URL's scheme). A topic two brokers list (one being moved
    between them) is left out, as is every topic of a broker that cannot be asked (logged,
    naming ``what`` it answers): a caller reads those as it would without the plugin.

    The first broker's errors are raised (BatchAcksPluginAbsentError: no plugin there)."""
    if not namespaces:
        return {}
    # Behind a load balancer each namespace's first answer may come from another broker.
    first = [fetch(admin, ns) for ns in namespaces]
    answered = {(d.broker, d.namespace) for d in first}
    brokers = sorted({b for d in first for b in (d.broker, *d.brokers)})
    todo = [(b, [ns for ns in namespaces if (b, ns) not in answered]) for b in brokers]
    scheme = admin.config.urls[0].split("://", 1)[0]

    def ask(job: tuple[str, list[str]]) -> list[A]:
        broker, missing = job
        settings = replace(admin.config, urls=(f"{scheme}://{broker}",), max_workers=1)
        try:
            with AdminClient(settings) as other:
                return [fetch(other, ns) for ns in missing]
        except CursorSyncError as err:
            log.warning("broker %s of cluster %s: no %s (%s); its topics are read without "
                        "them", broker, admin.cluster, what, err)
            return []

    answers = [*first, *(d for got in admin.map_each(ask, [j for j in todo if j[1]])
                         for d in got)]
    out: dict[str, Any] = {}
    twice: set[str] = set()
    for answer in answers:
        for name, value in answer.topics.items():
            if name in out:
                twice.add(name)
            out[name] = value
    for name in twice:
        del out[name]
    return out


def cluster_digests(admin: AdminClient, namespaces: Sequence[str],
                    subscriptions: Sequence[str] = (), *,
                    stats: bool = False) -> dict[str, TopicDigest]:
    """What every broker of ``admin``'s cluster says of the topics of ``namespaces`` it
    serves and of their cursors (see :func:`fetch_cursor_digests`), by topic, as
    :func:`cluster_answers` gathers them."""
    return cluster_answers(
        admin, namespaces,
        lambda a, ns: fetch_cursor_digests(a, ns, subscriptions, stats=stats),
        "cursor digests")


def cluster_cursor_stats(admin: AdminClient, wanted: Mapping[str, Collection[str]],
                         ) -> dict[str, TopicInternalStats]:
    """internalStats of each topic of ``wanted`` (concrete names, by the names as given) as
    far as they show its ledgers and the cursors of its subscriptions there, from the plugin
    of every broker of ``admin``'s cluster: a request per broker and namespace. A topic no
    broker answered for (being moved, its broker unreachable), or that lacks one of its
    cursors, is left out; the caller reads it one by one. The first broker's errors are
    raised, as :func:`cluster_digests` does."""
    names = {t: str(TopicName.parse(t)) for t in wanted}
    subscriptions = sorted({s for subs in wanted.values() for s in subs})
    found = cluster_digests(admin, namespaces_of(names.values()), subscriptions, stats=True)
    out: dict[str, TopicInternalStats] = {}
    for topic, name in names.items():
        digest = found.get(name)
        if digest is not None and digest.stats is not None and all(
                s in digest.stats.subscriptions for s in wanted[topic]):
            out[topic] = digest.stats
    return out


#: After the plugin could not be asked, how long its callers read nothing from it (they
#: read on without it: a request or a reader per partition) before asking again.
PLUGIN_RETRY_S = 300.0


class PluginBackoff:
    """Whether a cluster's broker plugin may be asked at ``now``: one that could not be
    asked is warned of once and left alone for :data:`PLUGIN_RETRY_S`."""

    def __init__(self, admin: AdminClient, what: str, instead: str) -> None:
        #: What is read ("the probe cursors"), and how it is read meanwhile.
        self.admin, self.what, self.instead = admin, what, instead
        self._off_until = float("-inf")

    def closed(self, now: float) -> bool:
        """Whether the plugin is being left alone at ``now``."""
        return now < self._off_until

    def failed(self, now: float, err: Exception) -> None:
        """The plugin could not be asked at ``now``: warn, and leave it alone a while."""
        self._off_until = now + PLUGIN_RETRY_S
        log.warning("%s of cluster %s cannot be read from cursorsync's broker plugin (%s): "
                    "%s for the next %.0f s", self.what, self.admin.cluster, err, self.instead,
                    PLUGIN_RETRY_S)


class PluginCursorStats:
    """:func:`cluster_cursor_stats` for a caller that reads on without the plugin: a plugin
    that cannot be asked is warned of once and asked again after :data:`PLUGIN_RETRY_S`,
    every partition left to the caller meanwhile."""

    def __init__(self, admin: AdminClient, what: str, *, enabled: bool = True) -> None:
        """``what``: what is read, for the warning ("the probe cursors")."""
        self.admin, self.enabled = admin, enabled
        self._backoff = PluginBackoff(admin, what,
                                      "one internalStats request per partition")
        #: Reads answered (each a request per broker and namespace).
        self.reads = 0
        self.clock = time.monotonic

    def read(self, wanted: Mapping[str, Collection[str]]) -> dict[str, TopicInternalStats]:
        """What the brokers' plugin says of the topics of ``wanted`` and their subscriptions
        (see :func:`cluster_cursor_stats`); nothing when off, or when it could not be asked
        within the last PLUGIN_RETRY_S."""
        now = self.clock()
        if not self.enabled or not wanted or self._backoff.closed(now):
            return {}
        try:
            found = cluster_cursor_stats(self.admin, wanted)
        except CursorSyncError as err:
            self._backoff.failed(now, err)
            return {}
        self.reads += 1
        return found


def parse_cursor_digests(namespace: str, doc: Any) -> CursorDigests:
    """The plugin's answer for ``namespace`` -> :class:`CursorDigests`; one
    MalformedAdminOutputError naming the namespace, and what is wrong, for anything else."""

    def bad(why: str) -> MalformedAdminOutputError:
        return MalformedAdminOutputError(f"cursor digests of namespace {namespace}: {why}")

    broker, topics, brokers = answer_head(namespace, doc, bad)
    out: dict[str, TopicDigest] = {}
    for i, t in enumerate(topics):
        if not isinstance(t, dict):
            raise bad(f"topics[{i}]: expected an object, got {str(t)[:200]}")
        name, ledgers, cursors = t.get("topic"), t.get("ledgers"), t.get("cursors")
        if not isinstance(name, str) or not name.startswith(f"persistent://{namespace}/"):
            raise bad(f"topics[{i}]: topic {name!r} is not a persistent topic of it")
        if not isinstance(ledgers, str) or not _LEDGERS.fullmatch(ledgers):
            raise bad(f"{name}: ledgers {ledgers!r} is not entries:bytes:ledger:entry")
        if not isinstance(cursors, dict) or not all(_is_digest(d) for d in cursors.values()):
            raise bad(f"{name}: cursors {str(cursors)[:200]} is not subscription -> acks and "
                      f"batches, 16 hex digits each")
        if name in out:
            raise bad(f"{name} is listed twice")
        stats = t.get("stats")
        out[name] = TopicDigest(ledgers, {
            s: CursorDigest(d["acks"], d["batches"]) for s, d in cursors.items()},
            None if stats is None else parse_internal_stats(name, stats))
    return CursorDigests(broker, namespace, out, brokers)


def answer_head(namespace: str, doc: Any, bad: Callable[[str], MalformedAdminOutputError],
                ) -> tuple[str, list[Any], tuple[str, ...]]:
    """The plugin's answer for ``namespace``: the answering broker, its topics list, and the
    cluster's brokers; ``bad(why)`` raised for anything else."""
    doc = plugin_answer(doc, bad)
    if doc.get("namespace") != namespace:
        raise bad(f"the answer is for namespace {doc.get('namespace')!r}")
    broker, topics, brokers = doc.get("broker"), doc.get("topics"), doc.get("brokers")
    if not isinstance(broker, str) or not isinstance(topics, list):
        raise bad("expected a broker string and a topics list")
    if not isinstance(brokers, list) or not all(
            isinstance(b, str) and _BROKER.fullmatch(b) for b in brokers):
        raise bad(f"brokers {str(brokers)[:200]} is not a list of host:port")
    return broker, topics, tuple(brokers)


def _is_digest(d: Any) -> bool:
    return isinstance(d, dict) and set(d) == {"acks", "batches"} and all(
        isinstance(v, str) and _DIGEST.fullmatch(v) for v in d.values())


_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(value: int, v: int) -> int:
    """The plugin's Hash.add: ``v`` (a Java long) into ``value`` (splitmix64's finalizer)."""
    z = value ^ ((v + _GOLDEN) & _MASK)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def acks_digest(mark_delete: Position, ranges: npt.NDArray[np.int64]) -> str:
    """The plugin's ``acks`` digest of a cursor whose internalStats show ``mark_delete`` and
    the individually deleted ``ranges`` (lower ledger, lower entry, upper ledger, upper
    entry; in the order written, :func:`cursorsync.core.positions.parse_range_bounds`)."""
    value = _GOLDEN
    for v in ranges.reshape(-1).tolist():
        value = _mix(value, v)
    value = _mix(_mix(value, mark_delete.ledger), mark_delete.entry)
    return f"{value:016x}"


def moved(before: Mapping[str, TopicDigest], now: Mapping[str, TopicDigest],
          subscriptions: Sequence[str] | None = None) -> set[str]:
    """The topics of ``now`` whose ledgers or cursors (of ``subscriptions``; None: all)
    differ from ``before``, or that ``before`` lacks."""
    out = set()
    for name, d in now.items():
        was = before.get(name)
        if was is None or was.ledgers != d.ledgers or _picked(was, subscriptions) != _picked(
                d, subscriptions):
            out.add(name)
    return out


#: A partition as the plugin sees it: its ledgers line and, per wanted subscription in name
#: order, (name, acks digest, batches digest).
DigestPrint = tuple[str, tuple[tuple[str, str, str], ...]]


def told_print(d: TopicDigest | None, subscriptions: Sequence[str] | None,
               ) -> DigestPrint | None:
    """What the plugin said of a partition (None: not listed by any broker)."""
    if d is None:
        return None
    return d.ledgers, tuple((s, c.acks, c.batches)
                            for s, c in sorted(_picked(d, subscriptions).items()))


def read_print(stats: TopicInternalStats, subscriptions: Sequence[str] | None,
               told: DigestPrint | None) -> DigestPrint | None:
    """What the plugin says of the partition while it stands as ``stats`` show it: computed
    from the read itself, so that a change between the plugin's answer and the read is never
    taken for the state read. The batches digests (internalStats show no batch indexes) are
    those ``told`` before the read: a batch-index ack in between makes the next answer
    differ, and the partition is read again. None: not comparable (a field or a
    subscription missing), so the partition is read again next poll."""
    if told is None or stats.number_of_entries is None or stats.total_size is None:
        return None
    batches = {s: b for s, _, b in told[1]}
    subs = sorted(n for n in stats.subscriptions
                  if subscriptions is None or n in subscriptions)
    if set(subs) != set(batches):
        return None
    lce = stats.last_confirmed_entry
    line = f"{stats.number_of_entries}:{stats.total_size}:{lce.ledger}:{lce.entry}"
    cursors = stats.subscriptions
    return line, tuple(
        (s, acks_digest(cursors[s].state.mark_delete,
                        parse_range_bounds(cursors[s].individually_deleted_text)), batches[s])
        for s in subs)


def _picked(d: TopicDigest, subscriptions: Sequence[str] | None) -> dict[str, CursorDigest]:
    return dict(d.cursors) if subscriptions is None else {
        s: d.cursors[s] for s in subscriptions if s in d.cursors}
