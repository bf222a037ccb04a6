"""A stub Pulsar admin HTTP server (stdlib, in a thread) serving canned replies per path."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cursorsync.pulsar.admin import AdminClient, AdminSettings


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    delay_s: float = 0.0
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


class StubAdmin:
    """Serves canned replies per path; a list of replies is consumed in order (last repeats)."""

    def __init__(self) -> None:
        self.routes: dict[str, list[Reply]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.client_ports: list[int] = []  # one port per connection: how many were opened
        self.required_token: str | None = None
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as brokers answer
            # Headers and body go out in two writes: with Nagle on, the body would wait
            # for the client's delayed ACK (40 ms) on a kept-alive connection.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                stub.requests.append((self.path, dict(self.headers.items())))
                stub.client_ports.append(self.client_address[1])
                if stub.required_token is not None and (
                        self.headers.get("Authorization") != f"Bearer {stub.required_token}"):
                    self._send(Reply(401, {"reason": "Authentication required"}))
                    return
                replies = stub.routes.get(self.path)
                if not replies:
                    self._send(Reply(404, {"reason": "Topic not found"}))
                    return
                reply = replies.pop(0) if len(replies) > 1 else replies[0]
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self._send(reply)

            def _send(self, reply: Reply) -> None:
                data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def set(self, path: str, *replies: Reply) -> None:
        self.routes[path] = list(replies)

    def start(self) -> StubAdmin:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fast_client(url: str) -> AdminClient:
    """An admin client for the stub that gives up quickly (two attempts, 2 s each)."""
    return AdminClient(AdminSettings.from_urls(url, cluster="a", attempts=2,
                                               backoff_initial_s=0.01, timeout_s=2.0))


#: The admin path of the topic the stub docs describe (persistent://acme/orders/events).
BASE = "/admin/v2/persistent/acme/orders/events"


def stats_doc(lce: str, ledgers: list[tuple[int, int]], cursors: dict[str, tuple[str, str]],
              counter: int = 0) -> dict[str, Any]:
    """internalStats shaped like the broker's; the last ledger reports entries 0 (open)."""
    return {
        "entriesAddedCounter": counter, "numberOfEntries": counter, "totalSize": 0,
        "currentLedgerEntries": 0, "currentLedgerSize": 0,
        "lastLedgerCreatedTimestamp": "2026-11-20T10:15:02.441Z", "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0, "lastConfirmedEntry": lce, "state": "LedgerOpened",
        "ledgers": [{"ledgerId": lid, "entries": 0 if i == len(ledgers) - 1 else n,
                     "size": 0, "offloaded": False, "underReplicated": False}
                    for i, (lid, n) in enumerate(ledgers)],
        "cursors": {name: {"markDeletePosition": md, "readPosition": lce,
                           "waitingReadOp": False, "pendingReadOps": 0,
                           "messagesConsumedCounter": counter, "cursorLedger": -1,
                           "cursorLedgerLastEntry": -1, "individuallyDeletedMessages": idm,
                           "lastLedgerSwitchTimestamp": "2026-11-20T10:15:02.512Z",
                           "state": "NoLedger", "active": True,
                           "numberOfEntriesSinceFirstNotAckedMessage": 1,
                           "totalNonContiguousDeletedMessagesRange": 0,
                           "subscriptionHavePendingRead": False,
                           "subscriptionHavePendingReplayRead": False, "properties": {}}
                    for name, (md, idm) in cursors.items()},
        "schemaLedgers": [],
    }


def plugin_listing(broker: str, namespace: str, topics: dict[str, dict[str, Any]]
                   ) -> dict[str, Any]:
    """The broker plugin's answer with stats (``stats=true``) for ``topics``: topic name ->
    its internalStats (:func:`stats_doc`). Each topic carries its ledgers' digest, a digest
    per cursor (their values matter only to a poll, not to stats readers) and the stats
    fields the plugin sends."""
    listed = []
    for name, doc in topics.items():
        ledger, entry = doc["lastConfirmedEntry"].split(":")
        listed.append({
            "topic": name,
            "ledgers": f"{doc['numberOfEntries']}:{doc['totalSize']}:{ledger}:{entry}",
            "cursors": {c: {"acks": "0" * 16, "batches": "0" * 16} for c in doc["cursors"]},
            "stats": {k: doc[k] for k in ("lastConfirmedEntry", "ledgers", "cursors",
                                          "numberOfEntries", "totalSize")}})
    return {"plugin": "cursorsync", "broker": broker, "brokers": [broker],
            "namespace": namespace, "topics": listed}
