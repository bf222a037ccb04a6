"""What one batch of the mapping builder comes to, per topic partition, and the totals it
counts on the way."""

from __future__ import annotations

from dataclasses import dataclass, field

from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import TopicMapping
from cursorsync.mapping.identity_evidence import IdentityFindings


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
    #: Skipped target ids checked in this batch that were mapped as chunks.
    skipped_mapped: int = 0
    #: Snapshot anchors found on the source, and target entries taken as copies.
    anchors: int = 0
    unpaired: int = 0
    #: Skipped target ids left for later batches' checks (HOLE_CHECKS_PER_BATCH), per
    #: topic partition that has any.
    skipped_waiting: dict[PartitionKey, int] = field(default_factory=dict)
    #: First live (source, target) ledgers the sync found rows before (cursorsync.core.retention).
    live: dict[PartitionKey, tuple[int | None, int | None]] = field(default_factory=dict)
    #: Seconds of the batch's build by part: ``partitions`` (pairs and evidence of each
    #: partition's rows), ``check`` (the skipped ids' check), ``release`` (telling a check
    #: that follows the reads how far they got), ``anchors`` (the source's snapshots).
    seconds: dict[str, float] = field(default_factory=dict)
    #: The builder's thread's CPU seconds in each of those parts.
    cpu_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class BatchTotals:
    """What a batch's evidence came to over its topic partitions, counted as they go."""

    #: Entries in the segments the batch added.
    pairs: int = 0
    #: Partitions whose evidence conflicted (dropped for the batch, never guessed).
    conflicts: int = 0
    #: Target entries given up on as foreign, and source entries given up on.
    given_up_target: int = 0
    given_up_source: int = 0
    #: Target entries taken as copies of source entries (``snapshot``).
    unpaired: int = 0

    def count(self, found: IdentityFindings) -> None:
        self.given_up_target += found.given_up_target
        self.given_up_source += found.given_up_source
        self.unpaired += found.unpaired.entry_count()


__all__ = ["BatchOutcome", "BatchTotals"]
