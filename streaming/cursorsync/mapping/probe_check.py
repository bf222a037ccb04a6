"""Skipped target ids classified by the target's probe cursors (``evidence.holes: probe``).

Each target partition the mapping reads gets a probe subscription
(:mod:`cursorsync.pulsar.dispatch_probe`), placed at the first skipped id it is asked about
or just after the first position the mapping reports, whichever comes first. Once
the probe has received a message past a partition's candidates, one internalStats read
says which of them the broker filtered out of dispatch (:mod:`cursorsync.core.filtered`):
their leading runs are claimed. What the cursor read cannot answer goes to the per-id
check (:class:`~cursorsync.mapping.hole_check.AdminHoleCheck`): the rest of a run from a
chunk on (a request per id up to the first it can neither claim nor map, as there), ids
the probe does not vouch for (before its place, on a disturbed probe), and partitions
whose probe has not got that far for ``patience_s``. A probe that is only behind (placed,
trusted, before the partition's first candidate) gets there: the reader returned an entry
after every candidate, and the probe receives it. So such a partition's candidates wait
for a later batch (:class:`~cursorsync.mapping.skipped_ids.Defers`) until it has been
behind for ``patience_s``. Requests grow with chunked messages and restarts, not with
markers or load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import reduce

import numpy as np

from cursorsync.core.filtered import split_filtered
from cursorsync.core.positions import Position
from cursorsync.core.records import BuiltinUpdate, PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.hole_check import AdminHoleCheck
from cursorsync.mapping.pairs import Pairs
from cursorsync.pulsar.dispatch_probe import DispatchProbe

log = logging.getLogger(__name__)

#: The steps of a probe check whose time is kept (:attr:`ProbeCheckStats.seconds`).
STEPS = ("place", "wait", "read", "per-id", "release")


@dataclass
class ProbeCheckStats:
    """Totals since start, for logs and metrics."""

    #: Ids claimed on a probe cursor's word.
    filtered: int = 0
    #: Ids handed to the per-id check.
    per_id: int = 0
    #: Ids dropped as past their ledger's end.
    absent: int = 0
    #: Ids left for a later batch, each time (a probe behind them).
    deferred: int = 0
    #: Seconds spent, by step: placing probes, waiting for them, reading their cursors,
    #: the per-id check, acking the probes.
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEPS, 0.0))



class _Clock:
    """Adds the time of each step to a batch's and to the totals."""

    def __init__(self, totals: dict[str, float]) -> None:
        self.totals, self.batch = totals, dict.fromkeys(STEPS, 0.0)
        self._at = time.monotonic()

    def step(self, name: str) -> None:
        now = time.monotonic()
        self.batch[name] += now - self._at
        self.totals[name] += now - self._at
        self._at = now

    def skip(self) -> None:
        self._at = time.monotonic()

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f} s" for k, v in self.batch.items() if v >= 0.005)


class ProbeHoleCheck:
    """A :data:`~cursorsync.mapping.builder.HoleCheck` on probe cursors, per id where they
    cannot answer."""

    def __init__(self, probe: DispatchProbe, per_id: AdminHoleCheck, wait_s: float = 5.0,
                 patience_s: float = 60.0) -> None:
        self.probe, self.per_id, self.wait_s = probe, per_id, wait_s
        self.patience_s = patience_s
        self.stats = ProbeCheckStats()
        self.clock = time.monotonic
        #: Since when each partition's candidates have waited for a probe that is behind.
        self._behind_since: dict[PartitionKey, float] = {}
        self._deferred: set[PartitionKey] = set()

    def __call__(self, candidates: Mapping[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        clock = _Clock(self.stats.seconds)
        runs = {key: r for key, r in candidates.items() if len(r)}
        topics = {key: key.concrete_topic() for key in runs}
        places: dict[str, Position] = {}
        for key, r in runs.items():
            if not self.probe.is_placed(topics[key]):
                places[topics[key]] = r.first()
        self.probe.place_all(places)
        clock.step("place")
        wanted = {topics[key]: _last(r) for key, r in runs.items()
                  if self.probe.vouches_after(topics[key]) is not None}
        ready = self.probe.wait_past(wanted, self.wait_s) if wanted else set()
        clock.step("wait")
        reads = self.probe.read(sorted(ready)) if ready else {}
        clock.step("read")
        claimed: dict[PartitionKey, list[Runs]] = {}
        left: dict[PartitionKey, Runs] = {}
        now = self.clock()
        for key, r in runs.items():
            read = reads.get(topics[key])
            if read is None:
                if self._waits(key, topics[key], r, wanted, now):
                    self._deferred.add(key)
                    self.stats.deferred += r.entry_count()
                else:
                    left[key] = r
                continue
            self._behind_since.pop(key, None)
            split = split_filtered(r, read.acked, read.own, read.sizes)
            self.stats.filtered += split.filtered.entry_count()
            self.stats.absent += split.absent
            if len(split.filtered):
                claimed.setdefault(key, []).append(split.filtered)
            if len(split.left):
                left[key] = split.left
        per_id = sum(r.entry_count() for r in left.values())
        self.stats.per_id += per_id
        clock.skip()
        for key, more in (self.per_id(left) if left else {}).items():
            claimed.setdefault(key, []).append(more)
        clock.step("per-id")
        log.info("probe check of %d partitions: %d placed, %d probes read, %d left for a "
                 "later batch, %d ids to the per-id check (%s)", len(runs), len(places),
                 len(reads), len(self._deferred), per_id, clock)
        return {key: reduce(Runs.union, parts) for key, parts in claimed.items()}

    def _waits(self, key: PartitionKey, topic: str, runs: Runs, wanted: Mapping[str, Position],
               now: float) -> bool:
        """Whether a partition whose probe has not got past its candidates leaves them for a
        later batch: its probe vouches for all of them (placed before the first, trusted)
        and has been behind for less than ``patience_s``."""
        own = self.probe.vouches_after(topic)
        if topic not in wanted or own is None or runs.first() <= own:
            return False
        since = self._behind_since.setdefault(key, now)
        if now - since < self.patience_s:
            return True
        del self._behind_since[key]
        return False

    def drain_deferred(self) -> set[PartitionKey]:
        """The partitions whose candidates the last call left for a later batch."""
        found, self._deferred = self._deferred, set()
        return found

    def read_to(self, positions: Mapping[PartitionKey, Position]) -> None:
        """How far the mapping has read and classified each target partition: its probe
        acks up to there. A partition without a probe in this process gets one placed just
        after there, so that a probe subscription an earlier run left never holds the
        target's retention back, and later skipped ids find the probe in place."""
        clock = _Clock(self.stats.seconds)
        topics = {key.concrete_topic(): pos for key, pos in positions.items()}
        places = {topic: Position(pos.ledger, pos.entry + 1) for topic, pos in topics.items()
                  if not self.probe.is_placed(topic)}
        self.probe.place_all(places)
        clock.step("place")
        self.probe.release(topics)
        clock.step("release")
        if places:
            log.info("probes placed on %d partitions after what the mapping read (%s)",
                     len(places), clock)

    def requests_by_kind(self) -> dict[str, int]:
        """Admin requests made since start, by kind (the policies' reads aside)."""
        return {**self.per_id.requests_by_kind(),
                "cursor-read": self.probe.stats.cursor_reads,
                "plugin-cursor-read": self.probe.plugin_reads}

    def drain_updates(self) -> list[BuiltinUpdate]:
        """The built-in's moves read on the way: only from ids checked one by one."""
        return self.per_id.drain_updates()

    def ledgers_between(self, key: PartitionKey, after: int, before: int) -> list[int]:
        """The partition's ledgers strictly between two (see the per-id check's)."""
        return self.per_id.ledgers_between(key, after, before)

    def learn_ledgers(self, wanted: Mapping[PartitionKey, int]) -> None:
        self.per_id.learn_ledgers(wanted)

    def drain_chunks(self) -> dict[PartitionKey, Pairs]:
        """The chunks mapped by their stamps: only ids checked one by one are read."""
        return self.per_id.drain_chunks()

    def close(self) -> None:
        self.probe.close()


def _last(runs: Runs) -> Position:
    ends = runs.rows[:, 1] + runs.rows[:, 2] - 1
    i = np.lexsort((ends, runs.rows[:, 0]))[-1]
    return Position(int(runs.rows[i, 0]), int(ends[i]))


__all__ = ["STEPS", "ProbeCheckStats", "ProbeHoleCheck"]
