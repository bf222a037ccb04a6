"""The failover check: switch a subscription's consumers to b and count every delivery.

For one subscription and the workload's ground truth, a consumer of the
subscription's type attaches to b (nothing else consumes it there now),
receives until b has nothing more to give, and acknowledges nothing. Every
delivery of a workload message is counted (a message delivered twice counts
twice). Then, per message:

* **duplicate**: delivered on b although acked on a. Explained kinds, counted
  apart: a message of a partially acked batch (no broker statistic shows
  batch-index acks, so the entry is unacked on a), a chunked message (never
  mapped), one acked on a after the observation the last completed sync used.
  The rest is **unexplained**: for cursorsync, a defect.
* **lost**: not acked on a, and never delivered on b. For anyone, a disaster.
* **foreign** messages (produced on b only) must all be delivered: nobody
  acked them on a, so nobody may ack them on b.

The redelivery forecast taken before the failover (``cursorsync status --forecast``)
names a cause for each explained kind; :func:`forecast_misses` checks the counts against
it: equal where it is exact, at most its bound, at least its floor where unknown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import pulsar

from cursorsync.app.forecast import Figure
from cursorsync_devtools.testbed.acking import consumer_type
from cursorsync_devtools.testbed.testbed import TestBed
from cursorsync_devtools.testbed.workload import WorkloadResult

log = logging.getLogger(__name__)

#: How long the first message may take (a Failover subscription's consumer becomes active
#: after the broker's activeConsumerFailoverDelayTimeMillis, 1 s), and how long b must stay
#: silent afterwards before the subscription is taken as drained.
FIRST_MESSAGE_S = 5.0
QUIET_S = 2.0


@dataclass
class FailoverCounts:
    """Per-message counts of one subscription after failover to b."""

    messages: int = 0
    acked_on_source: int = 0
    deliveries: int = 0
    duplicates: int = 0
    partial_batch: int = 0
    chunked: int = 0
    acked_after_sync: int = 0
    unexplained: int = 0
    losses: int = 0
    foreign: int = 0
    foreign_delivered: int = 0

    @property
    def foreign_acked(self) -> int:
        """Foreign messages b does not deliver: acked there by someone, lost to consumers."""
        return self.foreign - self.foreign_delivered

    def add(self, other: FailoverCounts) -> FailoverCounts:
        return FailoverCounts(**{k: v + getattr(other, k) for k, v in asdict(self).items()})

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "foreign_acked": self.foreign_acked}


#: The forecast cause (cursorsync.app.forecast.CAUSES) that predicts each counted kind: a
#: duplicate the count cannot explain is an acked entry whose copy the sync left unacked.
FORECAST_CAUSES = {"partial_batch": "partial_batches", "chunked": "chunks",
                   "acked_after_sync": "acked_since_sync", "unexplained": "acked_unmapped"}


def forecast_misses(counts: dict[str, int], forecast: dict[str, dict[str, Any]]) -> list[str]:
    """Where the counts (:meth:`FailoverCounts.to_dict`) disagree with a subscription's
    forecast (its causes' ``Figure.to_dict``), one sentence each; and any loss."""
    misses = [f"{counts['losses']} lost"] if counts["losses"] else []
    for kind, cause in FORECAST_CAUSES.items():
        if not figure_of(forecast[cause]).covers(counts[kind]):
            misses.append(f"{kind}: {counts[kind]} measured, forecast {cause} "
                          f"{forecast[cause]}")
    return misses


def figure_of(d: dict[str, Any]) -> Figure:
    """A forecast figure back from its JSON form."""
    return Figure(d["entries"], d["messages"], d["basis"], d["why"] or "", d["at_least"] or 0)


def drain(bed: TestBed, topic: str, subscription: str, kind: str, cluster: str = "b",
          batch_index_acks: bool = False) -> list[Any]:
    """Every message ``cluster`` delivers to a fresh consumer of ``subscription``, unacked
    (``batch_index_acks``: a consumer that skips the batch indexes the broker says are
    acked, as one acking by batch index does)."""
    consumer = bed.client(cluster).subscribe(
        bed.topic(topic), subscription, consumer_type=consumer_type(kind),
        initial_position=pulsar.InitialPosition.Earliest,
        batch_index_ack_enabled=batch_index_acks)
    got = []
    wait = FIRST_MESSAGE_S
    try:
        while True:
            try:
                got.append(consumer.receive(int(wait * 1000)))
            except pulsar.Timeout:
                break
            wait = QUIET_S
    finally:
        consumer.close()
    return got


def count(result: WorkloadResult, source_subscription: str, delivered: list[Any], *,
          synced_at: float | None = None) -> FailoverCounts:
    """Counts for deliveries on b of a subscription whose acks on a are those of
    ``source_subscription`` in the ground truth. ``synced_at``: when the source cursor was
    observed for the last completed sync (acks after it are explained as late)."""
    acked = result.acked.get(source_subscription, {})
    fully = result.acked_entries(source_subscription)
    by_key = result.by_key()
    foreign = {f.key for f in result.foreign}
    seen = Counter(m.properties().get("key") for m in delivered)
    c = FailoverCounts(messages=len(by_key), acked_on_source=sum(k in acked for k in by_key),
                       foreign=len(foreign))
    c.foreign_delivered = sum(1 for k in foreign if seen[k])
    for key, m in by_key.items():
        n = seen[key]
        c.deliveries += n
        if key not in acked:
            c.losses += n == 0
            continue
        if not n:
            continue
        c.duplicates += n
        if m.chunked:
            c.chunked += n
        elif m.batch_size and m.position not in fully[m.topic]:
            c.partial_batch += n
        elif synced_at is not None and acked[key] > synced_at:
            c.acked_after_sync += n
        else:
            c.unexplained += n
    return c


def failover(bed: TestBed, result: WorkloadResult, subscription: str, kind: str, *,
             source_subscription: str | None = None,
             synced_at: float | None = None, cluster: str = "b") -> FailoverCounts:
    """Drain ``subscription`` on b for every workload topic and count (see module doc).
    ``cluster="a"``: a restart on the source instead of a failover, counted alike."""
    names = list(result.spec.topics())
    index_acks = result.spec.batch_index_acks
    with ThreadPoolExecutor(len(names)) as pool:
        drained = list(pool.map(
            lambda n: drain(bed, n, subscription, kind, cluster, index_acks), names))
    total = FailoverCounts()
    for name, delivered in zip(names, drained, strict=True):
        total = total.add(count(_only(result, bed.topic(name)),
                                source_subscription or subscription, delivered,
                                synced_at=synced_at))
    return total


def failover_by_origin(bed: TestBed, result: WorkloadResult, subscription: str, kind: str, *,
                       synced_at: float | None = None) -> dict[str, FailoverCounts]:
    """:func:`failover`, counted apart per cluster the messages were produced on
    (``Produced.origin``). b's foreign messages count under b."""
    names = list(result.spec.topics())
    with ThreadPoolExecutor(len(names)) as pool:
        drained = list(pool.map(lambda n: drain(bed, n, subscription, kind), names))
    origins = sorted({m.origin for m in result.messages} | ({"b"} if result.foreign else set()))
    out = {o: FailoverCounts() for o in origins}
    for name, delivered in zip(names, drained, strict=True):
        mine = _only(result, bed.topic(name))
        for o in origins:
            part = WorkloadResult(mine.spec, [m for m in mine.messages if m.origin == o],
                                  mine.foreign if o == "b" else [], mine.acked,
                                  mine.started_at, mine.last_ack_at, mine.finished_at)
            out[o] = out[o].add(count(part, subscription, delivered, synced_at=synced_at))
    return out


def _only(result: WorkloadResult, topic: str) -> WorkloadResult:
    """The ground truth restricted to one topic (its partitions)."""
    def mine(t: str) -> bool:
        return t == topic or t.startswith(topic + "-partition-")

    return WorkloadResult(result.spec, [m for m in result.messages if mine(m.topic)],
                          [f for f in result.foreign if mine(f.topic)], result.acked,
                          result.started_at, result.last_ack_at, result.finished_at)


#: A cursor watch waits this many times as long as its last poll took before the next: a
#: poll of a thousand partitions (a request each: a partitioned-internalStats request makes
#: the broker ask itself for every partition at once, which costs it more CPU and direct
#: memory) keeps the broker and the job's driver process busy for a while, and the watch
#: measures the brokers and the job it loads (its resolution is a poll and its wait).
WATCH_PACE = 3.0


class CursorWatch:
    """Follows a subscription's cursor on b for topic partitions, in a thread, and notes
    when it last changed: how long Pulsar's replicated subscriptions take to bring b
    where they will bring it."""

    def __init__(self, bed: TestBed, partitions: list[str], subscription: str,
                 interval_s: float = 0.5) -> None:
        self.bed = bed
        self.partitions = partitions
        self.subscription = subscription
        self.interval_s = interval_s
        self.last_change = time.time()
        #: The last poll and the wait after it: two of them without a change are quiet.
        self.cycle_s = interval_s
        self._state: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{subscription}",
                                        daemon=True)

    def start(self) -> CursorWatch:
        self.last_change = time.time()
        self._thread.start()
        return self

    def _poll(self) -> None:
        for p in self.partitions:
            cur = self.bed.internal_stats("b", p).get("cursors", {}).get(self.subscription)
            state = None if cur is None else (cur["markDeletePosition"],
                                              cur["individuallyDeletedMessages"])
            if self._state.get(p, "unset") != state:
                self._state[p] = state
                self.last_change = time.time()

    def _run(self) -> None:
        wait = self.interval_s
        while not self._stop.wait(wait):
            t0 = time.monotonic()
            try:
                self._poll()
            except Exception as err:  # a transient admin error: poll again
                log.debug("watching %s: %s", self.subscription, err)
            took = time.monotonic() - t0
            wait = max(self.interval_s, WATCH_PACE * took)
            self.cycle_s = took + wait

    def settle(self, quiet_s: float = 5.0, timeout_s: float = 90.0) -> float:
        """Wait until nothing changed for ``quiet_s`` or two poll cycles, the longer (at
        most ``timeout_s``), stop, and return when the last change happened (epoch
        seconds)."""
        deadline = time.monotonic() + timeout_s
        while (time.time() - self.last_change < max(quiet_s, 2 * self.cycle_s)
               and time.monotonic() < deadline):
            time.sleep(0.2)
        self._stop.set()
        self._thread.join()
        return self.last_change
