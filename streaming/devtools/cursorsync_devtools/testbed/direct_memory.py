"""The brokers' pooled direct memory through a run: where a bed that runs out of it stood.

Read from each broker's allocator stats (``/admin/v2/broker-stats/allocator-stats/default``:
the pool the broker's connections and entry reads allocate from, a few kilobytes to
answer). Not from ``/metrics``: at thousands of topics that answer is tens of megabytes,
itself built in direct memory, and asking for it during a run has run brokers out of it.
Other direct allocations (the bookie's own pools, unpooled buffers) are not in this figure.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx

from cursorsync_devtools.testbed.testbed import TestBedError

ALLOCATOR_STATS = "/admin/v2/broker-stats/allocator-stats/default"
#: Seconds between two reads of every broker.
EVERY_S = 20.0


def pooled_direct_mb(cluster: str, doc: Any) -> float:
    """Megabytes the allocator's direct arenas hold (``usedDirectMemory``)."""
    used = doc.get("usedDirectMemory") if isinstance(doc, Mapping) else None
    if not isinstance(used, int) or used < 0:
        raise TestBedError(f"cluster {cluster}: allocator stats without a usedDirectMemory "
                           f"count: {str(doc)[:200]}")
    return used / 2**20


class DirectMemoryWatch:
    """Reads every broker's pooled direct memory every ``every_s`` on a thread of its own
    while in its ``with`` block, and once more at its end; :meth:`peaks` is the largest
    read per cluster (None for a broker that never answered: a run goes on without it)."""

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
                r = self._http.get(url.rstrip("/") + ALLOCATOR_STATS)
                r.raise_for_status()
                mb = pooled_direct_mb(cluster, r.json())
            except (httpx.HTTPError, ValueError, TestBedError):
                continue  # a broker busy or gone: its peak is what was read
            peak = self._peaks[cluster]
            self._peaks[cluster] = mb if peak is None else max(peak, mb)

    def peaks(self) -> dict[str, float | None]:
        """The largest pooled direct memory read per cluster, in MB (one decimal)."""
        return {c: None if mb is None else round(mb, 1) for c, mb in self._peaks.items()}
