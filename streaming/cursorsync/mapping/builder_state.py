"""The mapping builder's state per topic partition, kept with each batch under the
checkpoint (a replayed batch starts from the state its first run started from)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cursorsync.core.mapping import Runs
from cursorsync.core.positions import Position


@dataclass
class Pending:
    """Entries waiting for an identity match, oldest first."""

    ledger: list[int] = field(default_factory=list)
    entry: list[int] = field(default_factory=list)
    digest: list[bytes] = field(default_factory=list)

    def extend(self, ledger: np.ndarray, entry: np.ndarray, digest: list[bytes]) -> None:
        self.ledger += ledger.tolist()
        self.entry += entry.tolist()
        self.digest += digest

    def keep(self, mask: np.ndarray) -> None:
        idx = np.flatnonzero(mask).tolist()
        self.ledger = [self.ledger[i] for i in idx]
        self.entry = [self.entry[i] for i in idx]
        self.digest = [self.digest[i] for i in idx]

    def __len__(self) -> int:
        return len(self.ledger)

    def to_json(self) -> dict[str, Any]:
        return {"ledger": self.ledger, "entry": self.entry,
                "digest": [d.hex() for d in self.digest]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pending:
        return cls(d["ledger"], d["entry"], [bytes.fromhex(x) for x in d["digest"]])


@dataclass
class PartitionState:
    last_target: Position | None = None
    target: Pending = field(default_factory=Pending)
    source: Pending = field(default_factory=Pending)
    #: The last source id accounted for (returned by the reader, or a marker past it).
    last_source: Position | None = None
    #: Until when (epoch seconds) the source's tail is looked past for markers.
    watch_until: float = 0.0
    #: Skipped target ids not checked yet (HOLE_CHECKS_PER_BATCH): first in the next batch.
    unchecked: Runs = field(default_factory=Runs)
    #: Starts (ledger, entry) of the candidate runs that probe past a ledger's last returned
    #: entry (:data:`cursorsync.mapping.builder.LEDGER_END_PROBE` ids each): a probe whose
    #: ids are all markers goes on with the next ones.
    probes: set[tuple[int, int]] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {
            "last_target": _text(self.last_target), "last_source": _text(self.last_source),
            "watch_until": self.watch_until,
            "target": self.target.to_json(), "source": self.source.to_json(),
            "unchecked": self.unchecked.rows.tolist(),
            "probes": sorted([lg, e] for lg, e in self.probes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartitionState:
        rows = d.get("unchecked") or []
        return cls(_position(d.get("last_target")),
                   Pending.from_json(d["target"]), Pending.from_json(d["source"]),
                   _position(d.get("last_source")), float(d.get("watch_until", 0.0)),
                   Runs(np.array(rows, np.int64).reshape(-1, 3)),
                   {(int(lg), int(e)) for lg, e in d.get("probes") or []})


def _text(p: Position | None) -> str | None:
    return None if p is None else str(p)


def _position(text: str | None) -> Position | None:
    return None if text is None else Position.parse(text)
