"""Which evidence holds for a topic, given the clusters it is replicated among.

With two clusters, every replicated entry on the target came from the source. With a
third cluster ``c`` in the replication, the target also holds copies of ``c``'s
messages, and two kinds of evidence read them wrongly:

* ``position-property``: each cluster's replicator stamps its *own* ``ledger:entry``
  and does not send on what it received, so the target's copy of a ``c`` message
  carries ``c``'s position, in ``c``'s ledger ids, never a position on the source. Read
  as a source position it names some other message (or none): acking by it loses.
* ``snapshot``: an anchor bounds what the source itself sent to the target before the
  snapshot; ``c``'s messages reach the target on their own, so a copy of one before the
  anchor's target position may be one the source has not acked.

``identity`` pairs the target's copy with the source's copy of the same message (both
carry ``c``'s identity), whatever its origin: it holds on any topology.

A topic's clusters are what the source's and the target's replication policies say
(their union); a cluster that replicates into the target without being named in either
is not seen here.

Pure: no Pulsar, no Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from cursorsync.core.anchors import Anchors
from cursorsync.core.segments import EVIDENCE, Runs, SegmentSet, TopicMapping, evidence_code

#: Evidence that holds whatever clusters a topic is replicated among.
ANY_TOPOLOGY: tuple[str, ...] = ("identity",)


@dataclass(frozen=True)
class Topology:
    """The clusters one topic (all its partitions) is replicated among."""

    topic: str
    source: str
    target: str
    clusters: frozenset[str]

    @property
    def others(self) -> tuple[str, ...]:
        """Clusters beyond the source and the target, sorted."""
        return tuple(sorted(self.clusters - {self.source, self.target}))

    @property
    def two_clusters(self) -> bool:
        return not self.others

    def refused(self, strategies: Iterable[str]) -> list[str]:
        """One line per configured strategy this topology refuses (none on two clusters)."""
        if self.two_clusters:
            return []
        named = ", ".join(sorted(self.clusters | {self.source, self.target}))
        third = ", ".join(self.others)
        why = {
            "position-property": (
                f"{self.target}'s copies of {third}'s messages carry {third}'s own "
                f"ledger:entry as the stamp, not a position on {self.source}"),
            "snapshot": (
                f"{third}'s messages reach {self.target} on their own, so an anchor does not "
                f"bound which of them {self.source} has acked"),
        }
        return [f"topic {self.topic} is replicated among {named}: evidence {s} does not hold "
                f"there ({why[s]}); use evidence.strategies: [identity]"
                for s in strategies if s in why]


def refusals(topologies: Iterable[Topology], strategies: Sequence[str]) -> list[str]:
    """Every refusal of every topology, in order."""
    return [line for t in topologies for line in t.refused(strategies)]


#: The bit-set of evidence kinds that hold on any topology.
_ANY_MASK = 0
for _kind in EVIDENCE:
    if _kind in ANY_TOPOLOGY:
        _ANY_MASK |= 1 << evidence_code(_kind)


def holding(mapping: TopicMapping) -> TopicMapping:
    """The part of ``mapping`` that holds on any topology: segments of such evidence only
    (a segment any of whose entries came from other evidence goes whole), and no anchors
    or the copies only anchors ack. Markers and foreign runs stay."""
    seg = mapping.segments
    keep = (seg.evidence_codes.astype(np.int64) & ~_ANY_MASK) == 0
    if keep.all() and not len(mapping.anchors) and not len(mapping.unpaired):
        return mapping
    segments = seg if keep.all() else SegmentSet(seg.rows[keep], seg.evidence_codes[keep],
                                                 validate=False)
    return replace(mapping, segments=segments, anchors=Anchors(), unpaired=Runs())


__all__ = ["ANY_TOPOLOGY", "Topology", "holding", "refusals"]
