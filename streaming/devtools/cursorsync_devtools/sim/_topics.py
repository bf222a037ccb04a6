"""Simulated managed ledgers: append-only entry logs that roll over to sparse ledger ids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cursorsync.core.keys import I64
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position

#: Entry kinds.
KIND_DATA = 0  #: messages from the topic's producers (on B: replicated from A)
KIND_MARKER = 1  #: a replicated-subscription marker: never dispatched to consumers
KIND_FOREIGN = 2  #: B only: produced directly on B, not from A

#: Marker types (PulsarMarkers.proto).
SNAPSHOT_REQUEST = 10
SNAPSHOT_RESPONSE = 11
SNAPSHOT = 12
UPDATE = 13

#: Why a source entry is (or is not) replicated to B.
REPLICATED = 0
UNREPLICATED_INBOUND = 1  #: already replicated from elsewhere
UNREPLICATED_EXCLUDED = 2  #: replicate_to excludes B
UNREPLICATED_EXPIRED = 3  #: TTL expired on the replicator cursor
UNREPLICATED_LOCAL = 4  #: a marker restricted to its own cluster (SNAPSHOT)
REASONS = ("replicated", "inbound", "excluded", "expired", "local-marker")


@dataclass(frozen=True)
class TopicLog:
    """One topic partition's entries in write order (so positions and write times ascend).

    ``peer`` links a source entry to its target copy and a target entry to its
    source (-1: none). ``msg_start``/``msg_count`` index the message arrays
    (source) or only count messages (target foreign entries; -1 start).
    """

    name: str
    first_ledger: int
    ledger: I64
    entry: I64
    write_ms: I64
    kind: npt.NDArray[np.int8]
    marker_type: npt.NDArray[np.int8]
    reason: npt.NDArray[np.int8]
    msg_start: I64
    msg_count: I64
    peer: I64

    def __len__(self) -> int:
        return len(self.ledger)

    def written_by(self, at_ms: float) -> int:
        """How many entries exist at ``at_ms`` (they are a prefix of the log)."""
        return int(np.searchsorted(self.write_ms, at_ms, side="right"))

    def ledgers_at(self, at_ms: float) -> Ledgers:
        """internalStats ``ledgers`` at ``at_ms``: every ledger with its entry count so far."""
        n = self.written_by(at_ms)
        if n == 0:
            return Ledgers.of([(self.first_ledger, 0)])
        ids, counts = np.unique(self.ledger[:n], return_counts=True)
        return Ledgers(ids.astype(np.int64), counts.astype(np.int64))

    def position(self, i: int) -> Position:
        return Position(int(self.ledger[i]), int(self.entry[i]))

    def fresh_position(self) -> Position:
        """A new subscription's markDeletePosition: before the first entry of the first ledger."""
        return Position(self.first_ledger, -1)


class TopicBuilder:
    """Appends entries, rolling the ledger over at sizes drawn per ledger."""

    def __init__(self, name: str, rng: np.random.Generator, first_ledger: int,
                 sizes: tuple[int, int], gaps: tuple[int, int]) -> None:
        self.name = name
        self._rng = rng
        self._sizes = sizes
        self._gaps = gaps
        self.first_ledger = first_ledger
        self._ledger = first_ledger
        self._next_entry = 0
        self._limit = self._draw_size()
        self.ledger: list[int] = []
        self.entry: list[int] = []
        self.write_ms: list[int] = []
        self.kind: list[int] = []
        self.marker_type: list[int] = []
        self.reason: list[int] = []
        self.msg_count: list[int] = []
        self.peer: list[int] = []

    def _draw_size(self) -> int:
        return int(self._rng.integers(self._sizes[0], self._sizes[1] + 1))

    def append(self, at_ms: int, kind: int, *, msgs: int = 0, marker_type: int = 0,
               reason: int = REPLICATED, peer: int = -1) -> int:
        if self._next_entry >= self._limit:
            self._ledger += int(self._rng.integers(self._gaps[0], self._gaps[1] + 1))
            self._next_entry = 0
            self._limit = self._draw_size()
        self.ledger.append(self._ledger)
        self.entry.append(self._next_entry)
        self._next_entry += 1
        self.write_ms.append(at_ms)
        self.kind.append(kind)
        self.marker_type.append(marker_type)
        self.reason.append(reason)
        self.msg_count.append(msgs)
        self.peer.append(peer)
        return len(self.ledger) - 1

    def __len__(self) -> int:
        return len(self.ledger)

    def build(self, msg_start: list[int] | None = None) -> TopicLog:
        n = len(self.ledger)
        start = np.full(n, -1, np.int64) if msg_start is None else np.array(msg_start, np.int64)
        log = TopicLog(
            self.name, self.first_ledger,
            np.array(self.ledger, np.int64), np.array(self.entry, np.int64),
            np.array(self.write_ms, np.int64), np.array(self.kind, np.int8),
            np.array(self.marker_type, np.int8), np.array(self.reason, np.int8),
            start.reshape(n), np.array(self.msg_count, np.int64), np.array(self.peer, np.int64),
        )
        for a in (log.ledger, log.entry, log.write_ms, log.kind, log.marker_type, log.reason,
                  log.msg_start, log.msg_count, log.peer):
            a.setflags(write=False)
        return log
