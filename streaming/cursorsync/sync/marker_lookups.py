"""Source entries looked up on the source's admin API while the sync plans.

Source entries a plan counts as unmapped are looked up, once each (a few per sync at
most; on the job's driver in the background, a batch taking the answers come since the
last, so that no batch waits for them): a marker never has a data counterpart (snapshot
markers at a ledger's end or after the last message, where no segment on either side
vouches for them), so it is not "waiting for evidence", and the plan can become exact.
Entries past the last mapped one are only looked up once the mapping has not moved for a
while: under traffic they are simply not mapped yet. With a tail check
(:data:`TailCheck`), those are not looked up one by one: one question per partition (a
reader on the source, or the source brokers' plugin answering for all their partitions at
once), on threads of their own and answered in a later batch, says
whether anything past the last mapped entry is dispatchable; if nothing is, every acked
entry past it is a marker or an aborted transaction's message, neither of which a
replicator sends as data. If something is (a message the mapping has not reached, or a
broker that answers its last entry whatever it is), they are looked up one by one as
without the check.

The source entries a gap between two segments shows were never replicated as data
(:func:`cursorsync.core.translate.implied_unreplicated`) are kept the same way, as found:
a gap across target ledgers can only be judged while the target's ledger list holds both
its ends, and what it says about those source entries stays true once the target has
deleted the ledgers and the list no longer shows it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Runs, TopicMapping
from cursorsync.core.translate import implied_unreplicated, unmapped_source
from cursorsync.errors import CursorSyncError

log = logging.getLogger(__name__)

#: Which of these source entries of a concrete topic are markers (asked of the source).
MarkerLookup = Callable[[str, list[Position]], list[Position]]
#: Whether a concrete topic holds no entry past a position that a consumer could receive,
#: by an answer of the source's brokers given no sooner than a time.monotonic() value
#: (:class:`cursorsync.pulsar.dispatchable.DispatchableTail`, ``PluginTail``).
TailCheck = Callable[[str, Position, float], bool]
#: Tail checks asked at once (each a reader opened and closed on the source, or a wait for
#: the brokers' plugin to answer for every partition).
TAIL_CHECK_THREADS = 8
#: A tail check is asked this long after the poll that saw its entries acked, at least. The
#: broker takes an entry into its last dispatchable position just after the entry becomes
#: readable; an entry acked before the poll was readable before it, so the broker's answer
#: covers it unless that one step took longer than this.
TAIL_CHECK_AFTER_POLL_S = 1.0
#: Source entries whose lookup is under way at once, at most, when lookups run in the
#: background (each lookup call asks up to the source admin client's workers at a time).
#: A batch asks only what the bound leaves free, so it is what a batch can drain: about
#: the seconds of a batch times the lookups answered a second (some 2,000 on the test bed
#: with 2 calls of 8 requests at once), not less.
MARKER_LOOKUPS_IN_FLIGHT = 8192
#: Lookup calls (a cursor's entries each) running at once in the background.
MARKER_LOOKUP_THREADS = 2
#: Source entries looked up per (topic partition, subscription) and sync, at most.
MARKER_LOOKUPS_PER_SYNC = 64
#: Source entries looked up per sync batch over all cursors, at most, and seconds a batch
#: spends on them, at most (the first reached ends the batch's lookups): a lookup only keeps
#: markers out of the unmapped count (no ack depends on it), so a batch never waits long on
#: them. Cursors left without budget go first in the next batch. The markers a broker writes
#: after each partition's last message (a few per partition) are the bulk at many
#: partitions, and a lookup costs about a millisecond of a batch at 8 at a time.
MARKER_LOOKUPS_PER_BATCH = 2048
MARKER_LOOKUP_SECONDS_PER_BATCH = 2.0
#: Unmapped entries past the last mapped one looked up per cursor and sync, in order. The
#: markers a broker writes after a partition's last message are a few; a lookup there
#: that finds a message means the mapping is behind, and nothing past that last mapped
#: entry is looked up again until it moves.
MARKER_TAIL_LOOKUPS = 8
#: Unmapped entries between mapped ones are not looked up while their partition's mapping
#: has skipped target ids waiting for their check (``mapping_waits``), for at most this
#: long: once the mapping has classified those ids, the gaps between its segments show
#: which source entries were never replicated as data (:meth:`MarkerLookups.judged`),
#: without a request each. Past it (ids that stay waiting), they are looked up.
MARKER_LOOKUP_WAIT_MAX_S = 300.0
#: Unmapped entries past the last mapped one are looked up once the mapping of their
#: partition has not moved for this long: as this step saw it, or by the newest row of
#: the mapping (a step that just started, as an executor's may be, has seen nothing).
MARKER_LOOKUP_SETTLE_S = 5.0


class Frontier(NamedTuple):
    """A partition's last mapped source entry, and when a step first saw it there."""

    last_mapped: Position
    #: On the step's clock (:attr:`MarkerLookups.clock`).
    seen_at: float


@dataclass
class MarkerCache:
    """What the source's admin API said, per topic partition: entries that are markers,
    every entry looked up, the last mapped source entry with when it was first seen, and
    the last mapped entries past which a lookup found a message (the mapping is behind)."""

    markers: dict[PartitionKey, RangeSet] = field(default_factory=dict)
    looked_up: dict[PartitionKey, RangeSet] = field(default_factory=dict)
    frontiers: dict[PartitionKey, Frontier] = field(default_factory=dict)
    behind: dict[PartitionKey, Position] = field(default_factory=dict)
    #: What each partition's gaps were last judged from (see :meth:`MarkerLookups.judged`).
    judged: dict[PartitionKey, tuple[int, ...]] = field(default_factory=dict)


class _Tail(NamedTuple):
    """A tail check under way: the last mapped entry it asks past, the acked entries past it
    it classifies (all listed by the source before the question), and the answer to come."""

    after: Position
    entries: list[Position]
    answer: Future[bool]


class _Asked(NamedTuple):
    """A lookup under way in the background: the partition's last mapped entry when asked,
    the entries asked, and the markers among them to come."""

    topic: str
    after: Position
    wanted: _Wanted
    answer: Future[list[Position]]


class MarkerLookups:
    """The lookups of one sync step: what was found (:class:`MarkerCache`, kept across
    batches) and this batch's budget.

    ``in_background``: lookups run on threads of their own, at most MARKER_LOOKUPS_IN_FLIGHT
    entries at a time, and a batch takes the answers come since the last (a batch then
    spends no time on them); otherwise a batch waits for its lookups, within its budget."""

    def __init__(self, lookup: MarkerLookup | None, tail_check: TailCheck | None = None, *,
                 in_background: bool = False) -> None:
        self.lookup = lookup
        self.tail_check = tail_check
        self.in_background = in_background
        self._asked: dict[PartitionKey, _Asked] = {}
        #: The entries of ``_asked``, counted as they come and go: summing them for each
        #: cursor a batch plans would cost a pass over every partition's call.
        self._in_flight = 0
        self._lookup_pool: ThreadPoolExecutor | None = None
        self._tails: dict[PartitionKey, _Tail] = {}
        #: Per partition, the last mapped entry past which a tail check found something
        #: dispatchable: its tail is looked up entry by entry until the mapping moves.
        self._dispatchable: dict[PartitionKey, Position] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.cache = MarkerCache()
        self.clock = time.monotonic
        self.wall_clock = time.time
        #: Source entries looked up in this batch, and the seconds they took.
        self.count = 0
        self.seconds = 0.0
        #: Tail checks answered in this batch, and the acked source entries they found markers.
        self.tail_checks = 0
        self.tail_markers = 0
        #: The first cursor a batch had no lookup budget left for: the next batch starts there.
        self.resume: tuple[PartitionKey, str] | None = None
        #: Partitions whose mapping has skipped target ids waiting for their check (set
        #: each batch, :meth:`mapping_waits`), and since when this step has seen each wait.
        self._waiting: dict[PartitionKey, float] = {}

    def mapping_waits(self, waiting: Iterable[PartitionKey]) -> None:
        """The partitions whose mapping has skipped target ids waiting for their check, as
        the ``mapping_waits`` table says now: their gaps are judged once those are
        classified, so their entries between mapped ones are not looked up meanwhile (for
        at most MARKER_LOOKUP_WAIT_MAX_S)."""
        now = self.clock()
        self._waiting = {key: self._waiting.get(key, now) for key in waiting}

    def _gaps_deferred(self, key: PartitionKey) -> bool:
        since = self._waiting.get(key)
        return since is not None and self.clock() - since < MARKER_LOOKUP_WAIT_MAX_S

    def next_batch(self) -> tuple[PartitionKey, str] | None:
        """A new batch's budget, with the tail checks and background lookups answered since
        the last; the cursor it starts at (None: the first)."""
        self.count = self.seconds = self.tail_checks = self.tail_markers = 0
        self._answered()
        self._looked_up()
        resume, self.resume = self.resume, None
        return resume

    def answered(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the tail checks and background lookups asked to be
        answered (the next batch takes their answers); True when all are."""
        deadline = time.monotonic() + timeout_s
        pending: list[Future[bool] | Future[list[Position]]] = [
            *(t.answer for t in self._tails.values()), *(a.answer for a in self._asked.values())]
        for answer in pending:
            try:
                answer.exception(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return False
        return True

    def close(self) -> None:
        """Stops asking: checks and lookups not yet begun are dropped."""
        for pool in (self._pool, self._lookup_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._lookup_pool = None
        self._tails.clear()
        self._asked.clear()
        self._in_flight = 0

    def markers(self, key: PartitionKey) -> RangeSet | None:
        return self.cache.markers.get(key) if self.cache.markers else None

    def with_markers(self, key: PartitionKey, mapping: TopicMapping) -> TopicMapping:
        """``mapping`` with the partition's known markers as unreplicated source entries."""
        found = self.cache.markers.get(key)
        if found is None or not found:
            return mapping
        b = found.bounds
        runs = Runs(np.stack([b[:, 0], b[:, 1] + 1, b[:, 3] - b[:, 1]], axis=1))
        return replace(mapping, unreplicated=mapping.unreplicated.union(runs))

    def judged(self, key: PartitionKey, mapping: TopicMapping, target_ledgers: Ledgers | None,
               source_ledgers: Ledgers | None) -> None:
        """Keep, with the markers found, the source entries (of ``source_ledgers``) that the
        gaps of ``mapping`` show were never replicated as data, judged on the target's live
        ``target_ledgers``. Judged again only when the segments, the known skippable runs or
        the ledger list changed."""
        segments, skips = mapping.segments.rows, mapping.skippable.rows
        if (target_ledgers is None or source_ledgers is None or len(segments) < 2
                or not len(skips) or not len(target_ledgers.ids)):
            return
        ids = target_ledgers.ids
        # Entry counts, not row counts: a run that grows or two that merge change them.
        seen = (mapping.segments.entry_count(), mapping.skippable.entry_count(), int(ids[0]),
                int(ids[-1]), len(ids), int(target_ledgers.entries[-1]))
        if self.cache.judged.get(key) == seen:
            return
        self.cache.judged[key] = seen
        found = implied_unreplicated(mapping, target_ledgers)
        known = self.cache.markers.get(key, RangeSet())
        new = list((found - known).iter_entries(source_ledgers))
        if new:
            self.cache.markers[key] = known | _entries(new)

    def look_up(self, obs: ObservedCursor, topic: str, mapping: TopicMapping,
                target: CursorState) -> bool:
        """Look up the plan's unmapped source entries not looked up before; True when some
        turned out to be markers."""
        if self.lookup is None or not len(mapping.segments):
            return False
        cache = self.cache
        seen = cache.looked_up.get(obs.key, RangeSet())
        pending = unmapped_source(obs.state, mapping, target.ledgers) - seen
        now = self.clock()
        frontier = self._frontier(obs.key, mapping, now)
        ledgers = obs.state.ledgers
        if ledgers is None or not pending:
            return False
        settled = self._settled(frontier, mapping, now)
        if (self.tail_check is not None
                and self._dispatchable.get(obs.key) != frontier.last_mapped):
            if settled and cache.behind.get(obs.key) != frontier.last_mapped:
                self._ask_tail(obs, topic, frontier.last_mapped,
                               pending.after(frontier.last_mapped), ledgers)
            settled = False  # the tail is the check's, not looked up entry by entry
        if self.in_background and obs.key in self._asked:
            return False  # its answer is a later batch's
        wanted = self._wanted(obs, pending, frontier, ledgers, settled=settled)
        if wanted is None:
            return False
        if self.in_background:
            self._ask(obs.key, topic, frontier.last_mapped, wanted)
            return False
        asked = wanted.entries
        self.count += len(asked)
        t0 = time.perf_counter()
        try:
            markers = self.lookup(topic, asked)
        except CursorSyncError as err:
            _not_looked_up(topic, err)
            return False
        finally:
            self.seconds += time.perf_counter() - t0
        return self._found(obs.key, topic, frontier.last_mapped, wanted, markers)

    def _found(self, key: PartitionKey, topic: str, after: Position, wanted: _Wanted,
               markers: list[Position]) -> bool:
        """Keeps what a lookup of ``wanted`` (asked while ``after`` was the partition's last
        mapped entry) found; True when some entries are markers."""
        cache = self.cache
        asked = wanted.entries
        cache.looked_up[key] = cache.looked_up.get(key, RangeSet()) | _entries(asked)
        if not set(wanted.past) <= set(markers):
            # A message past it: the mapping is behind.
            cache.behind[key] = after
        if not markers:
            return False
        cache.markers[key] = cache.markers.get(key, RangeSet()) | _entries(markers)
        log.debug("%s: %d of %d unmapped source entries are markers", topic, len(markers),
                  len(asked))
        return True

    def _ask(self, key: PartitionKey, topic: str, after: Position, wanted: _Wanted) -> None:
        """Starts looking up ``wanted`` in the background."""
        lookup = self.lookup
        assert lookup is not None
        if self._lookup_pool is None:
            self._lookup_pool = ThreadPoolExecutor(MARKER_LOOKUP_THREADS,
                                                   thread_name_prefix="marker-lookups")
        self._asked[key] = _Asked(topic, after, wanted,
                                  self._lookup_pool.submit(lookup, topic, wanted.entries))
        self._in_flight += wanted.size

    def _looked_up(self) -> None:
        """The answers of the background lookups done, kept as if looked up in this batch;
        a lookup that failed is asked again."""
        for key, asked in list(self._asked.items()):
            if not asked.answer.done():
                continue
            del self._asked[key]
            self._in_flight -= asked.wanted.size
            topic = asked.topic
            try:
                markers = asked.answer.result()
            except CursorSyncError as err:
                _not_looked_up(topic, err)
                continue
            self.count += asked.wanted.size
            self._found(key, topic, asked.after, asked.wanted, markers)

    def _ask_tail(self, obs: ObservedCursor, topic: str, after: Position, past: RangeSet,
                  ledgers: Ledgers) -> None:
        """Asks, unless a check of the partition is under way, whether anything past
        ``after`` is dispatchable, for the acked entries ``past`` it (the source's poll
        listed their ledgers before the question, so each is stored when it is asked)."""
        check = self.tail_check
        if obs.key in self._tails or check is None:
            return
        entries = list(past.iter_entries(ledgers))
        if not entries:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(TAIL_CHECK_THREADS, thread_name_prefix="tail-check")
        # On the monotonic clock from here: a wall clock set back later cannot make an
        # answer given before the poll look later than it.
        not_before = time.monotonic() + max(
            0.0, obs.observed_at.timestamp() + TAIL_CHECK_AFTER_POLL_S - self.wall_clock())
        self._tails[obs.key] = _Tail(after, entries,
                                     self._pool.submit(check, topic, after, not_before))

    def _answered(self) -> None:
        """The answers of the tail checks done: their entries are markers when nothing past
        the entry asked after is dispatchable; otherwise they are looked up one by one."""
        cache = self.cache
        for key, tail in list(self._tails.items()):
            if not tail.answer.done():
                continue
            del self._tails[key]
            try:
                nothing = tail.answer.result()
            except CursorSyncError as err:
                log.warning("%s; its source entries past %s stay unmapped", err, tail.after)
                continue
            self.tail_checks += 1
            if not nothing:
                self._dispatchable[key] = tail.after
                continue
            found = _entries(tail.entries)
            cache.markers[key] = cache.markers.get(key, RangeSet()) | found
            cache.looked_up[key] = cache.looked_up.get(key, RangeSet()) | found
            self.tail_markers += len(tail.entries)

    def _frontier(self, key: PartitionKey, mapping: TopicMapping, now: float) -> Frontier:
        """The partition's last mapped source entry, with when this step first saw it."""
        last = mapping.segments.rows[-1]
        frontier = Position(int(last[0]), int(last[1] + last[4] - 1))
        known = self.cache.frontiers.get(key)
        if known is None or known.last_mapped != frontier:
            self.cache.frontiers[key] = known = Frontier(frontier, now)
        return known

    def _settled(self, frontier: Frontier, mapping: TopicMapping, now: float) -> bool:
        """Whether the partition's mapping has not moved for MARKER_LOOKUP_SETTLE_S."""
        return now - frontier.seen_at >= MARKER_LOOKUP_SETTLE_S or (
            mapping.written_at is not None
            and self.wall_clock() - mapping.written_at >= MARKER_LOOKUP_SETTLE_S)

    def _wanted(self, obs: ObservedCursor, pending: RangeSet, frontier: Frontier,
                ledgers: Ledgers, *, settled: bool) -> _Wanted | None:
        """Which ``pending`` entries to look up within the budget left: those before the
        last mapped entry (unless the mapping's gaps wait for its check), and a few past it
        once the mapping ``settled``, unless a lookup found a message past it; None: none."""
        past = pending.after(frontier.last_mapped)
        if self.in_background:
            budget = min(MARKER_LOOKUPS_PER_SYNC, MARKER_LOOKUPS_IN_FLIGHT - self._in_flight)
        elif self.seconds >= MARKER_LOOKUP_SECONDS_PER_BATCH:
            budget = 0
        else:
            budget = min(MARKER_LOOKUPS_PER_SYNC, MARKER_LOOKUPS_PER_BATCH - self.count)
        if budget <= 0:
            if self.resume is None:
                self.resume = (obs.key, obs.subscription)
            return None
        before = [] if self._gaps_deferred(obs.key) else list(
            itertools.islice((pending - past).iter_entries(ledgers), budget))
        if len(before) == budget < MARKER_LOOKUPS_PER_SYNC and self.resume is None:
            self.resume = (obs.key, obs.subscription)  # cut short by the budget
        tail: list[Position] = []
        if settled and self.cache.behind.get(obs.key) != frontier.last_mapped:
            tail = list(itertools.islice(past.iter_entries(ledgers),
                                         min(MARKER_TAIL_LOOKUPS, budget - len(before))))
        return _Wanted(before, tail) if before or tail else None


class _Wanted(NamedTuple):
    """Source entries to look up: before the last mapped one, and past it."""

    before: list[Position]
    past: list[Position]

    @property
    def entries(self) -> list[Position]:
        return self.before + self.past

    @property
    def size(self) -> int:
        return len(self.before) + len(self.past)


def _not_looked_up(topic: str, err: CursorSyncError) -> None:
    log.warning("%s: cannot look up unmapped source entries (%s); they stay unmapped",
                topic, err)


def _entries(positions: list[Position]) -> RangeSet:
    return RangeSet.entries(np.array([p.ledger for p in positions], np.int64),
                            np.array([p.entry for p in positions], np.int64),
                            np.ones(len(positions), np.int64))
