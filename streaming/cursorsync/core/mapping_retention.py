"""What of a mapping the sync still needs: nothing about entries in ledgers the brokers have
deleted.

A mapping only grows: every ledger a partition ever wrote leaves its segments, and Pulsar's
replicated subscriptions write markers (runs) and snapshots (anchors) a few times a second
while messages flow. A broker deletes a ledger once every cursor of the topic is past it,
so a target entry in a deleted ledger is acked on the target for good and has no entry to
ack: the target-side runs and the anchors that name only such entries are dead, and so are
the source-side runs in the source's deleted ledgers. A segment is dead once both its
ledgers are deleted: while its target ledger lives its copies may need their acks, and
while its source ledger lives it says the source's acks there wait for nothing.

A plan for any cursor of the partition acks the same with or without the dead part
(tests/test_mapping_retention.py checks it against the whole mapping). The count of source
acks that wait for evidence can only fall: one whose copy can only have been in a deleted
target ledger waits for nothing.
"""

from __future__ import annotations

from dataclasses import replace

from cursorsync.core.anchors import Anchors
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.mapping import Runs, SegmentSet, TopicMapping


def live_part(mapping: TopicMapping, source_ledgers: Ledgers | None,
              target_ledgers: Ledgers | None) -> TopicMapping | None:
    """``mapping`` without what names only deleted ledgers (those before the first of each
    side's ledger list), or None when there is nothing to drop. An unknown or empty ledger
    list drops nothing on its side."""
    target_first = _first(target_ledgers)
    source_first = _first(source_ledgers)
    changes: dict[str, object] = {}
    rows = mapping.segments.rows
    if (target_first is not None and source_first is not None and len(rows)
            and rows[:, 0].min() < source_first and rows[:, 2].min() < target_first):
        keep = (rows[:, 0] >= source_first) | (rows[:, 2] >= target_first)
        if not keep.all():
            changes["segments"] = SegmentSet(rows[keep], mapping.segments.evidence_codes[keep],
                                             validate=False)
    if target_first is not None:
        for kind in ("skippable", "foreign", "unpaired"):
            runs = _live_runs(getattr(mapping, kind), target_first)
            if runs is not None:
                changes[kind] = runs
        anchors = mapping.anchors.rows
        if len(anchors) and anchors[:, 2].min() < target_first:
            changes["anchors"] = Anchors.canonical(anchors[anchors[:, 2] >= target_first])
    if source_first is not None:
        runs = _live_runs(mapping.unreplicated, source_first)
        if runs is not None:
            changes["unreplicated"] = runs
    return replace(mapping, **changes) if changes else None  # type: ignore[arg-type]


def _first(ledgers: Ledgers | None) -> int | None:
    return None if ledgers is None or not len(ledgers.ids) else int(ledgers.ids[0])


def _live_runs(runs: Runs, first: int) -> Runs | None:
    rows = runs.rows
    if not len(rows) or rows[:, 0].min() >= first:
        return None
    return Runs(rows[rows[:, 0] >= first])
