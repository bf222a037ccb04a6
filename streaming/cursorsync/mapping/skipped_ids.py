"""What the mapping builder asks of a hole check (:mod:`cursorsync.mapping.hole_check`,
:mod:`cursorsync.mapping.probe_check`), and which skipped target ids it asks about beyond
the gaps between returned entries."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.columns import SideRows
from cursorsync.mapping.pairs import Pairs

#: Ids probed past a ledger's last returned entry at a time (markers written after the
#: ledger's last message, before it rolled: a few per replicated subscription); a probe
#: that finds only markers goes on with the next ones in a later batch.
LEDGER_END_PROBE = 32

#: Candidate hole runs per topic partition in; the runs that are markers out (a subset).
#: Ids that do not exist (past a ledger's end) are not markers.
HoleCheck = Callable[[Mapping[PartitionKey, Runs]], dict[PartitionKey, Runs]]


@runtime_checkable
class FollowsReads(Protocol):
    """A hole check that follows the target reads (``evidence.holes: probe``): it decides
    every candidate it is given (no per-batch budget) and hears after each batch how far
    each partition was read, every skipped id up to there decided."""

    def read_to(self, positions: Mapping[PartitionKey, Position]) -> None: ...


@runtime_checkable
class Defers(Protocol):
    """A hole check that may leave all of a partition's candidates undecided for now (its
    probe has not got past them yet, and will: the reader returned an entry after each).
    They wait in the partition's state and are asked first in the next batch; nothing
    is claimed for them meanwhile."""

    def drain_deferred(self) -> set[PartitionKey]: ...


@runtime_checkable
class MapsChunks(Protocol):
    """A hole check that also reads, from each skipped chunk's source-position stamp, the
    source entry holding the same chunk (``position-property`` evidence, as a stamped
    message's): its pairs, found since the last call, are drained after each check."""

    def drain_chunks(self) -> dict[PartitionKey, Pairs]: ...


@runtime_checkable
class KnowsLedgers(Protocol):
    """A hole check that lists a target partition's ledgers: one lying wholly between two
    ledgers a reader returned entries from was read through, every id in it skipped (a
    ledger of markers, or of a large chunked message's chunks). Ledger ids are shared by
    every topic of the cluster, so which ids between are this partition's must be asked."""

    def ledgers_between(self, key: PartitionKey, after: int, before: int) -> list[int]: ...

    def learn_ledgers(self, wanted: Mapping[PartitionKey, int]) -> None:
        """Read, concurrently, the ledger lists of the partitions whose list does not name
        the ledger ``wanted`` gives them yet (a batch's in one go, not one after another)."""


def ledger_changes(ledgers: npt.NDArray[np.int64], previous: Position | None
                   ) -> list[tuple[int, int]]:
    """(ledger left, ledger entered) for each place a reader's returned positions move to a
    later ledger (``previous``: the last one returned before them)."""
    ids = np.asarray(ledgers, np.int64)
    if previous is not None:
        ids = np.concatenate(([previous.ledger], ids))
    moved = np.flatnonzero(ids[1:] > ids[:-1])
    return [(int(ids[i]), int(ids[i + 1])) for i in moved]


def ledgers_entered(readers: Iterable[tuple[PartitionKey, npt.NDArray[np.int64],
                                            Position | None]]) -> dict[PartitionKey, int]:
    """For each partition whose reader moved past ledger ids between two it returned
    entries from (its key, its returned ledgers, the last position before them), the last
    ledger it entered so: the ledger list that answers :meth:`KnowsLedgers.ledgers_between`
    for it names that ledger."""
    out = {}
    for key, ledgers, previous in readers:
        for left, entered in ledger_changes(ledgers, previous):
            if entered > left + 1:
                out[key] = entered
    return out


def source_chunk_spans(source: SideRows) -> tuple[Pairs | None, Runs]:
    """A source reader's chunked messages that are copies of the target's (their stamp,
    the last chunk's, names the target's last chunk: on two clusters a stamped source entry
    came from the target): each last chunk paired with its original, and the ids before it
    in its span (same ledger only) as runs whose stamps a check on the source reads."""
    ends = np.flatnonzero(source.chunked & source.stamped)
    if not len(ends):
        return None, Runs()
    at = pa.array(ends)
    firsts = source.rows.column("first_chunk").take(at).to_pylist()
    stamps = source.rows.column("source_position").take(at).to_pylist()
    pairs: list[tuple[int, int, int, int]] = []
    runs: list[tuple[int, int, int]] = []
    for i, first, stamp in zip(ends.tolist(), firsts, stamps, strict=True):
        try:
            original, begun = Position.parse(stamp), Position.parse(first)
        except ValueError:
            continue  # a stamp in no known spelling says nothing
        last = Position(int(source.ledger[i]), int(source.entry[i]))
        if original.entry >= 0:
            pairs.append((last.ledger, last.entry, original.ledger, original.entry))
        if begun.ledger == last.ledger and begun.entry < last.entry:
            runs.append((begun.ledger, begun.entry, last.entry - begun.entry))
    found = None
    if pairs:
        a = np.array(pairs, np.int64)
        found = Pairs.of(a[:, 0], a[:, 1], a[:, 2], a[:, 3], "position-property")
    return found, Runs(np.array(runs, np.int64).reshape(-1, 3))


def read_before_first(target: SideRows) -> tuple[npt.NDArray[np.int64], tuple[int, int] | None]:
    """At the start of a partition's stream, the ids before its first returned entry that
    the reader is known to have read, as hole runs: those from the earliest first chunk of
    a chunked message it returned (it assembled that message from there on). Where that
    chunk lies in an earlier ledger, the rest of that ledger is probed like a ledger's end:
    the probe's start is returned too (None: no probe)."""
    none = np.empty((0, 3), np.int64)
    if not target.chunked.any():
        return none, None
    firsts = [Position.parse(f) for f in target.rows.column("first_chunk").to_pylist()
              if f is not None]
    first = min(firsts, default=None)
    returned = Position(int(target.ledger[0]), int(target.entry[0]))
    if first is None or first >= returned:
        return none, None
    if first.ledger == returned.ledger:
        return np.array([(first.ledger, first.entry, returned.entry - first.entry)],
                        np.int64), None
    rows = [(first.ledger, first.entry, LEDGER_END_PROBE)]
    if returned.entry > 0:
        rows.append((returned.ledger, 0, returned.entry))
    return np.array(rows, np.int64), (first.ledger, first.entry)


__all__ = ["LEDGER_END_PROBE", "Defers", "FollowsReads", "HoleCheck", "KnowsLedgers",
           "MapsChunks", "ledger_changes", "ledgers_entered", "read_before_first",
           "source_chunk_spans"]
