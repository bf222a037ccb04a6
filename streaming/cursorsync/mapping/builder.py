"""The mapping builder: entries read from both clusters -> segments and runs.

Pure (numpy + pyarrow tables in, core values out), so the Spark job only
feeds it batches. Per topic partition it applies the evidence strategies in
the configured order:

* ``position-property``: a target entry carrying the source-position property
  maps to that source entry, exactly.
* ``identity``: target entries without the property, and source entries not
  mapped yet, wait in a bounded window per side; they are paired by entry
  identity digest with :func:`cursorsync.core.alignment.align` (ambiguous
  = unpaired). Entries that fall out of the window unpaired are given up on:
  target ones become ``foreign`` (never acked), source ones stay unmapped.

* ``snapshot``: the source's SNAPSHOT markers, read through an :data:`AnchorRead` at
  the ids the source reader skipped and just past the last one it returned, become
  anchors (:mod:`cursorsync.core.anchors`). Target entries no other strategy maps are
  told apart by identity digest: one whose digest the source stream shows is a copy
  (``unpaired``), which anchors may ack; one it never shows is ``foreign``.

Skippable target entries are the holes in the target reader's stream (ids it
never returned: markers). Holes are claimed between entries the reader
returned, never after the last one. A reader cannot see the end of a ledger, so
where it moved on to a later ledger, the ids after the last one it returned
there are probed, LEDGER_END_PROBE at a time, up to the first that is not a
marker or does not exist (with a check only). Chunked messages also leave holes
(their chunks before the last), so a hole is only a candidate: a
:data:`HoleCheck` (config ``evidence.holes: verified``,
:mod:`cursorsync.mapping.hole_check`) keeps the ones the target says are
markers; with ``claim_holes`` off (``unacked``) none is. Without a check every
candidate is claimed: the job never builds that (a chunk claimed so would lose its
message); the simulator does, where holes are markers by construction.

The builder's state (last position seen, pending identity entries) is saved per
Spark batch (:mod:`cursorsync.mapping.builder_state`), so a replayed batch starts
from exactly the state its first run started from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.alignment import align
from cursorsync.core.anchors import Anchors
from cursorsync.core.packed import ArrayKeeper, PackedMappings
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.core.retention import LiveLedgers
from cursorsync.core.segments import (
    EVIDENCE,
    Evidence,
    Runs,
    SegmentSet,
    TopicMapping,
    evidence_code,
    holes,
    ledger_ends,
)
from cursorsync.errors import MappingConflictError
from cursorsync.mapping.builder_state import (
    PartitionState,
    json_parts,
    state_parts,
    state_table,
)
from cursorsync.mapping.columns import (
    by_partition,
    by_position,
    first_row_per_entry,
    is_valid,
    streams_and_times,
)

log = logging.getLogger(__name__)

#: Skipped target ids checked on the target's admin API per batch, at most (one request
#: each while they are markers): a burst of markers (replicated subscriptions write a few
#: per partition and second while it has traffic) then spreads over batches instead of
#: holding back the batch's segments. Ids left over are checked first in the next batch.
HOLE_CHECKS_PER_BATCH = 4096

#: Ids probed past a ledger's last returned entry at a time (markers written after the
#: ledger's last message, before it rolled: a few per replicated subscription); a probe
#: that finds only markers goes on with the next ones in a later batch.
LEDGER_END_PROBE = 32

#: Candidate hole runs per topic partition in; the runs that are markers out (a subset).
#: Ids that do not exist (past a ledger's end) are not markers.
HoleCheck = Callable[[Mapping[PartitionKey, Runs]], dict[PartitionKey, Runs]]
#: The source's skipped ids (hole runs) and, per partition, a position to look past (the
#: markers after the last entry a reader returned) in; the anchors found there out, and the
#: last marker position seen past each tail (looked past next time, never again at).
AnchorRead = Callable[[Mapping[PartitionKey, Runs], Mapping[PartitionKey, Position]],
                      "AnchorFindings"]
#: After a partition's last source entry or marker, its tail is looked past for this long:
#: the snapshot that covers the last message is written after it, within the brokers'
#: snapshot timeout (30 s by default).
TAIL_WATCH_S = 45.0


@dataclass(frozen=True)
class AnchorFindings:
    anchors: dict[PartitionKey, Anchors] = field(default_factory=dict)
    #: The last marker found past each tail looked at.
    tails: dict[PartitionKey, Position] = field(default_factory=dict)


@dataclass(frozen=True)
class BuilderConfig:
    source_cluster: str
    target_cluster: str
    strategies: tuple[Evidence, ...] = ("position-property", "identity")
    alignment_window: int = 10_000
    #: Take the ids a target reader skips for markers (skippable). Off (config
    #: ``evidence.holes: unacked``): they are never acked, for topics with chunks.
    claim_holes: bool = True

    def __post_init__(self) -> None:
        for s in self.strategies:
            evidence_code(s)

    @property
    def digests(self) -> bool:
        """Identity digests are compared: to pair entries, or to tell copies from foreign."""
        return "identity" in self.strategies or "snapshot" in self.strategies


@dataclass(frozen=True)
class BatchOutcome:
    """What one batch added, per topic partition, and what it gave up on."""

    mappings: dict[PartitionKey, TopicMapping]
    entries_in: int
    pairs: int
    conflicts: int
    given_up_target: int
    given_up_source: int
    #: Skipped target ids (hole candidates) checked in this batch, those claimed skippable.
    skipped_ids: int = 0
    skipped_claimed: int = 0
    #: Snapshot anchors found on the source, and target entries taken as copies.
    anchors: int = 0
    unpaired: int = 0
    #: Skipped target ids left for later batches' checks (HOLE_CHECKS_PER_BATCH), in all.
    skipped_waiting: int = 0
    #: First live (source, target) ledgers the sync found rows before (cursorsync.core.retention).
    live: dict[PartitionKey, tuple[int | None, int | None]] = field(default_factory=dict)


class MappingBuilder:
    """Turns batches of entry rows into mapping deltas; keeps the mapping it has built."""

    def __init__(self, config: BuilderConfig, state: dict[str, Any] | None = None,
                 hole_check: HoleCheck | None = None,
                 anchor_read: AnchorRead | None = None, spill: ArrayKeeper | None = None) -> None:
        """``anchor_read``: reads the source's markers (needed for ``snapshot``: without it no
        anchor is ever found, and the snapshot strategy only tells copies from foreign);
        ``spill``: where the known mappings settle (None: on the heap)."""
        self.config, self.hole_check, self.anchor_read = config, hole_check, anchor_read
        self.clock = time.time
        self._parts: dict[PartitionKey, PartitionState] = {}
        self.spill = spill
        self.known = PackedMappings(spill)  # built for the partitions a batch maps
        self.live: LiveLedgers | None = None  # the sync's: trims known (cursorsync.core.retention)
        if state is not None:
            self.load_state(state)

    # -- state
    def state(self) -> pa.Table:
        return state_table(self._parts)

    def load_state(self, state: pa.Table | dict[str, Any]) -> None:
        """A :meth:`state`, or a version 1 JSON document (what a job before it wrote)."""
        self._parts = state_parts(state) if isinstance(state, pa.Table) else json_parts(state)

    def seed_known(self, known: Mapping[PartitionKey, TopicMapping]) -> None:
        """The mapping already in the table (at start-up), to validate new evidence against."""
        self.known = PackedMappings.of(known, self.spill)

    # -- processing
    def process(self, rows: pa.Table) -> BatchOutcome:
        """One batch of ``pulsar-entries`` rows from either cluster."""
        self.known.next_batch()
        live = self.live.trim(self.known) if self.live is not None else {}
        out: dict[PartitionKey, TopicMapping] = {}
        totals = {"pairs": 0, "conflicts": 0, "gt": 0, "gs": 0, "unpaired": 0}
        candidates: dict[PartitionKey, Runs] = {}
        source_holes: dict[PartitionKey, Runs] = {}
        entries_in = 0
        if rows.num_rows:
            stamped = "position-property" in self.config.strategies
            entries = first_row_per_entry(rows, self.config.target_cluster if stamped else None)
            entries_in = entries.num_rows
            for key, part in by_partition(entries):
                delta = self._partition(key, part, totals, candidates, source_holes)
                if delta is not None:
                    out[key] = delta
        checked = self._due(candidates)
        claimed, past_ends = self._claim(checked, out)
        anchors = self._anchors(source_holes, out)
        return BatchOutcome(out, entries_in, totals["pairs"], totals["conflicts"],
                            totals["gt"], totals["gs"],
                            sum(r.entry_count() for r in checked.values()) - past_ends,
                            claimed,
                            anchors, totals["unpaired"],
                            sum(st.unchecked.entry_count() for st in self._parts.values()
                                if len(st.unchecked.rows)), live)

    def _due(self, fresh: dict[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        """The skipped ids to check in this batch: those left by earlier batches first, then
        this batch's, whole runs, up to HOLE_CHECKS_PER_BATCH ids (at least one run); the
        rest wait in the partitions' state."""
        if self.hole_check is None:
            return fresh
        waiting = sorted((key, st) for key, st in self._parts.items() if len(st.unchecked.rows))
        runs = [(key, row) for key, st in waiting for row in st.unchecked.rows.tolist()]
        runs += [(key, row) for key, r in sorted(fresh.items()) for row in r.rows.tolist()]
        due: dict[PartitionKey, list[list[int]]] = {}
        wait: dict[PartitionKey, list[list[int]]] = {}
        budget = HOLE_CHECKS_PER_BATCH
        for key, row in runs:
            if budget > 0 or not due:
                due.setdefault(key, []).append(row)
                budget -= row[2]
            else:
                wait.setdefault(key, []).append(row)
        for _, st in waiting:
            st.unchecked = Runs()
        for key, rows in wait.items():
            self._parts[key].unchecked = Runs(np.array(rows, np.int64))
        if wait:
            log.info("%d skipped target ids wait for a later batch's check (%d ids are "
                     "checked a batch)", sum(r[2] for rows in wait.values() for r in rows),
                     HOLE_CHECKS_PER_BATCH)
        return {key: Runs(np.array(rows, np.int64)) for key, rows in due.items()}

    def _anchors(self, source_holes: dict[PartitionKey, Runs],
                 out: dict[PartitionKey, TopicMapping]) -> int:
        """Read the source's markers at its skipped ids and past the tails being watched;
        add the anchors not known yet. Returns how many were added."""
        if "snapshot" not in self.config.strategies or self.anchor_read is None:
            return 0
        now = self.clock()
        tails = {k: st.last_source for k, st in self._parts.items()
                 if st.last_source is not None and st.watch_until >= now}
        if not source_holes and not tails:
            return 0
        found = self.anchor_read(source_holes, tails)
        for key, pos in found.tails.items():
            st = self._parts[key]
            if st.last_source is None or pos > st.last_source:
                st.last_source = pos
                st.watch_until = now + TAIL_WATCH_S
        added = 0
        for key, anchors in found.anchors.items():
            known = self.known.get(key, TopicMapping())
            have = {tuple(r) for r in known.anchors.rows.tolist()}
            new = [r for r in anchors.rows.tolist() if tuple(r) not in have]
            if not new:
                continue
            fresh = Anchors(np.array(new, np.int64))
            self.known.put(key, replace(known, anchors=known.anchors.union(fresh)))
            delta = out.get(key, TopicMapping())
            out[key] = replace(delta, anchors=delta.anchors.union(fresh))
            added += len(fresh)
        return added

    def _claim(self, candidates: dict[PartitionKey, Runs],
               out: dict[PartitionKey, TopicMapping]) -> tuple[int, int]:
        """Claim the candidate holes the check keeps (all of them without a check);
        returns how many entry ids were claimed, and how many probed past a ledger's last
        returned entry were not (mostly ids past its end: no skipped id at all)."""
        if not candidates:
            return 0, 0
        claimed = self.hole_check(candidates) if self.hole_check is not None else candidates
        past_ends = self._continue_probes(candidates, claimed)
        total = 0
        for key, runs in claimed.items():
            if not len(runs):
                continue
            if key not in candidates or len(runs.ranges() - candidates[key].ranges()):
                raise ValueError(f"hole check answered for {key} with ids that were not "
                                 f"candidates: {runs.rows.tolist()}")
            known = self.known.get(key, TopicMapping())
            self.known.put(key, replace(known, skippable=known.skippable.union(runs)))
            delta = out.get(key, TopicMapping())
            out[key] = replace(delta, skippable=delta.skippable.union(runs))
            total += runs.entry_count()
        return total, past_ends

    def _continue_probes(self, checked: Mapping[PartitionKey, Runs],
                         claimed: Mapping[PartitionKey, Runs]) -> int:
        """A probe past a ledger's end whose ids were all markers goes on with the next
        ones, first in the next batch; any other probe is done. Returns how many probed
        ids were not claimed."""
        unclaimed = 0
        for key, runs in checked.items():
            st = self._parts.get(key)
            if st is None or not st.probes:
                continue
            markers = claimed[key].ranges() if key in claimed else RangeSet()
            more = []
            for lg, e, n in runs.rows.tolist():
                if (lg, e) not in st.probes:
                    continue
                st.probes = st.probes - {(lg, e)}
                probed = RangeSet.entries(np.array([lg]), np.array([e]), np.array([n]))
                found = (markers & probed).count_entries()
                unclaimed += n - found
                if found == n:
                    more.append((lg, e + n, n))
                    st.probes = st.probes | {(lg, e + n)}
            if more:
                st.unchecked = Runs(np.concatenate([st.unchecked.rows,
                                                    np.array(more, np.int64)]))
        return unclaimed

    def _partition(self, key: PartitionKey, entries: pa.Table, totals: dict[str, int],
                   candidates: dict[PartitionKey, Runs],
                   source_holes: dict[PartitionKey, Runs]) -> TopicMapping | None:
        cfg = self.config
        st = self._parts.setdefault(key, PartitionState())
        known = self.known.get(key, TopicMapping())
        clusters = entries.column("cluster")
        tgt = by_position(entries.filter(pc.equal(clusters, cfg.target_cluster)))
        src = by_position(entries.filter(pc.equal(clusters, cfg.source_cluster)))
        tl = tgt.column("ledger").to_numpy()
        te = tgt.column("entry").to_numpy()
        sl = src.column("ledger").to_numpy()
        se = src.column("entry").to_numpy()

        if "snapshot" in cfg.strategies and len(sl):
            found = holes(sl, se, previous=st.last_source)
            if len(found):
                source_holes[key] = found
            last = Position(int(sl[-1]), int(se[-1]))
            if st.last_source is None or last > st.last_source:
                st.last_source = last
            st.watch_until = self.clock() + TAIL_WATCH_S

        if cfg.claim_holes:
            found = holes(tl, te, previous=st.last_target)
            if self.hole_check is not None:  # never claimed unchecked: they may not exist
                ends = [(p.ledger, p.entry + 1) for p in
                        ledger_ends(tl, te, previous=st.last_target)]
                if ends:
                    st.probes = st.probes | set(ends)
                    probes = np.array([(lg, e, LEDGER_END_PROBE) for lg, e in ends], np.int64)
                    found = Runs(np.concatenate([found.rows, probes]))
            if len(found):
                candidates[key] = found
        if len(tl):
            st.last_target = Position(int(tl[-1]), int(te[-1]))

        pairs: list[tuple[np.ndarray, ...]] = []
        prop = tgt.column("source_position")
        has_prop = is_valid(prop)
        if "position-property" in cfg.strategies and has_prop.any():
            pl, pe = (tgt.column(c).to_numpy()[has_prop] for c in ("stamp_ledger", "stamp_entry"))
            pairs.append((pl, pe, tl[has_prop], te[has_prop],
                          np.full(int(has_prop.sum()), evidence_code("position-property"),
                                  np.int8)))

        foreign = unpaired = Runs()
        rest = ~has_prop if "position-property" in cfg.strategies else np.ones(len(tl), bool)
        if cfg.digests:
            digests = tgt.column("entry_identity").to_pylist()
            # No digest: outside the identity scope (an unbatched entry without the stamp,
            # with identity_scope batched), so nothing on the source can match it.
            undigested = rest & ~is_valid(tgt.column("entry_identity"))
            rest &= ~undigested
            t_stream, t_publish = streams_and_times(tgt)
            st.target.extend(tl[rest], te[rest],
                             [d for d, r in zip(digests, rest, strict=True) if r],
                             t_stream[rest], t_publish[rest])
            mapped = known.segments.source_ranges()
            if pairs:
                batch = SegmentSet.from_pairs(*pairs[0][:4], validate=False)
                mapped = mapped | batch.source_ranges()
            fresh = ~mapped.contains_arrays(sl, se) if len(sl) else np.zeros(0, bool)
            sd = src.column("entry_identity").to_pylist()
            fresh &= is_valid(src.column("entry_identity"))
            s_stream, s_publish = streams_and_times(src)
            st.source.extend(sl[fresh], se[fresh], [d for d, f in zip(sd, fresh, strict=True) if f],
                             s_stream[fresh], s_publish[fresh])
            pairs_id, unpaired, gt, gs = self._align(st)
            if pairs_id is not None:
                pairs.append(pairs_id)
            foreign = gt.union(Runs.from_positions(tl[undigested], te[undigested]))
            totals["gt"] += gt.entry_count() + int(undigested.sum())
            totals["gs"] += gs
            totals["unpaired"] += unpaired.entry_count()
        elif rest.any():
            # Only the property is trusted: an entry without it did not come from the source.
            foreign = Runs.from_positions(tl[rest], te[rest])

        segments = SegmentSet()
        if pairs:
            cat = [np.concatenate([p[i] for p in pairs]) for i in range(5)]
            try:
                segments = SegmentSet.from_pairs(cat[0], cat[1], cat[2], cat[3], cat[4])
                merged = known.segments | segments
            except MappingConflictError as err:
                totals["conflicts"] += 1
                log.error("mapping evidence for %s conflicts and is dropped (never guessed): %s",
                          key, err)
                segments = SegmentSet()
                merged = known.segments
            totals["pairs"] += segments.entry_count()
        else:
            merged = known.segments
        if len(st.source) and len(merged):
            # Source entries mapped by the property meanwhile no longer wait for a match.
            done = merged.source_ranges().contains_arrays(np.array(st.source.ledger, np.int64),
                                                          np.array(st.source.entry, np.int64))
            st.source.keep(~done)
        self.known.put(key, replace(known, segments=merged, foreign=known.foreign.union(foreign),
                                    unpaired=known.unpaired.union(unpaired)))
        if not (len(segments) or len(foreign) or len(unpaired)):
            return None
        return TopicMapping(segments, Runs(), foreign, unpaired=unpaired)

    def _align(self, st: PartitionState
               ) -> tuple[tuple[np.ndarray, ...] | None, Runs, Runs, int]:
        """Pair pending entries by identity (with ``identity``), or only find the target
        entries whose digest the source shows (``snapshot`` alone); age out what the window
        no longer holds. Returns the pairs, the target entries given up as copies
        (``unpaired``: their digest is on the source) and as foreign, and how many source
        entries were given up."""
        if "identity" not in self.config.strategies:
            on_source = set(st.source.digest)
            copy = np.array([d in on_source for d in st.target.digest], bool)
            unpaired = self._given_up(st, copy, on_source)[0]
            st.target.keep(~copy)
            copies, foreign, gone_s = self._window(st)
            return None, unpaired.union(copies), foreign, gone_s
        if not len(st.source) and not len(st.target):
            return None, Runs(), Runs(), 0
        src, tgt = st.source.waiting(), st.target.waiting()
        done = align(src, tgt, st.memory, window=self.config.alignment_window)
        st.memory = done.memory
        result = None
        if len(done.source):
            result = (src.ledger[done.source], src.entry[done.source],
                      tgt.ledger[done.target], tgt.entry[done.target],
                      np.full(len(done.source), evidence_code("identity"), np.int8))
        unpaired, foreign = self._given_up(st, done.target_gone, set(st.source.digest))
        st.target.keep(done.target_kept)
        st.source.keep(done.source_kept)
        return result, unpaired, foreign, int(done.source_gone.sum())

    def _given_up(self, st: PartitionState, gone: np.ndarray,
                  on_source: set[bytes]) -> tuple[Runs, Runs]:
        """Target entries given up on, split: copies (``snapshot`` on and their digest on the
        source) and foreign (the rest)."""
        if not gone.any():
            return Runs(), Runs()
        tl = np.array(st.target.ledger, np.int64)
        te = np.array(st.target.entry, np.int64)
        copy = np.zeros(len(gone), bool)
        if "snapshot" in self.config.strategies:
            copy = np.array([g and d in on_source for d, g in zip(st.target.digest, gone,
                                                                   strict=True)], bool)
        foreign = gone & ~copy
        return (Runs.from_positions(tl[copy], te[copy]),
                Runs.from_positions(tl[foreign], te[foreign]))

    def _window(self, st: PartitionState) -> tuple[Runs, Runs, int]:
        """Age out what the window no longer holds: target entries as copies or foreign
        (:meth:`_given_up`), source entries counted."""
        win = self.config.alignment_window
        copies = gone_t = Runs()
        gone_s = 0
        if len(st.target) > win:
            n = len(st.target) - win
            old = np.arange(len(st.target)) < n
            copies, gone_t = self._given_up(st, old, set(st.source.digest))
            st.target.keep(~old)
        if len(st.source) > win:
            gone_s = len(st.source) - win
            st.source.keep(np.arange(len(st.source)) >= gone_s)
        return copies, gone_t, gone_s


__all__ = ["EVIDENCE", "AnchorFindings", "AnchorRead", "BatchOutcome", "BuilderConfig",
           "MappingBuilder"]
