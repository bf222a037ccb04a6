"""Whether a topic partition holds an entry past a position that a consumer could receive,
asked of its broker in one round trip.

A broker answers a consumer's GetLastMessageId with its last *dispatchable* position
(Pulsar 4.0, ``PersistentTopic.getLastDispatchablePosition``): from the last confirmed
entry (with transactions, the max read position) backwards past markers and aborted
transactions' messages, kept up to date as messages that are not markers are written. A
reader started at the entry after ``after`` and asked whether a message is available
compares that answer with its start. No means every entry the partition holds past
``after`` is a marker or an aborted transaction's message: none of them is ever delivered
to a consumer or sent by a replicator as data. A chunk, a delayed message or an open
transaction's message counts as dispatchable, so it always gives yes.

With cursorsync's plugin on the source's brokers (``spark.cursor_digests``),
:class:`PluginTail` reads the same position of every partition a broker serves in one
request per broker and namespace (``GET /cursorsync/dispatchable?namespace=TENANT/NS``)::

    {"plugin": "cursorsync", "broker": "host:8080", "brokers": ["host:8080", ...],
     "namespace": "t/n",
     "topics": [{"topic": "persistent://t/n/x-partition-0", "dispatchable": "12:40"}]}

A broker lists only the positions it knows without reading (it keeps the position up to
date as messages are written); a partition it does not list is asked with a reader.
:class:`PluginPositions` reads the same answers for the mapping's entries source, whose
every trigger needs the position of every partition it reads (otherwise a consumer's
GetLastMessageId each).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from cursorsync.core.positions import Position
from cursorsync.errors import CursorSyncError, MalformedAdminOutputError, PositionFormatError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.batch_acks import plugin_get
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.cursor_digests import PluginBackoff, answer_head, cluster_answers
from cursorsync.pulsar.topics import TopicName, namespaces_of

log = logging.getLogger(__name__)

#: Where the plugin answers on a broker's web port.
DISPATCHABLE_PATH = "/cursorsync/dispatchable"
#: Seconds between two of :class:`PluginTail`'s requests at least: checks asked meanwhile
#: wait for the next answer, which serves them all.
PLUGIN_TAIL_EVERY_S = 0.5


class DispatchableTail:
    """Asks a cluster's brokers whether a partition holds a dispatchable entry past a
    position (the sync step's tail check, on the source). Thread-safe: checks of different
    partitions run at once on one client."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._lock = threading.Lock()
        #: Checks made (each a reader opened, one GetLastMessageId, the reader closed).
        self.checks = 0

    def nothing_dispatchable_after(self, topic: str, after: Position,
                                   not_before: float | None = None) -> bool:
        """True when every entry of the concrete ``topic`` past ``after`` (a stored entry) is
        one no consumer ever receives; False when one may be received. Asked no sooner than
        ``not_before`` (a time.monotonic() value; None: now)."""
        import pulsar

        if not_before is not None:
            time.sleep(max(0.0, not_before - time.monotonic()))
        name = TopicName.parse(topic)
        start = pulsar.MessageId(name.partition, after.ledger, after.entry + 1, -1)
        try:
            reader = self._connected().create_reader(
                topic, start, start_message_id_inclusive=True, receiver_queue_size=1)
            try:
                available = reader.has_message_available()
            finally:
                reader.close()
        except pulsar.PulsarException as err:
            raise CursorSyncError(
                f"cannot ask the brokers of {self.settings.service_url} for the last "
                f"dispatchable entry of {topic}: {err}") from err
        with self._lock:
            self.checks += 1
        return not available

    def requests_by_kind(self) -> dict[str, int]:
        """The checks made so far: a reader each."""
        return {"tail-check": self.checks}

    def _connected(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self.settings.connect()
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


@dataclass(frozen=True)
class DispatchableAnswer:
    """One broker's answer: the last dispatchable position of each topic of a namespace it
    serves and knows it of, by full name."""

    broker: str
    namespace: str
    topics: Mapping[str, Position]
    #: The cluster's available brokers (ids, host:web port), the answering one among them.
    brokers: tuple[str, ...] = ()


def fetch_dispatchable(admin: AdminClient, namespace: str) -> DispatchableAnswer:
    """Ask the broker behind ``admin`` for the last dispatchable positions of the topics of
    ``namespace`` it serves. BatchAcksPluginAbsentError when the broker has no plugin,
    BatchAcksNotFoundError when its plugin has no such endpoint (an older build),
    MalformedAdminOutputError for an answer that is not the plugin's; otherwise the
    AdminClient's errors."""
    what = f"last dispatchable positions of namespace {namespace}"
    doc = plugin_get(admin, f"{DISPATCHABLE_PATH}?{urlencode({'namespace': namespace})}", what)
    return parse_dispatchable(namespace, doc)


def parse_dispatchable(namespace: str, doc: Any) -> DispatchableAnswer:
    """The plugin's answer for ``namespace`` -> :class:`DispatchableAnswer`; one
    MalformedAdminOutputError naming the namespace, and what is wrong, for anything else."""

    def bad(why: str) -> MalformedAdminOutputError:
        return MalformedAdminOutputError(
            f"last dispatchable positions of namespace {namespace}: {why}")

    broker, topics, brokers = answer_head(namespace, doc, bad)
    out: dict[str, Position] = {}
    for i, t in enumerate(topics):
        if not isinstance(t, dict):
            raise bad(f"topics[{i}]: expected an object, got {str(t)[:200]}")
        name, text = t.get("topic"), t.get("dispatchable")
        if not isinstance(name, str) or not name.startswith(f"persistent://{namespace}/"):
            raise bad(f"topics[{i}]: topic {name!r} is not a persistent topic of it")
        position = _position(text)
        if position is None:
            raise bad(f"{name}: dispatchable {text!r} is not ledger:entry")
        if name in out:
            raise bad(f"{name} is listed twice")
        out[name] = position
    return DispatchableAnswer(broker, namespace, out, brokers)


def _position(text: Any) -> Position | None:
    """``ledger:entry`` as a Position; None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        return Position.parse(text)
    except PositionFormatError:
        return None


class _Asked:
    """A namespace's answers: the last one and when it was asked, and whether a thread is
    asking now."""

    __slots__ = ("asked_at", "asking", "positions")

    def __init__(self) -> None:
        self.asked_at = float("-inf")
        self.positions: dict[str, Position] | None = None
        self.asking = False


class PluginTail:
    """:meth:`DispatchableTail.nothing_dispatchable_after` answered from the brokers'
    plugin: a check waits for an answer asked after the check began (one request per broker
    and namespace serves every check waiting then, and no two come within
    PLUGIN_TAIL_EVERY_S). A partition no broker lists is checked by ``fallback`` with a
    reader, and so is every partition while the plugin cannot be asked (warned once, asked
    again after PLUGIN_RETRY_S). Thread-safe."""

    def __init__(self, admin: AdminClient, fallback: DispatchableTail) -> None:
        self.admin = admin
        self.fallback = fallback
        self._cond = threading.Condition()
        self._asked: dict[str, _Asked] = {}
        self._backoff = PluginBackoff(admin, "last dispatchable positions",
                                      "a reader per partition checks")
        self.clock = time.monotonic
        self.sleep = time.sleep
        #: Answers taken from the plugin (each a request to every broker serving the
        #: namespace), and the checks they answered.
        self.requests = 0
        self.answered = 0

    def requests_by_kind(self) -> dict[str, int]:
        """Requests made so far: the plugin's, and the fallback's readers."""
        return {"plugin-tail": self.requests, **self.fallback.requests_by_kind()}

    def nothing_dispatchable_after(self, topic: str, after: Position,
                                   not_before: float | None = None) -> bool:
        """As :meth:`DispatchableTail.nothing_dispatchable_after`, from the plugin's first
        answer asked at ``not_before`` or later (a time.monotonic() value; None: now)."""
        name = TopicName.parse(topic)
        since = self.clock() if not_before is None else not_before
        positions = self._answer(f"{name.tenant}/{name.namespace}", since)
        last = None if positions is None else positions.get(str(name))
        if last is None:
            return self.fallback.nothing_dispatchable_after(topic, after, since)
        with self._cond:
            self.answered += 1
        return last <= after

    def _answer(self, namespace: str, since: float) -> dict[str, Position] | None:
        """The namespace's positions from an answer asked at or after ``since``; None when
        the plugin cannot be asked."""
        with self._cond:
            asked = self._asked.setdefault(namespace, _Asked())
            while True:
                if self._backoff.closed(self.clock()):
                    return None
                if asked.asked_at >= since:
                    return asked.positions
                if not asked.asking:
                    asked.asking = True
                    break
                self._cond.wait()
            # No sooner than the check's own time, nor within the spacing after the last.
            wait = max(since, asked.asked_at + PLUGIN_TAIL_EVERY_S) - self.clock()
        positions: dict[str, Position] | None = None
        try:
            if wait > 0:
                self.sleep(wait)
            at = self.clock()
            positions = dict(cluster_answers(self.admin, [namespace], fetch_dispatchable,
                                             "last dispatchable positions"))
        except CursorSyncError as err:
            with self._cond:
                self._backoff.failed(self.clock(), err)
        finally:
            with self._cond:
                asked.asking = False
                if positions is not None:
                    asked.asked_at, asked.positions = at, positions
                    self.requests += 1
                self._cond.notify_all()
        return positions

    def close(self) -> None:
        self.fallback.close()


class PluginPositions:
    """The last dispatchable position of many topic partitions at once, from the plugin of
    every broker of ``admin``'s cluster (a request per broker and namespace, where a
    consumer asks one partition per round trip). A partition no broker lists is left out,
    for the caller to ask its consumer; a plugin that cannot be asked is warned of once and
    asked again after PLUGIN_RETRY_S, every partition left to the caller meanwhile."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin
        self._backoff = PluginBackoff(admin, "last dispatchable positions",
                                      "a consumer per partition asks")
        self.clock = time.monotonic
        #: Answers taken (each a request per broker and namespace).
        self.requests = 0

    def read(self, topics: Sequence[str]) -> dict[str, Position]:
        """The positions of the concrete ``topics`` the brokers list, by the names given."""
        now = self.clock()
        if not topics or self._backoff.closed(now):
            return {}
        names = {t: str(TopicName.parse(t)) for t in topics}
        try:
            found = cluster_answers(self.admin, namespaces_of(names.values()),
                                    fetch_dispatchable, "last dispatchable positions")
        except CursorSyncError as err:
            self._backoff.failed(now, err)
            return {}
        self.requests += 1
        return {t: found[n] for t, n in names.items() if n in found}


__all__ = ["DispatchableAnswer", "DispatchableTail", "PluginPositions", "PluginTail",
           "fetch_dispatchable", "parse_dispatchable"]
