"""A Pulsar admin REST API subset per sandbox cluster, in Pulsar's JSON shapes.

Routes (``{t}`` tenant, ``{ns}`` namespace, ``{topic}`` local name):

- ``GET /admin/v2/persistent/{t}/{ns}`` -> JSON list of ``persistent://`` topic
  names (partitions listed, partitioned parents not, as the broker does).
- ``GET /admin/v2/persistent/{t}/{ns}/{topic}/partitions`` -> ``{"partitions": N}``
  (0 when not partitioned or unknown).
- ``GET /admin/v2/persistent/{t}/{ns}/{topic}/internalStats`` -> the managed
  ledger's internal stats with ``cursors``.
- ``GET /admin/v2/persistent/{t}/{ns}/{topic}/partitioned-internalStats`` ->
  ``{"metadata": {"partitions": N}, "partitions": {"<topic>-partition-i": {...}}}``.
- ``GET /admin/v2/persistent/{t}/{ns}/{topic}/ledger/{l}/entry/{e}`` -> 200 with an
  empty body and no marker header for any id up to the last one a reader has seen
  (pulsar-lite writes no markers: an id its readers skip is a chunk), 404
  ``{"reason": "Message not found"}`` past it. The payload is not served.

Unknown topics answer 404 ``{"reason": "Topic not found"}``; with a token
configured, a missing or wrong ``Authorization: Bearer`` answers 401.

Faithful details: the open (last) ledger is listed with ``entries`` 0 and
``size`` 0, its live counts are in ``currentLedgerEntries`` /
``currentLedgerSize`` and ``lastConfirmedEntry``; a replicator's cursor is
listed as ``pulsar.repl.<cluster>``. Sizes are payload bytes (the broker
counts metadata too). See :mod:`cursorsync.sandbox.state` for where entries and
cursor states come from.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from cursorsync.positions import Position
from cursorsync.sandbox.brokers import LOOPBACK
from cursorsync.sandbox.state import (
    ClusterState,
    EntryInfo,
    SandboxTopicError,
    entries_up_to,
    fold_cursor,
    partition_topic,
)

ADMIN_PREFIX = "/admin/v2/persistent/"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RawEntryReply:
    """A raw-entry answer for an entry that is not a marker: no metadata headers, no body."""


def _timestamp(epoch_s: float) -> str:
    """Pulsar's DateFormatter form: ISO-8601 with milliseconds and offset."""
    dt = datetime.fromtimestamp(epoch_s, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def internal_stats(state: ClusterState, topic: str) -> dict[str, Any]:
    """internalStats of one non-partitioned topic or partition (raises SandboxTopicError)."""
    log = state.log(topic)
    entries = log.refresh()
    by_ledger: dict[int, list[EntryInfo]] = {}
    for e in entries:
        by_ledger.setdefault(e.ledger, []).append(e)
    ledger_ids = sorted(by_ledger)
    ledgers = []
    for i, lid in enumerate(ledger_ids):
        open_ledger = i == len(ledger_ids) - 1
        es = by_ledger[lid]
        ledgers.append(
            {
                "ledgerId": lid,
                "entries": 0 if open_ledger else len(es),
                "size": 0 if open_ledger else sum(e.size for e in es),
                "offloaded": False,
                "underReplicated": False,
            }
        )
    current = by_ledger[ledger_ids[-1]] if ledger_ids else []
    last = entries[-1] if entries else None
    cursors: dict[str, Any] = {}
    for name, acks in sorted(state.subscriptions_of(topic).items()):
        view = fold_cursor(acks, entries)
        cursors[name] = _cursor_json(
            mark_delete=view.mark_delete,
            read_position=view.read_position,
            individually_deleted=str(view.individually_deleted),
            ranges=len(view.individually_deleted),
            consumed=acks.consumed,
            since_first_unacked=_entries_between(entries, view.mark_delete, view.read_position),
            active=acks.active_consumers > 0,
            switched_at=log.created_at,
        )
    for name, md in sorted(state.replicator_cursors_of(topic).items()):
        read = Position(md.ledger, md.entry + 1)
        cursors[name] = _cursor_json(
            mark_delete=md,
            read_position=read,
            individually_deleted="[]",
            ranges=0,
            consumed=_entries_between(entries, Position(-1, -1), md),
            since_first_unacked=0,
            active=True,
            switched_at=log.created_at,
        )
    return {
        "entriesAddedCounter": len(entries),
        "numberOfEntries": len(entries),
        "totalSize": sum(e.size for e in entries),
        "currentLedgerEntries": len(current),
        "currentLedgerSize": sum(e.size for e in current),
        "lastLedgerCreatedTimestamp": _timestamp(log.created_at),
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "lastConfirmedEntry": f"{last.ledger}:{last.entry}" if last else "-1:-1",
        "state": "LedgerOpened",
        "ledgers": ledgers,
        "cursors": cursors,
        "schemaLedgers": [],
        "compactedLedger": {
            "ledgerId": -1,
            "entries": -1,
            "size": -1,
            "offloaded": False,
            "underReplicated": False,
        },
    }


def _entries_between(entries: list[EntryInfo], lo: Position, hi: Position) -> int:
    """Existing entries in (lo, hi], as the broker counts numberOfEntriesSinceFirstNotAcked.

    Two binary searches: a count walked entry by entry was most of the sandbox's admin
    CPU, on the job's cores.
    """
    if hi <= lo:
        return 0
    return entries_up_to(entries, hi) - entries_up_to(entries, lo)


def _cursor_json(
    *,
    mark_delete: Position,
    read_position: Position,
    individually_deleted: str,
    ranges: int,
    consumed: int,
    since_first_unacked: int,
    active: bool,
    switched_at: float,
) -> dict[str, Any]:
    return {
        "markDeletePosition": str(mark_delete),
        "readPosition": str(read_position),
        "waitingReadOp": False,
        "pendingReadOps": 0,
        "messagesConsumedCounter": consumed,
        "cursorLedger": -1,
        "cursorLedgerLastEntry": -1,
        "individuallyDeletedMessages": individually_deleted,
        "lastLedgerSwitchTimestamp": _timestamp(switched_at),
        "state": "NoLedger",
        "active": active,
        "numberOfEntriesSinceFirstNotAckedMessage": since_first_unacked,
        "totalNonContiguousDeletedMessagesRange": ranges,
        "subscriptionHavePendingRead": False,
        "subscriptionHavePendingReplayRead": False,
        "properties": {},
    }


class _QuietServer(ThreadingHTTPServer):
    """A client hanging up mid-request (httpx closing pooled connections) is not an error."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("admin client %s went away: %s", client_address, exc)
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class AdminServer:
    """An HTTP admin endpoint for one sandbox cluster, served from a daemon thread."""

    def __init__(
        self, state: ClusterState, *, token: str | None = None, host: str = LOOPBACK, port: int = 0
    ) -> None:
        self.state = state
        self.token = token
        self.requests = 0
        self._host = host
        handler = _make_handler(self)
        self._httpd = _QuietServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        port = self._httpd.server_address[1]
        return f"http://{self._host}:{port}"

    def start(self) -> AdminServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"sandbox-admin-{self.state.name}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> AdminServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- routing (returns status, body)
    def handle_get(self, path: str, authorization: str | None) -> tuple[int, Any]:
        self.requests += 1
        if self.token is not None and authorization != f"Bearer {self.token}":
            return 401, {"reason": "Authentication required"}
        if not path.startswith(ADMIN_PREFIX):
            return 404, {"reason": "Not found"}
        parts = [unquote(p) for p in path[len(ADMIN_PREFIX) :].strip("/").split("/")]
        if len(parts) == 2:
            return 200, self.state.list_topics(parts[0], parts[1])
        if len(parts) == 7 and parts[3] == "ledger" and parts[5] == "entry":
            return _raw_entry_reply(self.state, f"persistent://{'/'.join(parts[:3])}",
                                    Position(int(parts[4]), int(parts[6])))
        if len(parts) != 4:
            return 404, {"reason": "Not found"}
        tenant, namespace, local, op = parts
        topic = f"persistent://{tenant}/{namespace}/{local}"
        if op == "partitions":
            return 200, {"partitions": self.state.partitions_of(topic)}
        if op == "partitioned-internalStats":
            n = self.state.partitions_of(topic)
            if n == 0:
                return 404, {"reason": f"Partitioned Topic not found: {topic} does not exist"}
            body = {
                "metadata": {"partitions": n},
                "partitions": {
                    partition_topic(topic, i): internal_stats(self.state, partition_topic(topic, i))
                    for i in range(n)
                },
            }
            return 200, body
        if op == "internalStats":
            if not self.state.knows(topic):
                return 404, {"reason": "Topic not found"}
            try:
                return 200, internal_stats(self.state, topic)
            except SandboxTopicError:
                return 404, {"reason": "Topic not found"}
        return 404, {"reason": "Not found"}


def _raw_entry_reply(state: ClusterState, topic: str, at: Position) -> tuple[int, Any]:
    if not state.knows(topic):
        return 404, {"reason": "Topic not found"}
    entries = state.log(topic).refresh()
    if not entries or at > Position(entries[-1].ledger, entries[-1].entry) or at.entry < 0:
        return 404, {"reason": "Message not found"}
    return 200, RawEntryReply()


def _make_handler(server: AdminServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle on, the body waits for the
        # client's delayed ACK of the headers (40 ms on Linux) on a kept-alive connection.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            started = time.monotonic()
            path = urlsplit(self.path).path
            try:
                status, body = server.handle_get(path, self.headers.get("Authorization"))
            except Exception as exc:  # a 500 with the cause, as the broker would answer
                status, body = 500, {"reason": f"{type(exc).__name__}: {exc}"}
            raw = isinstance(body, RawEntryReply)
            data = b"" if raw else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type",
                             "application/octet-stream" if raw else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.log_message("%s %d %.1fms", path, status, (time.monotonic() - started) * 1e3)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: tests count requests via AdminServer.requests instead

    return Handler
