"""Which entries of a topic partition are markers, asked of a cluster's admin API: one
raw-entry request per entry (:class:`AdminMarkerLookup`), or, with cursorsync's plugin on
the cluster's brokers, one request per topic for up to MARKERS_PER_REQUEST entries
(:class:`PluginMarkerLookup`; ``GET /cursorsync/markers?topic=T&entry=L:E&entry=...``)::

    {"plugin": "cursorsync", "topic": "persistent://t/n/x-partition-0",
     "markers": ["12:41", "12:42"], "missing": ["9:0"]}

``markers``: the entries asked whose metadata names a marker type (what the raw-entry
answer's ``X-Pulsar-marker-type`` header shows); ``missing``: those the topic does not hold
(a ledger it no longer keeps, an id past a ledger's end), which are not markers. The topic's
owner answers; another broker redirects to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

from cursorsync.core.positions import Position
from cursorsync.errors import CursorSyncError, MalformedAdminOutputError, PositionFormatError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.batch_acks import (
    BatchAcksNotFoundError,
    BatchAcksPluginAbsentError,
    plugin_answer,
    plugin_get,
)
from cursorsync.pulsar.cursor_digests import PLUGIN_RETRY_S

log = logging.getLogger(__name__)

#: Where the plugin answers, on the topic owner's web port.
MARKERS_PATH = "/cursorsync/markers"
#: Entries one plugin request names at most (the plugin's own limit).
MARKERS_PER_REQUEST = 1000
#: What the plugin's 404 says of a path it does not serve (a build older than the endpoint).
NO_ENDPOINT = "no such endpoint"


class AdminMarkerLookup:
    """Which of some entries of a topic partition are markers, asked of a cluster's admin
    API in parallel (the sync step's :data:`~cursorsync.sync.step.MarkerLookup`, on the source).
    An entry the API does not have is not a marker."""

    def __init__(self, admin: AdminClient, max_workers: int = 8) -> None:
        self.admin = admin
        self.max_workers = max(1, max_workers)
        self.requests = 0

    def __call__(self, topic: str, positions: list[Position]) -> list[Position]:
        if not positions:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(positions)),
                                thread_name_prefix="marker-lookup") as pool:
            found = list(pool.map(
                lambda p: self.admin.raw_entry(topic, p.ledger, p.entry), positions))
        self.requests += len(positions)
        return [p for p, raw in zip(positions, found, strict=True)
                if raw is not None and raw.is_marker]

    def requests_by_kind(self) -> dict[str, int]:
        """Requests made so far: one raw-entry request per entry."""
        return {"raw-entry": self.requests}


class PluginMarkerLookup:
    """:class:`AdminMarkerLookup`'s question asked of the brokers' plugin, one request per
    MARKERS_PER_REQUEST entries of a topic. A plugin that is missing, or too old to answer,
    is warned of once and asked again after PLUGIN_RETRY_S; meanwhile ``fallback`` asks one
    entry per request. Thread-safe."""

    def __init__(self, admin: AdminClient, fallback: AdminMarkerLookup) -> None:
        self.admin = admin
        self.fallback = fallback
        self.requests = 0
        self._off_until = float("-inf")
        self.clock = time.monotonic

    def __call__(self, topic: str, positions: list[Position]) -> list[Position]:
        if not positions:
            return []
        if self.clock() < self._off_until:
            return self.fallback(topic, positions)
        markers: list[Position] = []
        try:
            for i in range(0, len(positions), MARKERS_PER_REQUEST):
                markers += fetch_markers(self.admin, topic, positions[i:i + MARKERS_PER_REQUEST])
                self.requests += 1
        except BatchAcksNotFoundError as err:
            if NO_ENDPOINT not in str(err):
                # The topic is not there (deleted, or being created): as the admin API says.
                return self.fallback(topic, positions)
            self._off(err)
            return self.fallback(topic, positions)
        except BatchAcksPluginAbsentError as err:
            self._off(err)
            return self.fallback(topic, positions)
        return markers

    def _off(self, err: CursorSyncError) -> None:
        self._off_until = self.clock() + PLUGIN_RETRY_S
        log.warning("cluster %s: markers cannot be looked up on cursorsync's broker plugin "
                    "(%s): one raw-entry request per entry for the next %.0f s",
                    self.admin.cluster, err, PLUGIN_RETRY_S)

    def requests_by_kind(self) -> dict[str, int]:
        """Requests made so far: the plugin's, and the fallback's raw entries."""
        return {"plugin-marker": self.requests, **self.fallback.requests_by_kind()}


def fetch_markers(admin: AdminClient, topic: str, positions: Sequence[Position],
                  ) -> list[Position]:
    """The markers among ``positions`` (at most MARKERS_PER_REQUEST) of the concrete
    ``topic``, from its owner's plugin. BatchAcksPluginAbsentError when the broker has no
    plugin, BatchAcksNotFoundError for an unknown topic or a plugin without the endpoint,
    MalformedAdminOutputError for an answer that is not the plugin's; otherwise the
    AdminClient's errors."""
    query = urlencode([("topic", topic), *(("entry", str(p)) for p in positions)])
    what = f"markers among {len(positions)} entries of {topic}"
    return parse_markers(topic, positions, plugin_get(admin, f"{MARKERS_PATH}?{query}", what))


def parse_markers(topic: str, asked: Sequence[Position], doc: Any) -> list[Position]:
    """The plugin's answer about ``asked`` -> the markers among them, in the order asked; one
    MalformedAdminOutputError naming the topic for anything else (an entry answered that
    was not asked, or answered twice)."""

    def bad(why: str) -> MalformedAdminOutputError:
        return MalformedAdminOutputError(f"markers of {topic}: {why}")

    doc = plugin_answer(doc, bad)
    if doc.get("topic") != topic:
        raise bad(f"the answer is for topic {doc.get('topic')!r}")
    lists = {}
    for field in ("markers", "missing"):
        texts = doc.get(field)
        if not isinstance(texts, list):
            raise bad(f"{field}: expected a list, got {str(texts)[:200]}")
        lists[field] = [_position(bad, field, t) for t in texts]
    markers, missing = set(lists["markers"]), set(lists["missing"])
    strange = (markers | missing) - set(asked)
    if strange:
        raise bad(f"entry {min(strange)} answered, not asked")
    if markers & missing:
        raise bad(f"entry {min(markers & missing)} answered both a marker and missing")
    return [p for p in asked if p in markers]


def _position(bad: Any, field: str, text: Any) -> Position:
    try:
        if isinstance(text, str):
            return Position.parse(text)
    except PositionFormatError:
        pass
    raise bad(f"{field}: {str(text)[:100]!r} is not ledger:entry")


__all__ = ["AdminMarkerLookup", "PluginMarkerLookup", "fetch_markers", "parse_markers"]
