"""One topic partition on both clusters: production, replication, markers, consumer acks.

The model, per partition, follows PULSAR-NOTES.md:

* Producers on A write entries (a batch of k messages is one entry). Some
  entries are never replicated to B: already replicated from elsewhere,
  ``replicate_to`` excluding B, or TTL-expired on the replicator cursor.
* The A -> B replicator copies every other entry, in order, one target entry
  per source entry, batch composition intact. Its lag is a base plus jitter,
  and a backlog burst holds every entry that would land inside it until it ends.
* Both brokers run PIP-33 replicated subscriptions. Every snapshot interval
  each writes a SNAPSHOT_REQUEST (replicated to the other), the other answers
  with a SNAPSHOT_RESPONSE carrying its last position (replicated back, with
  ``replicate_to`` the requester), and the requester writes a local-only
  SNAPSHOT marker keyed by its own last position. A snapshot whose response
  comes back after the timeout is dropped. When A's subscription
  markDeletePosition passes a cached snapshot, A writes an UPDATE marker (to
  every cluster); B moves its subscription's markDeletePosition there on
  arrival. A new snapshot starts only if data was written since the last
  completed one started. The cache keeps the newest N (older brokers'
  eviction; newer ones thin out the middle instead).
* Markers are never dispatched; A's dispatcher acks them on the subscription
  as its consumers read past them. On B nothing consumes before failover.
* Consumers on A ack each message a little after receiving it, out of order
  within a window; a few messages (holes) only much later; some batches get
  only part of their messages acked for a long time; optional cumulative acks
  ack everything before them.

Every random draw comes from generators seeded by (workload seed, partition),
so a workload always gives the same history.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from cursorsync.core.cursor import CursorState, fold
from cursorsync.core.keys import I64
from cursorsync.core.positions import MessageId, Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs, SegmentSet, TopicMapping, holes
from cursorsync_devtools.sim._production import Production, SourceMessages, consume
from cursorsync_devtools.sim._topics import (
    KIND_DATA,
    KIND_FOREIGN,
    KIND_MARKER,
    REPLICATED,
    SNAPSHOT,
    SNAPSHOT_REQUEST,
    SNAPSHOT_RESPONSE,
    UNREPLICATED_EXCLUDED,
    UNREPLICATED_INBOUND,
    UNREPLICATED_LOCAL,
    UPDATE,
    TopicBuilder,
    TopicLog,
)
from cursorsync_devtools.sim._workload import SkippableFrom, Workload

F64 = npt.NDArray[np.float64]

_EV_DATA, _EV_FOREIGN, _EV_TICK_A, _EV_TICK_B, _EV_ARRIVE_B, _EV_ARRIVE_A, _EV_COVER = range(7)


@dataclass(frozen=True)
class BuiltinTrace:
    """What Pulsar's own replicated subscription did on this partition."""

    snapshots_started: int
    snapshots_completed: int
    snapshots_timed_out: int
    snapshots_evicted: int
    updates_written: int
    #: UPDATE markers as they arrived on B: arrival time and the target entry index they name.
    update_arrival_ms: I64
    update_target_index: I64

    def target_acked_through(self, at_ms: float) -> int:
        """Index of the last target entry B's markDeletePosition covers at ``at_ms`` (-1: none)."""
        k = int(np.searchsorted(self.update_arrival_ms, at_ms, side="right"))
        return int(self.update_target_index[:k].max()) if k else -1


@dataclass(frozen=True)
class PartitionState:
    """The raw history of one partition on both clusters, with views at any instant.

    Usable on its own as a generator for property tests: ``source_cursor(t)``
    is the broker's cursor (CursorState with Ledgers), ``mapping(t)`` what a
    mapping builder knows, ``acked_messages(t)`` the per-message truth.
    """

    partition: int  #: -1 for a non-partitioned topic
    source: TopicLog
    target: TopicLog
    messages: SourceMessages
    #: Per source entry: when it counts as acked on A's subscription (markers: when read).
    source_entry_ack_ms: F64
    #: Per source entry: uniform draw deciding whether its evidence is dropped.
    evidence_u: F64
    builtin: BuiltinTrace
    consumer_delay_ms: int

    # -- the source cluster
    def source_acked_entries(self, at_ms: float) -> npt.NDArray[np.bool_]:
        """Entry-level acks on A at ``at_ms`` (a batch counts only when all its messages are)."""
        out = self.source_entry_ack_ms <= at_ms
        out[self.source.written_by(at_ms):] = False
        return out

    def acked_messages(self, at_ms: float) -> npt.NDArray[np.bool_]:
        return self.messages.ack_ms <= at_ms

    def source_cursor(self, at_ms: float) -> CursorState:
        """A's subscription as internalStats shows it: folded markDelete + individual ranges."""
        ledgers = self.source.ledgers_at(at_ms)
        acked = self.source_acked_entries(at_ms)
        rs = Runs.from_positions(self.source.ledger[acked], self.source.entry[acked]).ranges()
        md, idm = fold(self.source.fresh_position(), rs, ledgers)
        return CursorState(md, idm, ledgers)

    def partially_acked(self, at_ms: float) -> RangeSet:
        """Source batch entries with some but not all messages acked at ``at_ms``."""
        src = self.source
        data = np.flatnonzero((src.kind == KIND_DATA) & (src.msg_count > 0))
        if len(data) == 0:
            return RangeSet()
        acked = self.acked_messages(at_ms).astype(np.int64)
        counts = np.add.reduceat(acked, src.msg_start[data])
        part = data[(counts > 0) & (counts < src.msg_count[data])]
        return Runs.from_positions(src.ledger[part], src.entry[part]).ranges()

    def message_ids(self) -> list[MessageId]:
        """Client-visible ids of every source message, in order."""
        src = self.source
        e = self.messages.entry
        return [MessageId(int(lg), int(en), self.partition, int(bi)) for lg, en, bi in
                zip(src.ledger[e].tolist(), src.entry[e].tolist(),
                    self.messages.batch_index.tolist(), strict=True)]

    # -- the target cluster
    def target_fresh_cursor(self, at_ms: float) -> CursorState:
        return CursorState(self.target.fresh_position(), RangeSet(), self.target.ledgers_at(at_ms))

    def target_deliverable(self, at_ms: float) -> npt.NDArray[np.bool_]:
        """Target entries a consumer or reader can receive (not markers) existing at ``at_ms``."""
        out: npt.NDArray[np.bool_] = self.target.kind != KIND_MARKER
        out[self.target.written_by(at_ms):] = False
        return out

    def builtin_target_mark_delete(self, at_ms: float) -> Position:
        """B's markDeletePosition under Pulsar's replicated subscriptions at ``at_ms``."""
        i = self.builtin.target_acked_through(at_ms)
        return self.target.fresh_position() if i < 0 else self.target.position(i)

    # -- what the mapping builder knows
    def mapping(self, at_ms: float, *, evidence_drop: float = 0.0, lag_ms: int = 0,
                map_markers: bool = False,
                skippable_from: SkippableFrom = "markers") -> TopicMapping:
        """The TopicMapping a builder has at ``at_ms`` having read B up to ``at_ms - lag_ms``.

        Evidence pairs for every replicated entry it has seen (replicated
        markers only with ``map_markers``), minus the entries whose evidence
        is lost (``evidence_drop``, the same entries at every call); target
        markers as skippable runs (or only what a reader's entry-id holes
        reveal); target entries produced on B as foreign runs; and the source
        entries that are never replicated as unreplicated runs.
        """
        known = at_ms - lag_ms
        src, tgt = self.source, self.target
        nb = tgt.written_by(known)
        tl, te, kind, peer = tgt.ledger[:nb], tgt.entry[:nb], tgt.kind[:nb], tgt.peer[:nb]
        pair = peer >= 0
        if not map_markers:
            pair &= kind == KIND_DATA
        sidx = peer[pair]
        keep = self.evidence_u[sidx] >= evidence_drop
        sidx = sidx[keep]
        segments = SegmentSet.from_pairs(src.ledger[sidx], src.entry[sidx],
                                         tl[pair][keep], te[pair][keep])
        if skippable_from == "markers":
            marker = kind == KIND_MARKER
            skippable = Runs.from_positions(tl[marker], te[marker])
        else:
            seen = kind != KIND_MARKER
            skippable = holes(tl[seen], te[seen])
        foreign = Runs.from_positions(tl[kind == KIND_FOREIGN], te[kind == KIND_FOREIGN])
        na = src.written_by(known)
        never = src.reason[:na] != REPLICATED
        if not map_markers:
            never |= src.kind[:na] == KIND_MARKER
        unreplicated = Runs.from_positions(src.ledger[:na][never], src.entry[:na][never])
        return TopicMapping(segments, skippable, foreign, unreplicated)


# -------------------------------------------------------------------- the events


class _Partition:
    """The discrete-event run of one partition (both clusters, both directions)."""

    def __init__(self, w: Workload, partition: int, index: int, prod: Production,
                 msgs: SourceMessages, seeds: list[np.random.SeedSequence],
                 horizon_ms: int) -> None:
        self.w = w
        self.partition = partition
        self.prod = prod
        self.msgs = msgs
        self.horizon = horizon_ms
        ledger_rng, self.lag_rng, self.evidence_rng = (np.random.default_rng(s) for s in seeds)
        # Ledger ids come from each cluster's BookKeeper: sparse, increasing, unrelated across A/B.
        base_a = int(ledger_rng.integers(1, 1000)) + 100_000 * index
        base_b = int(ledger_rng.integers(1, 1000)) + 100_000 * index + 5_000_000
        self.a = TopicBuilder("A", ledger_rng, base_a, w.ledger_entries_a, w.ledger_id_gap)
        self.b = TopicBuilder("B", ledger_rng, base_b, w.ledger_entries_b, w.ledger_id_gap)
        self.entry_ack = np.maximum.reduceat(msgs.ack_ms, np.cumsum(prod.data_msgs)
                                             - prod.data_msgs)
        self.a_ack: list[float] = []
        self.a_prefix_ack: list[float] = []
        self.a_payload: dict[int, tuple[Any, ...]] = {}
        self.data_index = np.full(len(prod.data_ms), -1, np.int64)
        self.heap: list[tuple[int, int, int, Any]] = []
        self.seq = itertools.count()
        self.last_arr_ab = 0
        self.last_arr_ba = 0
        self.last_data_a = -1
        self.last_data_b = -1
        self.sid = itertools.count()
        self.a_pending: dict[int, int] = {}
        self.b_pending: dict[int, int] = {}
        self.a_completed_start = -1
        self.b_completed_start = -1
        #: A's snapshot cache, oldest first: [sid, source index, target index, cover_ms]
        self.cache: list[tuple[int, int, int, float]] = []
        self.started = self.completed = self.timed_out = self.evicted = self.updates = 0
        self.update_ms: list[int] = []
        self.update_idx: list[int] = []

    # -- plumbing
    def push(self, t: float, ev: int, payload: Any) -> None:
        at = math.ceil(t)  # the clock ticks in whole ms; never fire before t
        if at <= self.horizon:
            heapq.heappush(self.heap, (at, next(self.seq), ev, payload))

    def _lag(self) -> int:
        return self.w.replication_lag_ms + int(self.lag_rng.integers(0, self.w.replication_jitter_ms
                                                                      + 1))

    def replicate(self, a_idx: int, t: int) -> None:
        arr = t + self._lag()
        for start, dur in self.w.backlog_bursts:
            if start <= arr < start + dur:
                arr = start + dur
        arr = max(arr, self.last_arr_ab)
        self.last_arr_ab = arr
        self.push(arr, _EV_ARRIVE_B, a_idx)

    def send_back(self, t: int, payload: tuple[Any, ...]) -> None:
        arr = max(t + self._lag(), self.last_arr_ba)
        self.last_arr_ba = arr
        self.push(arr, _EV_ARRIVE_A, payload)

    def _a_appended(self, ack: float) -> None:
        self.a_ack.append(ack)
        prev = self.a_prefix_ack[-1] if self.a_prefix_ack else 0.0
        self.a_prefix_ack.append(max(prev, ack))

    def a_marker(self, t: int, marker_type: int, reason: int,
                 payload: tuple[Any, ...] | None = None) -> int:
        idx = self.a.append(t, KIND_MARKER, marker_type=marker_type, reason=reason)
        self._a_appended(float(t + self.w.consumer_delay_ms))
        if payload is not None:
            self.a_payload[idx] = payload
        if reason == REPLICATED:
            self.replicate(idx, t)
        return idx

    # -- the run
    def run(self) -> PartitionState:
        w = self.w
        for i, t in enumerate(self.prod.data_ms.tolist()):
            self.push(t, _EV_DATA, i)
        for j, t in enumerate(self.prod.foreign_ms.tolist()):
            self.push(t, _EV_FOREIGN, j)
        self.push(w.marker_interval_ms, _EV_TICK_A, None)
        self.push(w.marker_interval_ms + w.marker_interval_ms // 2, _EV_TICK_B, None)
        handlers = (self.on_data, self.on_foreign, self.on_tick_a, self.on_tick_b,
                    self.on_arrive_b, self.on_arrive_a, self.on_cover)
        while self.heap:
            t, _, ev, payload = heapq.heappop(self.heap)
            handlers[ev](t, payload)
        return self.state()

    def on_data(self, t: int, i: int) -> None:
        reason = int(self.prod.data_reason[i])
        idx = self.a.append(t, KIND_DATA, msgs=int(self.prod.data_msgs[i]), reason=reason)
        self.data_index[i] = idx
        self._a_appended(float(self.entry_ack[i]))
        self.last_data_a = t
        if reason == REPLICATED:
            self.replicate(idx, t)

    def on_foreign(self, t: int, j: int) -> None:
        self.b.append(t, KIND_FOREIGN, msgs=int(self.prod.foreign_msgs[j]),
                      reason=UNREPLICATED_EXCLUDED)
        self.last_data_b = t

    def on_tick_a(self, t: int, _: None) -> None:
        w = self.w
        for sid, start in list(self.a_pending.items()):
            if t - start > w.snapshot_timeout_ms:
                del self.a_pending[sid]
                self.timed_out += 1
        if self.last_data_a > self.a_completed_start:
            sid = next(self.sid)
            self.a_pending[sid] = t
            self.started += 1
            self.a_marker(t, SNAPSHOT_REQUEST, REPLICATED, ("request", sid))
        self.push(t + w.marker_interval_ms, _EV_TICK_A, None)

    def on_tick_b(self, t: int, _: None) -> None:
        w = self.w
        for sid, start in list(self.b_pending.items()):
            if t - start > w.snapshot_timeout_ms:
                del self.b_pending[sid]
        if self.last_data_b > self.b_completed_start:
            sid = next(self.sid)
            self.b_pending[sid] = t
            self.b.append(t, KIND_MARKER, marker_type=SNAPSHOT_REQUEST, reason=REPLICATED)
            self.send_back(t, ("b-request", sid))
        self.push(t + w.marker_interval_ms, _EV_TICK_B, None)

    def on_arrive_b(self, t: int, a_idx: int) -> None:
        """A source entry lands on B as one target entry, same batch."""
        a = self.a
        kind = a.kind[a_idx]
        b_idx = self.b.append(t, kind, msgs=a.msg_count[a_idx], marker_type=a.marker_type[a_idx],
                              reason=UNREPLICATED_INBOUND, peer=a_idx)
        a.peer[a_idx] = b_idx
        if kind == KIND_DATA:
            self.last_data_b = t
            return
        payload = self.a_payload.get(a_idx)
        if payload is None:
            return
        if payload[0] == "request":  # B answers with its last position: this very entry
            self.b.append(t, KIND_MARKER, marker_type=SNAPSHOT_RESPONSE, reason=REPLICATED)
            self.send_back(t, ("response", payload[1], b_idx))
        elif payload[0] == "update":
            self.update_ms.append(t)
            self.update_idx.append(payload[1])
        elif payload[0] == "b-response":
            start = self.b_pending.pop(payload[1], None)
            if start is not None and t - start <= self.w.snapshot_timeout_ms:
                self.b_completed_start = max(self.b_completed_start, start)
                self.b.append(t, KIND_MARKER, marker_type=SNAPSHOT, reason=UNREPLICATED_LOCAL)

    def on_arrive_a(self, t: int, payload: tuple[Any, ...]) -> None:
        """A marker written on B arrives on A (never replicated back)."""
        w = self.w
        if payload[0] == "b-request":
            self.a_marker(t, SNAPSHOT_REQUEST, UNREPLICATED_INBOUND)
            self.a_marker(t, SNAPSHOT_RESPONSE, REPLICATED, ("b-response", payload[1]))
            return
        _, sid, b_idx = payload
        resp = self.a_marker(t, SNAPSHOT_RESPONSE, UNREPLICATED_INBOUND)
        start = self.a_pending.pop(sid, None)
        if start is None or t - start > w.snapshot_timeout_ms:
            if start is not None:
                self.timed_out += 1
            return
        # Snapshot complete: keyed by A's last position (this response), B's from the response.
        self.completed += 1
        self.a_completed_start = max(self.a_completed_start, start)
        self.a_marker(t, SNAPSHOT, UNREPLICATED_LOCAL)
        cover = max(float(t), self.a_prefix_ack[resp])
        self.cache.append((sid, resp, b_idx, cover))
        while len(self.cache) > w.snapshot_cache_size:
            self.cache.pop(0)
            self.evicted += 1
        if np.isfinite(cover):
            self.push(cover, _EV_COVER, sid)

    def on_cover(self, t: int, sid: int) -> None:
        """A's markDeletePosition passed a snapshot: the newest covered one becomes an UPDATE."""
        covered = [c for c in self.cache if c[3] <= t]
        if not covered or covered[-1][0] != sid:
            return  # evicted, consumed, or a newer covered snapshot supersedes it
        newest = covered[-1]
        self.cache = [c for c in self.cache if c[1] > newest[1]]
        self.updates += 1
        self.a_marker(t, UPDATE, REPLICATED, ("update", newest[2]))

    def state(self) -> PartitionState:
        msg_start = np.full(len(self.a), -1, np.int64)
        starts = np.cumsum(self.prod.data_msgs) - self.prod.data_msgs
        msg_start[self.data_index] = starts
        source = self.a.build(msg_start.tolist())
        target = self.b.build()
        msgs = SourceMessages(self.data_index[self.msgs.entry], self.msgs.batch_index,
                              self.msgs.ack_ms)
        for arr in (msgs.entry, msgs.batch_index, msgs.ack_ms):
            arr.setflags(write=False)
        trace = BuiltinTrace(self.started, self.completed,
                             self.timed_out + len(self.a_pending), self.evicted, self.updates,
                             np.array(self.update_ms, np.int64),
                             np.array(self.update_idx, np.int64))
        return PartitionState(
            partition=self.partition, source=source, target=target, messages=msgs,
            source_entry_ack_ms=np.array(self.a_ack, np.float64),
            evidence_u=self.evidence_rng.random(len(source)), builtin=trace,
            consumer_delay_ms=self.w.consumer_delay_ms)


def simulate_partition(w: Workload, index: int, prod: Production,
                       seeds: list[np.random.SeedSequence], horizon_ms: int) -> PartitionState:
    """Run partition ``index``'s history up to ``horizon_ms``; ``seeds``: consume + 3 for the run.

    Its message ids carry partition ``index``, or -1 when the topic is not partitioned.
    """
    msgs = consume(w, prod, np.random.default_rng(seeds[0]))
    label = -1 if w.partitions == 1 else index
    return _Partition(w, label, index, prod, msgs, seeds[1:4], horizon_ms).run()
