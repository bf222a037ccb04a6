"""What of a mapping the sync still needs: nothing about entries in ledgers the brokers have
deleted.

A mapping only grows: every ledger a partition ever wrote leaves its segments, and Pulsar's
replicated subscriptions write markers (runs) and snapshots (anchors) a few times a second
while messages flow. A broker deletes a ledger once every cursor of the topic is past it,
so a target entry in a deleted ledger is acked on the target for good and has no entry to
ack: the target-side runs and the anchors that name only such entries are dead, and so are
the source-side runs in the source's deleted ledgers. What dead markers say about the
source stays: the source entries between two segments that meet inside a dead ledger with
only known markers between them were not replicated as data
(:func:`cursorsync.core.translate.marker_bridged`), and become source-side runs. A segment
is dead once both its ledgers are deleted: while its target ledger lives its copies may
need their acks, and while its source ledger lives it says the source's acks there wait
for nothing.

A plan for any cursor of the partition acks the same with or without the dead part
(tests/unit/core/test_retention.py checks it against the whole mapping). The count of source
acks that wait for evidence can only fall: one whose copy can only have been in a deleted
target ledger waits for nothing.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np

from cursorsync.core.anchors import Anchors
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.packed import PackedMappings
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs, SegmentSet, TopicMapping
from cursorsync.core.translate import marker_bridged


def live_part(mapping: TopicMapping, source_first: int | None,
              target_first: int | None) -> TopicMapping | None:
    """``mapping`` without what names only ledgers before each side's first live ledger
    (:func:`first_ledger`), or None when there is nothing to drop. An unknown first ledger
    (None) drops nothing on its side."""
    changes: dict[str, object] = {}
    rows = mapping.segments.rows
    if (target_first is not None and source_first is not None and len(rows)
            and rows[:, 0].min() < source_first and rows[:, 2].min() < target_first):
        keep = (rows[:, 0] >= source_first) | (rows[:, 2] >= target_first)
        if not keep.all():
            changes["segments"] = SegmentSet(rows[keep], mapping.segments.evidence_codes[keep],
                                             validate=False)
    unreplicated = mapping.unreplicated
    if target_first is not None:
        skips = mapping.skippable.rows
        if len(skips) and skips[:, 0].min() < target_first:
            # What the dead runs say about the source stays: gaps inside dead target
            # ledgers bridged by markers only (their source entries were not replicated).
            bridged = marker_bridged(mapping, target_first)
            if bridged:
                unreplicated = unreplicated.union(_runs_within(bridged))
                changes["unreplicated"] = unreplicated
        for kind in ("skippable", "foreign", "unpaired"):
            runs = _live_runs(getattr(mapping, kind), target_first)
            if runs is not None:
                changes[kind] = runs
        anchors = mapping.anchors.rows
        if len(anchors) and anchors[:, 2].min() < target_first:
            changes["anchors"] = Anchors.canonical(anchors[anchors[:, 2] >= target_first])
    if source_first is not None:
        runs = _live_runs(unreplicated, source_first)
        if runs is not None:
            changes["unreplicated"] = runs
    return replace(mapping, **changes) if changes else None  # type: ignore[arg-type]


def first_ledger(ledgers: Ledgers | None) -> int | None:
    """The first ledger a topic's ledger list names (None: no list, or an empty one)."""
    return None if ledgers is None or not len(ledgers.ids) else int(ledgers.ids[0])


class LiveLedgers:
    """The first live ledgers of each partition whose mapping the sync trimmed, for the
    mapping builder to trim its own known mappings with (the builder reads no ledger lists).
    The builder's mappings are made of the rows the sync reads, so a partition the sync
    found nothing dead in is not handed over: the builder unpacks no mapping for nothing.
    Thread safe: the two queries' batches run on threads of their own."""

    def __init__(self) -> None:
        self._firsts: dict[PartitionKey, tuple[int | None, int | None]] = {}
        self._lock = threading.Lock()

    def saw(self, key: PartitionKey, source_first: int | None,
            target_first: int | None) -> None:
        with self._lock:
            self._firsts[key] = (source_first, target_first)

    def take(self) -> dict[PartitionKey, tuple[int | None, int | None]]:
        """What was seen since the last take (source first, target first per partition)."""
        with self._lock:
            found, self._firsts = self._firsts, {}
        return found

    def trim(self, mappings: PackedMappings) -> dict[PartitionKey, tuple[int | None, int | None]]:
        """Keep the live part of each mapping seen since the last take; returns what was
        taken, for the ``mappings`` table's ``live`` rows."""
        taken = self.take()
        for key, firsts in taken.items():
            mapping = mappings.get(key)
            live = None if mapping is None else live_part(mapping, *firsts)
            if live is not None:
                mappings.put(key, live)
        return taken


def _live_runs(runs: Runs, first: int) -> Runs | None:
    rows = runs.rows
    if not len(rows) or rows[:, 0].min() >= first:
        return None
    return Runs(rows[rows[:, 0] >= first])


def _runs_within(ranges: RangeSet) -> Runs:
    """The entries of ``ranges`` that runs can name without a ledger list: all of a range
    inside one ledger, and of one that crosses ledger ends, its part in its last ledger
    (how many entries the ledgers before hold is not known here)."""
    b = ranges.bounds
    one = b[:, 0] == b[:, 2]
    first = np.where(one, b[:, 1] + 1, 0)
    rows = np.stack([b[:, 2], first, b[:, 3] + 1 - first], axis=1)
    return Runs(rows[rows[:, 2] > 0])
