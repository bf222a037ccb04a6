"""What a source broker holds of partially acked batches, from cursorsync's optional broker
plugin (streaming/broker-plugin): ``GET /cursorsync/batch-acks?topic=T&subscription=S``
(``&limit=N``: at most N batches, 1,000 by default; ``&after=L:E``: those after L:E).

With batch-index acknowledgement on, a broker's cursor keeps which messages of a partially
acked batch are acked, and no admin endpoint or statistic of Pulsar 4.0 shows them
(tests/integration/bed/test_batch_index_ack_facts.py). The plugin answers, for one
subscription of one topic partition on the broker that owns it::

    {"plugin": "cursorsync", "topic": "persistent://t/n/x-partition-0", "subscription": "s",
     "markDeletePosition": "12:3", "batchIndexAcks": true, "truncated": false,
     "entries": [{"position": "12:5", "batchSize": 5, "ackSet": [6],
                  "ackedIndexes": [0, 3, 4]}]}

``ackSet`` is the cursor's own words (bit i set: index i not acked yet), ``ackedIndexes``
the indexes below ``batchSize`` whose bit is clear; they must agree. ``batchIndexAcks``
false: the broker keeps no indexes (``acknowledgmentAtBatchIndexLevelEnabled`` off).

Asked through :class:`~cursorsync.pulsar.admin.AdminClient`, so the admin settings (URLs,
token, TLS, retries) apply unchanged, and a broker that does not own the topic redirects
(307) to the one that does. A broker without the plugin answers 404 without the plugin's
mark: :class:`BatchAcksPluginAbsentError`, so a caller can tell it from an unknown topic
or subscription (:class:`BatchAcksNotFoundError`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import httpx

from cursorsync.core.batches import PartialBatch
from cursorsync.core.positions import INT64_MAX, INT64_MIN, Position
from cursorsync.errors import AdminError, MalformedAdminOutputError, PositionFormatError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.stats import parse_json
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)

#: Where the plugin answers on a broker's web port.
PLUGIN_PATH = "/cursorsync/batch-acks"
#: What every answer of the plugin carries in its ``plugin`` field, errors included.
PLUGIN_MARK = "cursorsync"
#: A batch's size is a Java int in the message metadata.
_MAX_BATCH = 2**31 - 1
_WORD = (1 << 64) - 1

_Bad = Callable[[str], MalformedAdminOutputError]


class BatchAcksPluginAbsentError(AdminError):
    """The broker has no cursorsync plugin loaded (its endpoint answered 404 as the broker
    does for any unknown path)."""


class BatchAcksNotFoundError(AdminError):
    """The plugin answered 404: the topic or the subscription does not exist there."""


@dataclass(frozen=True)
class BatchAcks:
    """One subscription's cursor as the plugin read it."""

    topic: str
    subscription: str
    mark_delete: Position
    #: The broker keeps batch indexes at all (False: none are kept, ``batches`` is empty).
    batch_index_acks: bool
    #: Partly acked entries after ``mark_delete``, in position order.
    batches: tuple[PartialBatch, ...]
    #: The plugin stopped at its limit: more partly acked entries follow the last one.
    truncated: bool = False

    @property
    def acked(self) -> Mapping[Position, frozenset[int]]:
        """Position -> the acked indexes of its batch."""
        return {b.position: b.acked for b in self.batches}


def fetch_batch_acks(admin: AdminClient, topic: str | TopicName, subscription: str, *,
                     limit: int | None = None, after: Position | None = None) -> BatchAcks:
    """Ask the plugin of ``admin``'s cluster about one subscription of one topic partition:
    its first ``limit`` partly acked batches (the plugin's default 1,000), or those after
    ``after``.

    :class:`BatchAcksPluginAbsentError` when the broker has no plugin,
    :class:`BatchAcksNotFoundError` for an unknown topic or subscription,
    MalformedAdminOutputError for an answer that is not the plugin's; otherwise the
    AdminClient's errors (unreachable, refused, 5xx after its retries)."""
    t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    params: dict[str, str | int] = {"topic": str(t), "subscription": subscription}
    if limit is not None:
        params["limit"] = limit
    if after is not None:
        params["after"] = str(after)
    what = f"batch acks of subscription {subscription} on {t}"
    doc = plugin_get(admin, f"{PLUGIN_PATH}?{urlencode(params)}", what)
    return parse_batch_acks(str(t), subscription, doc)


def fetch_every_batch(admin: AdminClient, topic: str | TopicName, subscription: str, *,
                      page: int | None = None) -> BatchAcks:
    """Every partly acked batch of the cursor, a page (:func:`fetch_batch_acks`, ``page``
    batches, the plugin's default when None) at a time.

    The pages are read one after another while consumers ack: a batch acked whole
    meanwhile drops out of a later page, and acks only add up, so every index the pages
    give was acked when its page was read. The markDeletePosition is the first page's
    (the earliest). A plugin that ignores ``after`` (built before it) answers its first
    page again: the batches read so far are returned, truncated, and it is logged."""
    first = fetch_batch_acks(admin, topic, subscription, limit=page)
    batches, got = list(first.batches), first
    while got.truncated and got.batches:
        last = got.batches[-1].position
        got = fetch_batch_acks(admin, topic, subscription, limit=page, after=last)
        if got.batches and got.batches[0].position <= last:
            log.warning("cluster %s: its brokers' cursorsync plugin ignores the parameter "
                        "after (it predates it): only the first %d partly acked batches of %s "
                        "are read; upgrade the plugin (streaming/broker-plugin)",
                        admin.cluster, len(batches), subscription)
            return replace(first, batches=tuple(batches), truncated=True)
        batches.extend(got.batches)
    return replace(first, batches=tuple(batches), truncated=False)


def plugin_get(admin: AdminClient, path: str, what: str) -> Any:
    """The JSON a plugin endpoint answers (``path`` with its query); its 404 raised as
    :func:`plugin_not_found` tells, else the AdminClient's errors."""
    refused: list[httpx.Response] = []

    def not_found(resp: httpx.Response) -> bool:
        # Kept to read after: get_json answers None for it, without retrying.
        refused.append(resp)
        return resp.status_code == 404

    doc = admin.get_json(path, what, none_if=not_found)
    if doc is None:
        raise plugin_not_found(admin.cluster, what, refused[-1])
    return doc


def plugin_answer(doc: Any, bad: _Bad) -> dict[str, Any]:
    """``doc`` as a plugin endpoint's answer: a JSON object with the plugin's mark, else
    ``bad`` says what it is."""
    if not isinstance(doc, dict):
        raise bad(f"expected a JSON object, got {str(doc)[:200]}")
    if doc.get("plugin") != PLUGIN_MARK:
        raise bad(f"plugin is {doc.get('plugin')!r}, not {PLUGIN_MARK!r}")
    return doc


def plugin_not_found(cluster: str, what: str, resp: httpx.Response) -> AdminError:
    """A 404 of a plugin endpoint: the plugin's own (it carries the mark) or the broker's."""
    try:
        body = parse_json(what, resp.content)
    except MalformedAdminOutputError:
        body = None
    if isinstance(body, dict) and body.get("plugin") == PLUGIN_MARK:
        return BatchAcksNotFoundError(f"cluster {cluster}: {what}: {body.get('error')}")
    return BatchAcksPluginAbsentError(
        f"cluster {cluster}: {what}: {resp.url} answered 404 without cursorsync's plugin "
        f"mark: the broker has no cursorsync plugin loaded (streaming/broker-plugin/README.md)")


def parse_batch_acks(topic: str, subscription: str, doc: Any) -> BatchAcks:
    """The plugin's answer for ``subscription`` on ``topic`` -> :class:`BatchAcks`; one
    MalformedAdminOutputError naming both, and what is wrong, for anything else."""
    where = f"batch acks of subscription {subscription} on {topic}"

    def bad(why: str) -> MalformedAdminOutputError:
        return MalformedAdminOutputError(f"{where}: {why}")

    doc = plugin_answer(doc, bad)
    for name, want in (("topic", topic), ("subscription", subscription)):
        if doc.get(name) != want:
            raise bad(f"the answer is for {name} {doc.get(name)!r}")
    mark_delete = _position(bad, "markDeletePosition", doc.get("markDeletePosition"))
    kept = _boolean(bad, "batchIndexAcks", doc.get("batchIndexAcks"))
    truncated = _boolean(bad, "truncated", doc.get("truncated"))
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise bad(f"entries: expected a list, got {str(entries)[:200]}")
    if entries and not kept:
        raise bad("entries listed, yet batchIndexAcks is false")
    batches: list[PartialBatch] = []
    for i, entry in enumerate(entries):
        batch = _batch(bad, f"entries[{i}]", entry)
        if batch.position <= mark_delete:
            raise bad(f"entries[{i}]: position {batch.position} is at or before the "
                      f"markDeletePosition {mark_delete}")
        if batches and batch.position <= batches[-1].position:
            raise bad(f"entries[{i}]: position {batch.position} does not follow "
                      f"{batches[-1].position}")
        batches.append(batch)
    return BatchAcks(topic, subscription, mark_delete, kept, tuple(batches), truncated)


def _batch(bad: _Bad, where: str, entry: Any) -> PartialBatch:
    if not isinstance(entry, dict):
        raise bad(f"{where}: expected an object, got {str(entry)[:200]}")
    position = _position(bad, f"{where}.position", entry.get("position"))
    size = entry.get("batchSize")
    if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= _MAX_BATCH:
        raise bad(f"{where}.batchSize: expected a batch of 2 or more messages, got {size!r}")
    words = entry.get("ackSet")
    if not isinstance(words, list) or not all(
            _is_int(w) and INT64_MIN <= w <= INT64_MAX for w in words):
        raise bad(f"{where}.ackSet: expected a list of 64-bit words, got {str(words)[:200]}")
    acked = entry.get("ackedIndexes")
    if not isinstance(acked, list) or not all(_is_int(i) for i in acked):
        raise bad(f"{where}.ackedIndexes: expected a list of indexes, got {str(acked)[:200]}")
    if acked != sorted(set(acked)) or any(not 0 <= i < size for i in acked):
        raise bad(f"{where}.ackedIndexes: {acked} are not distinct indexes in order below "
                  f"the batch size {size}")
    if not 0 < len(acked) < size:
        raise bad(f"{where}: {len(acked)} of {size} acked is not a partly acked batch")
    unacked = _bits(words)
    # The two split the batch: disjoint, below its size, as many as it holds (counted, so a
    # huge batchSize costs nothing).
    if (unacked & set(acked) or any(i >= size for i in unacked)
            or len(unacked) + len(acked) != size):
        raise bad(f"{where}: ackSet {words} (not acked: {sorted(unacked)[:20]}) disagrees "
                  f"with ackedIndexes {acked} in a batch of {size}")
    return PartialBatch(position, size, frozenset(acked))


def _bits(words: list[int]) -> set[int]:
    """The set bits of Java's ``BitSet.toLongArray()`` words: word w holds bits 64w to
    64w + 63, lowest first, as a signed long (so bit 63 set is a negative word)."""
    return {64 * w + b for w, word in enumerate(words) for b in range(64)
            if (word & _WORD) >> b & 1}


def _position(bad: _Bad, where: str, text: Any) -> Position:
    if not isinstance(text, str):
        raise bad(f"{where}: expected ledger:entry, got {text!r}")
    try:
        return Position.parse(text)
    except (PositionFormatError, ValueError) as e:
        raise bad(f"{where}: {e}") from e


def _boolean(bad: _Bad, where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad(f"{where}: expected true or false, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
