"""The brokers' direct memory through a run: where a bed that runs out of it stood.

Read from each broker's ``jvm_memory_direct_bytes_used`` on ``/metrics/``: all of the JVM's
direct memory Netty counts against ``-XX:MaxDirectMemorySize`` (the broker's pools, its
bookie's, the unpooled buffers), the figure an ``OutOfDirectMemoryError`` compares. The
bed must run with ``exposeTopicLevelMetricsInPrometheus=false`` (:data:`BED_SETTINGS`):
with topic-level metrics the answer is tens of megabytes at thousands of topics, itself
built in direct memory, and asking for it during a run has run brokers out of it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from types import TracebackType

import httpx

from cursorsync_devtools.testbed.testbed import TestBedError

METRICS = "/metrics/"
#: What a bed's brokers need for a light ``/metrics/`` answer (namespace-level figures).
BED_SETTINGS = {"exposeTopicLevelMetricsInPrometheus": "false"}
#: Seconds between two reads of every broker.
EVERY_S = 20.0

_USED = re.compile(r"^jvm_memory_direct_bytes_used(?:\{[^}]*\})? (\S+)$", re.M)


def direct_mb(cluster: str, text: str) -> float:
    """Megabytes of direct memory in use, from a broker's ``/metrics/`` answer."""
    m = _USED.search(text)
    try:
        used = float(m.group(1)) if m else -1.0
    except ValueError:
        used = -1.0
    if used < 0:
        raise TestBedError(f"cluster {cluster}: /metrics/ without a jvm_memory_direct_bytes_used "
                           f"figure: {text[:200]!r}")
    return used / 2**20


class DirectMemoryWatch:
    """Reads every broker's direct memory every ``every_s`` on a thread of its own while
    in its ``with`` block, and once more at its end; :meth:`peaks` is the largest read per
    cluster (None for a broker that never answered: a run goes on without it)."""

    def __init__(self, admin_urls: Mapping[str, str], *, every_s: float = EVERY_S,
                 http: httpx.Client | None = None) -> None:
        self.urls = dict(admin_urls)
        self.every_s = every_s
        self._http = http or httpx.Client(timeout=10.0)
        self._peaks: dict[str, float | None] = dict.fromkeys(self.urls)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="direct-memory-watch",
                                        daemon=True)

    def __enter__(self) -> DirectMemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.read()
        self._http.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(self.every_s)

    def read(self) -> None:
        """Read every broker once; one that does not answer is skipped this time."""
        for cluster, url in self.urls.items():
            try:
                r = self._http.get(url.rstrip("/") + METRICS)
                r.raise_for_status()
                mb = direct_mb(cluster, r.text)
            except (httpx.HTTPError, TestBedError):
                continue  # a broker busy or gone: its peak is what was read
            peak = self._peaks[cluster]
            self._peaks[cluster] = mb if peak is None else max(peak, mb)

    def peaks(self) -> dict[str, float | None]:
        """The largest direct memory read per cluster, in MB (one decimal)."""
        return {c: None if mb is None else round(mb, 1) for c, mb in self._peaks.items()}
