"""Which entries of a topic partition are markers, asked of a cluster's brokers.

Two ways: the admin API's raw entry read, one request per entry
(:class:`AdminMarkerLookup`), or cursorsync's broker plugin, one request per partition
and lookup (``GET /cursorsync/markers?topic=T&entries=L:E,L:E1-E2``, runs of entries of one
ledger written as a range, :class:`PluginMarkerLookup`): the broker reads the entries itself
and answers which name a marker type. An entry the topic does not store is no marker
either way.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

from cursorsync.core.positions import Position
from cursorsync.errors import CursorSyncError, MalformedAdminOutputError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.batch_acks import plugin_answer, plugin_get
from cursorsync.pulsar.cursor_digests import PluginBackoff
from cursorsync.pulsar.topics import TopicName

#: The plugin's endpoint, and the entries it answers for in one request at most.
MARKERS_PATH = "/cursorsync/markers"
MARKERS_PER_REQUEST = 1000
#: Runs (ledger:first-last) in one request at most: the URL stays within the brokers'
#: request header limit (8 KB by default) whatever the ids' digits.
MARKER_RUNS_PER_REQUEST = 100


class AdminMarkerLookup:
    """Which of some entries of a topic partition are markers, asked of a cluster's admin
    API in parallel (the sync step's :data:`~cursorsync.sync.step.MarkerLookup`, on the source).
    An entry the API does not have is not a marker."""

    def __init__(self, admin: AdminClient, max_workers: int = 8) -> None:
        self.admin = admin
        self.max_workers = max(1, max_workers)
        self.requests = 0
        #: Lookups run on the sync's lookup threads, several at once.
        self._lock = threading.Lock()

    def requests_by_kind(self) -> dict[str, int]:
        """Requests made so far: one raw entry read per entry."""
        return {"raw-entry": self.requests}

    def __call__(self, topic: str, positions: list[Position]) -> list[Position]:
        if not positions:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(positions)),
                                thread_name_prefix="marker-lookup") as pool:
            found = list(pool.map(
                lambda p: self.admin.raw_entry(topic, p.ledger, p.entry), positions))
        with self._lock:
            self.requests += len(positions)
        return [p for p, raw in zip(positions, found, strict=True)
                if raw is not None and raw.is_marker]


def plugin_markers(admin: AdminClient, topic: str, positions: list[Position]) -> list[Position]:
    """The markers among ``positions`` of one topic partition, as the plugin of ``admin``'s
    cluster answers (at most MARKERS_PER_REQUEST entries). Its errors as
    :func:`~cursorsync.pulsar.batch_acks.plugin_get` raises them; an answer that is not the
    plugin's, or names an entry not asked, MalformedAdminOutputError."""
    name = TopicName.parse(topic)
    what = f"markers among {len(positions)} entries of {name}"
    runs = ",".join(f"{ledger}:{first}" if first == last else f"{ledger}:{first}-{last}"
                    for ledger, first, last in _runs(positions))
    query = urlencode({"topic": str(name), "entries": runs})
    doc = plugin_get(admin, f"{MARKERS_PATH}?{query}", what)

    def bad(why: str) -> MalformedAdminOutputError:
        return MalformedAdminOutputError(f"cluster {admin.cluster}: {what}: {why}")

    doc = plugin_answer(doc, bad)
    if doc.get("topic") != str(name):
        raise bad(f"the answer is for topic {doc.get('topic')!r}")
    asked = set(positions)
    out: list[Position] = []
    for field in ("markers", "missing"):
        listed = doc.get(field)
        if not isinstance(listed, list):
            raise bad(f"{field}: expected a list, got {str(listed)[:200]}")
        for text in listed:
            try:
                pos = Position.parse(str(text))
            except ValueError:
                raise bad(f"{field}: {str(text)[:50]!r} is not a position ledger:entry") from None
            if pos not in asked:
                raise bad(f"{field}: {pos} was not asked")
            if field == "markers":
                out.append(pos)
    return out


def _runs(positions: list[Position]) -> list[tuple[int, int, int]]:
    """``positions`` as runs (ledger, first entry, last entry) of consecutive entries, in
    the order given."""
    out: list[tuple[int, int, int]] = []
    for p in positions:
        if out and out[-1][0] == p.ledger and out[-1][2] + 1 == p.entry:
            out[-1] = (p.ledger, out[-1][1], p.entry)
        else:
            out.append((p.ledger, p.entry, p.entry))
    return out


def _requests(positions: list[Position]) -> list[list[Position]]:
    """``positions`` split into what one request holds: MARKERS_PER_REQUEST entries and
    MARKER_RUNS_PER_REQUEST runs at most."""
    out: list[list[Position]] = [[]]
    runs = 0
    for p in positions:
        last = out[-1][-1] if out[-1] else None
        new_run = last is None or last.ledger != p.ledger or last.entry + 1 != p.entry
        if len(out[-1]) == MARKERS_PER_REQUEST or (new_run and runs == MARKER_RUNS_PER_REQUEST):
            out.append([])
            runs, new_run = 0, True
        out[-1].append(p)
        runs += new_run
    return [chunk for chunk in out if chunk]


class PluginMarkerLookup:
    """:class:`AdminMarkerLookup` answered by the brokers' plugin, one request per partition
    and MARKERS_PER_REQUEST entries (MARKER_RUNS_PER_REQUEST runs). A plugin that cannot be
    asked (absent, too old to know the endpoint, failing) is warned of once and left alone a
    while: ``fallback`` asks meanwhile, entry by entry."""

    def __init__(self, admin: AdminClient, fallback: AdminMarkerLookup) -> None:
        self.admin = admin
        self.fallback = fallback
        self._backoff = PluginBackoff(admin, "markers among acked source entries",
                                      "a raw entry read per entry")
        self.clock = time.monotonic
        self.requests = 0
        #: Lookups run on the sync's lookup threads, several at once.
        self._lock = threading.Lock()

    def requests_by_kind(self) -> dict[str, int]:
        """Requests made so far: the plugin's, and the fallback's raw entry reads."""
        return {"plugin-markers": self.requests, **self.fallback.requests_by_kind()}

    def __call__(self, topic: str, positions: list[Position]) -> list[Position]:
        now = self.clock()
        if not positions or self._backoff.closed(now):
            return self.fallback(topic, positions)
        out: list[Position] = []
        try:
            for chunk in _requests(positions):
                with self._lock:
                    self.requests += 1
                out += plugin_markers(self.admin, topic, chunk)
        except CursorSyncError as err:
            self._backoff.failed(now, err)
            return self.fallback(topic, positions)
        return out


__all__ = ["AdminMarkerLookup", "PluginMarkerLookup", "plugin_markers"]
