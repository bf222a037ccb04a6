"""Sync lag on the test bed: how long after a subscription acks an entry on a its
counterpart on b is acked too, per entry, for cursorsync and for Pulsar's built-in
replicated subscriptions side by side.

The live workload (:func:`run_live`) produces on a at a paced rate; per
subscription a consumer on a receives everything and acks it (the workload's
``Acker``), most entries promptly, some late (out of order), none never: a
hole for good would pin the built-in's markDeletePosition, and its lag would be
undefined. Each ack's time is taken as it leaves the consumer (the client may
hold it up to its ack grouping time, 100 ms, the same for every subscription).

Meanwhile :class:`CursorPoller` reads b's cursors (``partitioned-internalStats``,
one request per poll) and keeps every change with the time of the answer
showing it. Afterwards, for each source entry, its b counterpart (found by key)
and the first poll whose cursor covers it give the lag (:func:`lag_of`): the
markDeletePosition or the individually deleted ranges for cursorsync, which acks
entries one by one; the markDeletePosition alone for the built-in, which moves
nothing else. The poll interval is the resolution.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed.acking import AckChoice, Acker, Decisions
from cursorsync_devtools.testbed.produce import Plan, entries_of, produce
from cursorsync_devtools.testbed.testbed import TestBed, TestBedError
from cursorsync_devtools.testbed.workload import WorkloadResult, WorkloadSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveSpec:
    """The live workload: a partitioned topic, a paced rate, late acks."""

    topic: str
    partitions: int = 2
    rate_per_s: float = 200.0
    seconds: float = 60.0
    batched_fraction: float = 0.2
    batch_size: int = 5
    #: Share of entries acked late, by a delay drawn from ``late_delay_s``: out of order.
    late_fraction: float = 0.1
    late_delay_s: tuple[float, float] = (0.3, 2.0)
    #: Share of entries never acked: holes for good (the built-in's markDeletePosition
    #: stops at the first one, so its lag is undefined past it).
    never_fraction: float = 0.0
    seed: int = 23

    def plan(self, partitions: Sequence[str]) -> Plan:
        per_entry = 1 + self.batched_fraction * (self.batch_size - 1)
        entries = max(len(partitions), round(self.rate_per_s * self.seconds / per_entry))
        return Plan.of(partitions, entries, batched_fraction=self.batched_fraction,
                       batch_size=self.batch_size, seed=self.seed)

    def decisions(self, plan: Plan) -> Decisions:
        """Per message key, its entry's ack choice: prompt, late by a seeded delay, or
        never."""
        rng = random.Random(self.seed)
        out: Decisions = {}
        choice = AckChoice("prompt", 0.0, 1)
        for _, key, size, index in plan.messages():
            if index <= 0:  # an entry starts
                draw = rng.random()
                if draw < self.never_fraction:
                    choice = AckChoice("never", 0.0, 0)
                elif draw < self.never_fraction + self.late_fraction:
                    choice = AckChoice("late", rng.uniform(*self.late_delay_s), max(1, size))
                else:
                    choice = AckChoice("prompt", 0.0, max(1, size))
            out[key] = (choice, index)
        return out


def run_live(bed: TestBed, spec: LiveSpec, subscriptions: Mapping[str, bool]) -> WorkloadResult:
    """Produce the plan on a at its rate while a Shared consumer per subscription (``True``:
    with replicated subscription state) acks alike; returns once every ack went out.

    The topic must exist with ``spec.partitions`` partitions on both clusters."""
    partitions = bed.partitions(spec.topic)
    plan = spec.plan(partitions)
    decisions = spec.decisions(plan)
    ackers = [Acker(bed, bed.topic(spec.topic), sub, "Shared", replicated, decisions)
              for sub, replicated in subscriptions.items()]
    result = WorkloadResult(WorkloadSpec(partitioned_topic=spec.topic,
                                         partitions=spec.partitions, chunked_topic=None,
                                         subscription_types=("Shared",)),
                            started_at=time.time())
    for a in ackers:
        a.start()
    result.messages = produce(bed, plan, rate_per_s=spec.rate_per_s)
    for a in ackers:
        a.finish(len(result.messages), timeout_s=60 + spec.late_delay_s[1])
        result.acked[a.subscription] = dict(a.acked)
    result.last_ack_at = max((t for acks in result.acked.values() for t in acks.values()),
                             default=result.started_at)
    result.finished_at = time.time()
    return result


#: One cursor state as polled: (time of the answer, markDeletePosition, individually deleted).
CursorChange = tuple[float, str, str]


@dataclass
class CursorPoller:
    """Polls one partitioned topic's cursors on a cluster in a thread; keeps each change."""

    admin_url: str
    topic: str
    subscriptions: Sequence[str]
    interval_s: float = 0.1
    #: (topic partition, subscription) -> its changes in time order.
    changes: dict[tuple[str, str], list[CursorChange]] = field(default_factory=dict)
    polls: int = 0
    errors: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cursor-poller", daemon=True)
        self._path = TopicName.parse(self.topic).admin_path("partitioned-internalStats")

    def start(self) -> CursorPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(base_url=self.admin_url, timeout=10.0) as http:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    self._poll(http)
                except (httpx.HTTPError, KeyError, ValueError) as err:
                    self.errors += 1  # a slow or failed answer: the next poll tells
                    log.debug("polling %s: %s", self.topic, err)
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def _poll(self, http: httpx.Client) -> None:
        r = http.get(self._path)
        r.raise_for_status()
        at = time.time()
        self.polls += 1
        for name, stats in r.json()["partitions"].items():
            partition = str(TopicName.parse(name if "/" in name else f"{self.topic}/{name}"))
            for sub in self.subscriptions:
                cur = stats.get("cursors", {}).get(sub)
                if cur is None:
                    continue
                state = (cur["markDeletePosition"], cur["individuallyDeletedMessages"])
                seen = self.changes.setdefault((partition, sub), [])
                if not seen or seen[-1][1:] != state:
                    seen.append((at, *state))


def first_covered(changes: Sequence[CursorChange], positions: Sequence[Position], *,
                  individual: bool) -> np.ndarray:
    """Per position, the time of the first change whose cursor covers it (NaN: none did).
    ``individual``: the individually deleted ranges count, not only the markDeletePosition."""
    ledgers = np.array([p.ledger for p in positions], dtype=np.int64)
    entries = np.array([p.entry for p in positions], dtype=np.int64)
    first = np.full(len(positions), np.nan)
    for at, mark_delete, deleted in changes:
        left = np.flatnonzero(np.isnan(first))
        if len(left) == 0:
            break
        done = RangeSet.up_to(Position.parse(mark_delete))
        if individual:
            done = done | RangeSet.parse(deleted)
        first[left[done.contains_arrays(ledgers[left], entries[left])]] = at
    return first


@dataclass(frozen=True)
class Lag:
    """Per entry acked on a: seconds until b's cursor covered its counterpart."""

    samples: list[float]
    never_covered: int

    def figures(self) -> dict[str, Any]:
        s = np.array(self.samples)
        pct = (lambda q: round(float(np.percentile(s, q)), 3)) if len(s) else (lambda q: None)
        return {"entries": len(s) + self.never_covered, "covered": len(s),
                "never_covered": self.never_covered, "p50_s": pct(50), "p99_s": pct(99),
                "max_s": pct(100), "min_s": pct(0)}


Changes = Mapping[tuple[str, str], Sequence[CursorChange]]


def lag_of(result: WorkloadResult, subscription: str, on_target: Mapping[str, Position],
           changes: Changes, *, individual: bool) -> Lag:
    """The lag of every entry ``subscription`` acked on a, as the same subscription's cursor
    on b covered it. ``on_target``: message key -> entry on b; ``changes``: the cursor's
    changes on b (:attr:`CursorPoller.changes`)."""
    _, lag = lag_by_ack_time(result, subscription, on_target, changes,
                             individual=individual)
    covered = ~np.isnan(lag)
    return Lag(lag[covered].tolist(), int((~covered).sum()))


def lag_by_ack_time(result: WorkloadResult, subscription: str,
                    on_target: Mapping[str, Position], changes: Changes, *,
                    individual: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per entry acked on a: when it was acked, and its lag (NaN: never covered on b).
    See :func:`lag_of`."""
    acked = result.acked.get(subscription, {})
    per_partition: dict[str, list[tuple[float, Position]]] = {}
    for (topic, pos), messages in entries_of(result.messages).items():
        if not all(m.key in acked for m in messages):
            continue  # not acked on a: no lag to speak of
        targets = {on_target[m.key] for m in messages}
        if len(targets) != 1:
            raise TestBedError(f"{topic}: entry {pos} on a landed in {len(targets)} entries "
                               f"on b: {sorted(targets)}")
        per_partition.setdefault(topic, []).append(
            (max(acked[m.key] for m in messages), targets.pop()))
    times: list[np.ndarray] = [np.zeros(0)]
    lags: list[np.ndarray] = [np.zeros(0)]
    for topic, entries in per_partition.items():
        first = first_covered(changes.get((topic, subscription), []),
                              [p for _, p in entries], individual=individual)
        acked_at = np.array([t for t, _ in entries])
        times.append(acked_at)
        lags.append(first - acked_at)
    return np.concatenate(times), np.concatenate(lags)


def ack_windows(acked: np.ndarray, started_at: float, split_s: float
                ) -> tuple[tuple[str, np.ndarray], tuple[str, np.ndarray]]:
    """The entries acked (epoch seconds) in a workload's first ``split_s`` seconds and those
    acked after, each as its label and a mask over ``acked``."""
    early = acked < started_at + split_s
    return (f"first {split_s:g} s", early), (f"after {split_s:g} s", ~early)


def lag_windows(result: WorkloadResult, subscription: str, on_target: Mapping[str, Position],
                changes: Changes, *, individual: bool, split_s: float
                ) -> dict[str, dict[str, float | None]]:
    """p50 / p99 of the lag of the entries acked in the workload's first ``split_s`` seconds,
    and of those acked after (see :func:`lag_of`): a new topic's first seconds cost more (the
    brokers' first reads of it, and a job's), and a whole run's p99 is mostly theirs."""
    acked, lags = lag_by_ack_time(result, subscription, on_target, changes,
                                  individual=individual)
    out: dict[str, dict[str, float | None]] = {}
    for label, pick in ack_windows(acked, result.started_at, split_s):
        s = lags[pick & ~np.isnan(lags)]
        out[label] = {"entries": int(pick.sum()),
                      "p50_s": round(float(np.percentile(s, 50)), 3) if len(s) else None,
                      "p99_s": round(float(np.percentile(s, 99)), 3) if len(s) else None}
    return out


def uncovered(result: WorkloadResult, subscription: str, on_target: Mapping[str, Position],
              changes: Changes, *, individual: bool) -> int:
    """Entries acked on a that b's latest polled cursor does not cover yet."""
    latest = {k: v[-1:] for k, v in list(changes.items())}
    return lag_of(result, subscription, on_target, latest, individual=individual).never_covered
