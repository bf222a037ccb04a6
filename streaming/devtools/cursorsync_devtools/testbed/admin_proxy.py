"""A fault-injecting HTTP proxy in front of a real Pulsar admin API.

Every request is forwarded to the real admin API unless the proxy's plan says
to fail it: answer 503, hang past the client's timeout, or answer 200 with a
body that is not JSON. What happened to each request is counted, so a test can
show that the faults it asked for did happen.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

import httpx

Fault = Literal["pass", "5xx", "hang", "malformed"]
#: request number (from 0) and path -> what to do with it.
Plan = Callable[[int, str], Fault]
#: Headers that belong to one hop, not to the answer.
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}


class AdminProxy:
    """``with AdminProxy(real_url, plan) as proxy:`` then point the job at ``proxy.url``."""

    def __init__(self, upstream: str, plan: Plan, *, hang_s: float = 12.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.plan = plan
        self.hang_s = hang_s
        self.counts: Counter[str] = Counter()
        self._n = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=30.0)
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="admin-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> AdminProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def _next(self, path: str) -> Fault:
        with self._lock:
            n = self._n
            self._n += 1
        fault = self.plan(n, path)
        with self._lock:
            self.counts[fault] += 1
        return fault

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fault = proxy._next(self.path)
                if fault == "hang":
                    proxy._closing.wait(proxy.hang_s)
                    self._answer(503, b"hung", {})
                    return
                if fault == "5xx":
                    self._answer(503, b"injected: service unavailable", {})
                    return
                if fault == "malformed":
                    self._answer(200, b"{not json", {"Content-Type": "application/json"})
                    return
                try:
                    resp = proxy._http.get(proxy.upstream + self.path)
                except httpx.HTTPError as err:
                    self._answer(502, f"upstream: {err}".encode(), {})
                    return
                headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
                self._answer(resp.status_code, resp.content, headers)

            def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (its timeout): nothing to answer
                    pass

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler


def faulty_for(seconds: float, *, every: int = 3, hangs: int = 2) -> Plan:
    """A plan: for ``seconds`` after its first request, every ``every``-th request fails,
    in turn 5xx, malformed, 5xx, hang (at most ``hangs`` hangs, each costing a client
    timeout); then everything passes."""
    start: list[float] = []
    hung = [0]
    lock = threading.Lock()

    def plan(n: int, path: str) -> Fault:
        with lock:
            if not start:
                start.append(time.monotonic())
            if time.monotonic() - start[0] > seconds or n % every:
                return "pass"
            turns: tuple[Fault, ...] = ("5xx", "malformed", "5xx", "hang")
            kind = turns[(n // every) % 4]
            if kind == "hang":
                if hung[0] >= hangs:
                    return "5xx"
                hung[0] += 1
            return kind

    return plan
