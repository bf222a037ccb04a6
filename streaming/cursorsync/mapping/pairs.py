"""Entry pairs, what every evidence strategy finds: a source entry and the target entry that
copies it, one numpy array per column, before they collapse into segments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cursorsync.core.keys import I64
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Evidence, SegmentSet, evidence_code


@dataclass(frozen=True)
class Pairs:
    """(source ledger:entry -> target ledger:entry) pairs, each with the code of the evidence
    that found it (:func:`cursorsync.core.segments.evidence_code`); the arrays are of one
    length."""

    source_ledger: I64
    source_entry: I64
    target_ledger: I64
    target_entry: I64
    evidence: npt.NDArray[np.int8]

    @classmethod
    def of(cls, source_ledger: I64, source_entry: I64, target_ledger: I64, target_entry: I64,
           evidence: Evidence) -> Pairs:
        """Pairs all found by one kind of evidence."""
        return cls(source_ledger, source_entry, target_ledger, target_entry,
                   np.full(len(source_ledger), evidence_code(evidence), np.int8))

    @classmethod
    def concat(cls, pairs: Sequence[Pairs]) -> Pairs:
        """All of ``pairs`` (at least one), in order."""
        return cls(np.concatenate([p.source_ledger for p in pairs]),
                   np.concatenate([p.source_entry for p in pairs]),
                   np.concatenate([p.target_ledger for p in pairs]),
                   np.concatenate([p.target_entry for p in pairs]),
                   np.concatenate([p.evidence for p in pairs]))

    def reversed(self) -> Pairs:
        """The pairs read the other way: what a check on the source finds names the target
        entry a source entry copies, in a check's (stamp, checked id) order."""
        return Pairs(self.target_ledger, self.target_entry, self.source_ledger,
                     self.source_entry, self.evidence)

    def segments(self) -> SegmentSet:
        """The pairs collapsed into segments; MappingConflictError where two sources are
        claimed for one target entry."""
        return SegmentSet.from_pairs(self.source_ledger, self.source_entry, self.target_ledger,
                                     self.target_entry, self.evidence)

    def source_ranges(self) -> RangeSet:
        """The source entries paired (conflicts or not)."""
        return SegmentSet.from_pairs(self.source_ledger, self.source_entry, self.target_ledger,
                                     self.target_entry, self.evidence,
                                     validate=False).source_ranges()

    def __len__(self) -> int:
        return len(self.source_ledger)


__all__ = ["Pairs"]
