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
  target ones become ``foreign`` (never acked), source ones stay unmapped
  (:mod:`cursorsync.mapping.identity_evidence`).
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
(their chunks before the last), so a hole is only a candidate: a hole check
(:mod:`cursorsync.mapping.skipped_ids`; config ``evidence.holes: verified``,
:mod:`cursorsync.mapping.hole_check`) keeps the ones the target says are markers, and
maps each chunk to the source chunk its stamp names; with ``claim_holes`` off
(``unacked``) none is. At the start of a partition's stream, the ids from the first
chunk of a chunked message the reader returned are candidates too (the reader read them
to assemble it). Without a check every candidate is claimed: the job never builds that (a
chunk claimed so would lose its message); the simulator does (holes are markers there).

The builder's state (last position seen, pending identity entries) is saved per
Spark batch (:mod:`cursorsync.mapping.builder_state`), so a replayed batch starts
from exactly the state its first run started from.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

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
from cursorsync.mapping.columns import SideRows, first_row_per_entry, partition_sides
from cursorsync.mapping.identity_evidence import (
    IdentityEvidence,
    forget_mapped_sources,
)
from cursorsync.mapping.outcome import BatchOutcome, BatchTotals
from cursorsync.mapping.pairs import Pairs
from cursorsync.mapping.skipped_ids import (
    LEDGER_END_PROBE,
    Defers,
    FollowsReads,
    HoleCheck,
    KnowsLedgers,
    MapsChunks,
    ledger_changes,
    ledgers_entered,
    read_before_first,
    source_chunk_spans,
)
from cursorsync.phases import Phases

log = logging.getLogger(__name__)

#: Skipped target ids checked on the target's admin API per batch, at most (one request
#: each while they are markers): a burst of markers (replicated subscriptions write a few
#: per partition and second while it has traffic) then spreads over batches instead of
#: holding back the batch's segments. Ids left over are checked first in the next batch.
HOLE_CHECKS_PER_BATCH = 4096

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
class BuilderSettings:
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


class MappingBuilder:
    """Turns batches of entry rows into mapping deltas; keeps the mapping it has built."""

    def __init__(self, config: BuilderSettings, state: dict[str, Any] | None = None,
                 hole_check: HoleCheck | None = None,
                 anchor_read: AnchorRead | None = None, spill: ArrayKeeper | None = None,
                 live: LiveLedgers | None = None, source_chunks: HoleCheck | None = None
                 ) -> None:
        """``anchor_read``: reads the source's markers (needed for ``snapshot``: without it no
        anchor is ever found, and the snapshot strategy only tells copies from foreign);
        ``spill``: where the known mappings settle (None: on the heap); ``live``: the first
        live ledgers the sync step finds, which trim the known mappings (None: kept whole);
        ``source_chunks``: a check on the source's admin API that maps the chunks of a
        source copy of a target chunked message to their originals by their stamps
        (:func:`source_chunk_spans`; a failback job's case)."""
        self.config, self.hole_check, self.anchor_read = config, hole_check, anchor_read
        self.source_chunks = source_chunks
        self.identity = IdentityEvidence.of(config.strategies, config.alignment_window)
        self.clock = time.time
        self._parts: dict[PartitionKey, PartitionState] = {}
        self.spill = spill
        self.known = PackedMappings(spill)  # built for the partitions a batch maps
        self.live = live
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
        totals = BatchTotals()
        candidates: dict[PartitionKey, Runs] = {}  # target ids skipped: markers, maybe
        source_holes: dict[PartitionKey, Runs] = {}  # source ids skipped: anchors, maybe
        spans: dict[PartitionKey, Runs] = {}  # source copies' chunks: their stamps, maybe
        entries_in = 0
        clock = Phases()
        if rows.num_rows:
            stamped = "position-property" in self.config.strategies
            entries = first_row_per_entry(rows, self.config.target_cluster if stamped else None)
            entries_in = entries.num_rows
            sides = partition_sides(entries, self.config.target_cluster,
                                    self.config.source_cluster)
            if self.config.claim_holes and isinstance(self.hole_check, KnowsLedgers):
                self.hole_check.learn_ledgers(ledgers_entered(
                    (key, target.ledger, self._parts[key].last_target if key in self._parts
                     else None) for key, target, _ in sides))
            for key, target, source in sides:
                delta = self._partition(key, target, source, totals, candidates,
                                        source_holes, spans)
                if delta is not None:
                    out[key] = delta
        clock.step("partitions")
        checked = self._checks_due(candidates)
        claimed, mapped, past_ends, deferred = self._claim_markers(checked, out, totals)
        if spans and isinstance(self.source_chunks, MapsChunks):
            self.source_chunks(spans)  # its markers say nothing here
            self._map_chunks({key: p.reversed() for key, p in
                              self.source_chunks.drain_chunks().items()}, out, totals)
        clock.step("check")
        if isinstance(self.hole_check, FollowsReads):
            self.hole_check.read_to({key: _decided_to(state.last_target, state.unchecked)
                                     for key, state in self._parts.items()
                                     if state.last_target is not None})
        clock.step("release")
        anchors = self._add_anchors(source_holes, out)
        clock.step("anchors")
        return BatchOutcome(
            out, entries_in, totals.pairs, totals.conflicts, totals.given_up_target,
            totals.given_up_source,
            skipped_ids=sum(r.entry_count() for r in checked.values()) - past_ends - deferred,
            skipped_claimed=claimed, skipped_mapped=mapped, anchors=anchors,
            unpaired=totals.unpaired,
            skipped_waiting={key: state.unchecked.entry_count()
                             for key, state in self._parts.items() if len(state.unchecked.rows)},
            live=live, seconds=clock.seconds, cpu_seconds=clock.cpu)

    def _partition(self, key: PartitionKey, target: SideRows, source: SideRows,
                   totals: BatchTotals, candidates: dict[PartitionKey, Runs],
                   source_holes: dict[PartitionKey, Runs],
                   spans: dict[PartitionKey, Runs]) -> TopicMapping | None:
        """One topic partition's rows of a batch: what they add to its mapping (None:
        nothing); its skipped ids go to ``candidates`` (target) and ``source_holes``, the
        chunks of its source copies of target chunked messages to ``spans``."""
        strategies = self.config.strategies
        state = self._parts.setdefault(key, PartitionState())
        known = self.known.get(key, TopicMapping())
        if "snapshot" in strategies and len(source):
            self._watch_source(key, state, source, source_holes)
        if self.config.claim_holes:
            self._hole_candidates(key, state, target, candidates)
        if len(target):
            state.last_target = target.last()

        stamped = (target.stamped if "position-property" in strategies
                   else np.zeros(len(target), bool))
        pairs = [target.stamp_pairs(stamped)] if stamped.any() else []
        if "position-property" in strategies and self.source_chunks is not None and len(source):
            copies, runs = source_chunk_spans(source)
            if copies is not None:
                pairs.append(copies)
            if len(runs.rows):
                spans[key] = runs
        if self.identity is not None:
            mapped = known.segments.source_ranges()
            if pairs:
                mapped = mapped | pairs[0].source_ranges()
            found = self.identity.find(state, target, source, ~stamped, mapped)
            pairs += [found.pairs] if found.pairs is not None else []
            foreign, unpaired = found.foreign, found.unpaired
            totals.count(found)
        else:
            # Only the stamp is trusted: an entry without it did not come from the source.
            foreign, unpaired = target.runs(~stamped), Runs()
        segments, merged = self._merge(key, known.segments, pairs, totals)
        forget_mapped_sources(state.source, merged)
        self.known.put(key, replace(known, segments=merged, foreign=known.foreign.union(foreign),
                                    unpaired=known.unpaired.union(unpaired)))
        if not (len(segments) or len(foreign) or len(unpaired)):
            return None
        return TopicMapping(segments, Runs(), foreign, unpaired=unpaired)

    def _watch_source(self, key: PartitionKey, state: PartitionState, source: SideRows,
                      source_holes: dict[PartitionKey, Runs]) -> None:
        """The ids the source reader skipped go to ``source_holes`` (markers: anchors, maybe);
        the source's tail is looked past for TAIL_WATCH_S from now."""
        skipped = holes(source.ledger, source.entry, previous=state.last_source)
        if len(skipped):
            source_holes[key] = skipped
        last = source.last()
        if state.last_source is None or last > state.last_source:
            state.last_source = last
        state.watch_until = self.clock() + TAIL_WATCH_S

    def _hole_candidates(self, key: PartitionKey, state: PartitionState, target: SideRows,
                         candidates: dict[PartitionKey, Runs]) -> None:
        """The ids the target reader skipped go to ``candidates``, and with a check the first
        LEDGER_END_PROBE ids past each ledger it moved on from."""
        skipped = holes(target.ledger, target.entry, previous=state.last_target)
        if self.hole_check is not None:  # never claimed unchecked: they may not exist
            if state.last_target is None:
                before, probe = read_before_first(target)
                if probe is not None:
                    state.probes = state.probes | {probe}
                skipped = Runs(np.concatenate([before, skipped.rows]))
            ends = [(p.ledger, p.entry + 1) for p in
                    ledger_ends(target.ledger, target.entry, previous=state.last_target)]
            if isinstance(self.hole_check, KnowsLedgers):  # ledgers read through whole
                ends += [(ledger, 0) for left, entered in
                         ledger_changes(target.ledger, state.last_target)
                         if entered > left + 1
                         for ledger in self.hole_check.ledgers_between(key, left, entered)]
            if ends:
                state.probes = state.probes | set(ends)
                probes = np.array([(ledger, entry, LEDGER_END_PROBE) for ledger, entry in ends],
                                  np.int64)
                skipped = Runs(np.concatenate([skipped.rows, probes]))
        if len(skipped):
            candidates[key] = skipped

    def _merge(self, key: PartitionKey, known: SegmentSet, pairs: list[Pairs],
               totals: BatchTotals) -> tuple[SegmentSet, SegmentSet]:
        """The batch's segments, and the partition's with them. Evidence that conflicts (two
        sources claimed for one target entry) is dropped for the batch, never guessed."""
        if not pairs:
            return SegmentSet(), known
        try:
            segments = Pairs.concat(pairs).segments()
            merged = known | segments
        except MappingConflictError as err:
            totals.conflicts += 1
            log.error("mapping evidence for %s conflicts and is dropped (never guessed): %s",
                      key, err)
            return SegmentSet(), known
        totals.pairs += segments.entry_count()
        return segments, merged

    def _checks_due(self, fresh: dict[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        """The skipped ids to check in this batch: those left by earlier batches first, then
        this batch's, whole runs, up to HOLE_CHECKS_PER_BATCH ids (at least one run); the
        rest wait in the partitions' state."""
        if self.hole_check is None:
            return fresh
        waiting = sorted((key, state) for key, state in self._parts.items()
                         if len(state.unchecked.rows))
        runs = [(key, row) for key, state in waiting for row in state.unchecked.rows.tolist()]
        runs += [(key, row) for key, r in sorted(fresh.items()) for row in r.rows.tolist()]
        due: dict[PartitionKey, list[list[int]]] = {}
        wait: dict[PartitionKey, list[list[int]]] = {}
        budget: float = (math.inf if isinstance(self.hole_check, FollowsReads)
                         else HOLE_CHECKS_PER_BATCH)
        for key, row in runs:
            if budget > 0 or not due:
                due.setdefault(key, []).append(row)
                budget -= row[2]
            else:
                wait.setdefault(key, []).append(row)
        for _, state in waiting:
            state.unchecked = Runs()
        for key, rows in wait.items():
            self._parts[key].unchecked = Runs(np.array(rows, np.int64))
        if wait:
            log.info("%d skipped target ids wait for a later batch's check (%d ids are "
                     "checked a batch)", sum(r[2] for rows in wait.values() for r in rows),
                     HOLE_CHECKS_PER_BATCH)
        return {key: Runs(np.array(rows, np.int64)) for key, rows in due.items()}

    def _add_anchors(self, source_holes: dict[PartitionKey, Runs],
                     out: dict[PartitionKey, TopicMapping]) -> int:
        """Read the source's markers at its skipped ids and past the tails being watched;
        add the anchors not known yet. Returns how many were added."""
        if "snapshot" not in self.config.strategies or self.anchor_read is None:
            return 0
        now = self.clock()
        tails = {k: state.last_source for k, state in self._parts.items()
                 if state.last_source is not None and state.watch_until >= now}
        if not source_holes and not tails:
            return 0
        found = self.anchor_read(source_holes, tails)
        for key, pos in found.tails.items():
            state = self._parts[key]
            if state.last_source is None or pos > state.last_source:
                state.last_source = pos
                state.watch_until = now + TAIL_WATCH_S
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

    def _claim_markers(self, candidates: dict[PartitionKey, Runs],
                       out: dict[PartitionKey, TopicMapping], totals: BatchTotals
                       ) -> tuple[int, int, int, int]:
        """Claim the candidate holes the check keeps (all of them without a check), and
        map the chunks it read; returns how many entry ids were claimed, how many mapped,
        how many probed past a ledger's last returned entry were neither (mostly ids
        past its end: no skipped id at all), and how many the check left for a later batch
        (:class:`~cursorsync.mapping.skipped_ids.Defers`)."""
        if not candidates:
            return 0, 0, 0, 0
        claimed = self.hole_check(candidates) if self.hole_check is not None else candidates
        deferred: set[PartitionKey] = (self.hole_check.drain_deferred()
                                       if isinstance(self.hole_check, Defers) else set())
        if deferred - candidates.keys() or deferred & claimed.keys():
            raise ValueError(f"hole check deferred partitions it was not asked about or "
                             f"answered for: {sorted(map(str, deferred))}")
        waits = 0
        for key in deferred:
            state = self._parts[key]
            state.unchecked = Runs(np.concatenate([state.unchecked.rows, candidates[key].rows]))
            waits += candidates[key].entry_count()
        candidates = {key: r for key, r in candidates.items() if key not in deferred}
        chunks: dict[PartitionKey, Pairs] = (
            self.hole_check.drain_chunks() if isinstance(self.hole_check, MapsChunks) else {})
        for key, ids in [*((k, r.ranges()) for k, r in claimed.items()),
                         *((k, p.segments().target_ranges()) for k, p in chunks.items())]:
            if len(ids) and (key not in candidates or len(ids - candidates[key].ranges())):
                raise ValueError(f"hole check answered for {key} with ids that were not "
                                 f"candidates: {ids}")
        mapped = self._map_chunks(chunks, out, totals)
        past_ends = self._continue_probes(candidates, claimed, mapped)
        total = 0
        for key, runs in claimed.items():
            if not len(runs):
                continue
            known = self.known.get(key, TopicMapping())
            self.known.put(key, replace(known, skippable=known.skippable.union(runs)))
            delta = out.get(key, TopicMapping())
            out[key] = replace(delta, skippable=delta.skippable.union(runs))
            total += runs.entry_count()
        return total, sum(r.count_entries() for r in mapped.values()), past_ends, waits

    def _map_chunks(self, chunks: Mapping[PartitionKey, Pairs],
                    out: dict[PartitionKey, TopicMapping], totals: BatchTotals
                    ) -> dict[PartitionKey, RangeSet]:
        """Add the chunk pairs the hole check read, as the stamped rows' pairs are added;
        returns the target ids mapped, per partition."""
        mapped: dict[PartitionKey, RangeSet] = {}
        if "position-property" not in self.config.strategies:
            return mapped  # no stamp is trusted (a third cluster's, or no broker writes them)
        for key, pairs in chunks.items():
            if not len(pairs):
                continue
            known = self.known.get(key, TopicMapping())
            segments, merged = self._merge(key, known.segments, [pairs], totals)
            if not len(segments):
                continue
            self.known.put(key, replace(known, segments=merged))
            delta = out.get(key, TopicMapping())
            out[key] = replace(delta, segments=delta.segments | segments)
            mapped[key] = segments.target_ranges()
        return mapped

    def _continue_probes(self, checked: Mapping[PartitionKey, Runs],
                         claimed: Mapping[PartitionKey, Runs],
                         mapped: Mapping[PartitionKey, RangeSet]) -> int:
        """A probe past a ledger's end whose ids were all markers or mapped chunks goes on
        with the next ones, first in the next batch; any other probe is done. Returns how
        many probed ids were neither claimed nor mapped."""
        unclaimed = 0
        for key, runs in checked.items():
            state = self._parts.get(key)
            if state is None or not state.probes:
                continue
            markers = claimed[key].ranges() if key in claimed else RangeSet()
            markers = markers | mapped.get(key, RangeSet())
            more = []
            for ledger, entry, count in runs.rows.tolist():
                if (ledger, entry) not in state.probes:
                    continue
                state.probes = state.probes - {(ledger, entry)}
                probed = RangeSet.entries(np.array([ledger]), np.array([entry]),
                                          np.array([count]))
                found = (markers & probed).count_entries()
                unclaimed += count - found
                if found == count:
                    more.append((ledger, entry + count, count))
                    state.probes = state.probes | {(ledger, entry + count)}
            if more:
                state.unchecked = Runs(np.concatenate([state.unchecked.rows,
                                                    np.array(more, np.int64)]))
        return unclaimed


def _decided_to(last_target: Position, unchecked: Runs) -> Position:
    """How far a partition's skipped ids are all decided: its last returned target entry,
    or just before the first id still waiting for a check, whichever comes first."""
    if not len(unchecked):
        return last_target
    first = unchecked.first()
    return min(last_target, Position(first.ledger, first.entry - 1))


__all__ = ["EVIDENCE", "AnchorFindings", "AnchorRead", "BatchOutcome", "BuilderSettings",
           "MappingBuilder"]
