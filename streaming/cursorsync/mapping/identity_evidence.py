"""Identity evidence, and what the snapshot strategy takes from identity digests: the mapping
builder's steps that compare entries by digest.

* ``identity``: target entries without the source-position stamp, and source entries not
  mapped yet, wait in a bounded window per side (the partition's pending entries); they are
  paired by entry identity digest with :func:`cursorsync.core.alignment.align` (ambiguous =
  unpaired). Entries that fall out of the window unpaired are given up on: target ones
  become ``foreign`` (never acked), source ones stay unmapped.
* ``snapshot``: a target entry given up on whose digest the source stream shows is a copy
  (``unpaired``), which anchors may ack, not foreign. Without ``identity`` nothing pairs:
  a target entry is a copy as soon as the source shows its digest, and foreign once it
  leaves the window without.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import numpy.typing as npt

from cursorsync.core.alignment import align
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Evidence, Runs, SegmentSet
from cursorsync.mapping.builder_state import PartitionState, Pending
from cursorsync.mapping.columns import SideRows
from cursorsync.mapping.pairs import Pairs

Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class IdentityFindings:
    """What comparing digests found in one topic partition's batch."""

    pairs: Pairs | None
    #: Target entries given up on as copies of source entries (their digest is on the source).
    unpaired: Runs
    #: Target entries given up on as foreign, and those without a digest.
    foreign: Runs
    #: Target entries in ``foreign``, counted as given up; source entries given up.
    given_up_target: int
    given_up_source: int


@dataclass(frozen=True)
class IdentityEvidence:
    """The digest comparisons the strategies ask for: pairs (``identity``), copies told from
    foreign (``snapshot``), in a window of ``window`` entries per side."""

    #: ``identity``: pair entries by digest.
    pair_entries: bool
    #: ``snapshot``: tell copies from foreign among the target entries given up on.
    tell_copies: bool
    window: int

    @classmethod
    def of(cls, strategies: tuple[Evidence, ...], window: int) -> IdentityEvidence | None:
        """None when no strategy compares digests."""
        if "identity" not in strategies and "snapshot" not in strategies:
            return None
        return cls("identity" in strategies, "snapshot" in strategies, window)

    def find(self, state: PartitionState, target: SideRows, source: SideRows,
             unstamped: Mask, mapped: RangeSet) -> IdentityFindings:
        """Add the batch's entries to the window (target entries ``unstamped`` picks, source
        entries not ``mapped`` already) and compare what waits there."""
        # No digest: outside the identity scope (an unbatched entry without the stamp,
        # with identity_scope batched), so nothing on the source can match it.
        undigested = unstamped & ~target.digested
        _wait(state.target, target, unstamped & ~undigested)
        fresh = ~mapped.contains_arrays(source.ledger, source.entry) if len(source) else (
            np.zeros(0, bool))
        _wait(state.source, source, fresh & source.digested)
        found = self._pair(state) if self.pair_entries else self._tell_copies(state)
        return replace(found, foreign=found.foreign.union(target.runs(undigested)),
                       given_up_target=found.given_up_target + int(undigested.sum()))

    def _pair(self, state: PartitionState) -> IdentityFindings:
        """Pair the pending entries by identity; age out what the window no longer holds."""
        if not len(state.source) and not len(state.target):
            return IdentityFindings(None, Runs(), Runs(), 0, 0)
        source, target = state.source.waiting(), state.target.waiting()
        done = align(source, target, state.memory, window=self.window)
        state.memory = done.memory
        pairs = None
        if len(done.source):
            pairs = Pairs.of(source.ledger[done.source], source.entry[done.source],
                             target.ledger[done.target], target.entry[done.target], "identity")
        unpaired, foreign = self._given_up(state, done.target_gone, set(state.source.digest))
        state.target.keep(done.target_kept)
        state.source.keep(done.source_kept)
        return IdentityFindings(pairs, unpaired, foreign, foreign.entry_count(),
                                int(done.source_gone.sum()))

    def _tell_copies(self, state: PartitionState) -> IdentityFindings:
        """Only find the target entries whose digest the source shows (``snapshot`` without
        ``identity``); age out what the window no longer holds."""
        on_source = set(state.source.digest)
        copy = np.array([d in on_source for d in state.target.digest], bool)
        unpaired = self._given_up(state, copy, on_source)[0]
        state.target.keep(~copy)
        copies, foreign, source_given_up = self._age_out(state)
        return IdentityFindings(None, unpaired.union(copies), foreign, foreign.entry_count(),
                                source_given_up)

    def _given_up(self, state: PartitionState, gone: Mask,
                  on_source: set[bytes]) -> tuple[Runs, Runs]:
        """Target entries given up on, split: copies (``snapshot`` on and their digest on the
        source) and foreign (the rest)."""
        if not gone.any():
            return Runs(), Runs()
        ledger = np.array(state.target.ledger, np.int64)
        entry = np.array(state.target.entry, np.int64)
        copy = np.zeros(len(gone), bool)
        if self.tell_copies:
            copy = np.array([g and d in on_source for d, g in zip(state.target.digest, gone,
                                                                   strict=True)], bool)
        foreign = gone & ~copy
        return (Runs.from_positions(ledger[copy], entry[copy]),
                Runs.from_positions(ledger[foreign], entry[foreign]))

    def _age_out(self, state: PartitionState) -> tuple[Runs, Runs, int]:
        """Age out what the window no longer holds: target entries as copies or foreign
        (:meth:`_given_up`), source entries counted."""
        copies = foreign = Runs()
        source_given_up = 0
        if len(state.target) > self.window:
            old = np.arange(len(state.target)) < len(state.target) - self.window
            copies, foreign = self._given_up(state, old, set(state.source.digest))
            state.target.keep(~old)
        if len(state.source) > self.window:
            source_given_up = len(state.source) - self.window
            state.source.keep(np.arange(len(state.source)) >= source_given_up)
        return copies, foreign, source_given_up


def forget_mapped_sources(pending: Pending, mapping: SegmentSet) -> None:
    """Source entries ``mapping`` maps (by the stamp, meanwhile) no longer wait for a match."""
    if len(pending) and len(mapping):
        done = mapping.source_ranges().contains_arrays(np.array(pending.ledger, np.int64),
                                                       np.array(pending.entry, np.int64))
        pending.keep(~done)


def _wait(pending: Pending, side: SideRows, picked: Mask) -> None:
    """The rows ``picked`` wait in ``pending``: position, digest, producer stream, publish time."""
    pending.extend(side.ledger[picked], side.entry[picked],
                   cast("list[bytes]", [side.digests[i] for i in np.flatnonzero(picked).tolist()]),
                   side.stream[picked], side.publish[picked])


__all__ = ["IdentityEvidence", "IdentityFindings", "forget_mapped_sources"]
