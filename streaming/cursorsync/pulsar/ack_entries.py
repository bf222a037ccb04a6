"""Which target entries a plan's acks name: the entries of its ranges, by the target
topic's ledger list, and the entry a cumulative ack for a markDeletePosition goes to."""

from __future__ import annotations

from collections.abc import Iterator

from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet


def entries_of(ranges: RangeSet, ledgers: Ledgers | None) -> Iterator[Position]:
    """The entries of ``ranges``: exact per ledger list when known, else ranges must not span.

    A range inside one ledger the list does not know (a stale list) is taken
    as it is: its entries come from segments, so they exist. A range spanning
    ledgers yields only the entries of listed ledgers; anything it misses is
    not acked now and is planned again at the next sync (never the unsafe way).
    """
    known = set() if ledgers is None else set(ledgers.ids.tolist())
    for a, b, c, d in ranges.bounds.tolist():
        one = RangeSet.of((Position(a, b), Position(c, d)))
        if a == c and a not in known:
            yield from one.iter_entries(None)
        elif ledgers is None:
            raise ValueError(
                f"range ({a}:{b}..{c}:{d}] spans ledgers: pass ledgers= (the target topic's "
                "ledger list) so that its entries can be enumerated"
            )
        else:
            yield from one.iter_entries(ledgers)


def last_entry(position: Position, ledgers: Ledgers | None) -> Position | None:
    """An existing entry to ack cumulatively for a markDeletePosition (``L:-1`` has none)."""
    if position.entry >= 0:
        return position
    if ledgers is None or not len(ledgers.ids):
        return None
    canon = RangeSet.up_to(position).canonical(ledgers)
    if not canon:
        return None
    last = Position(int(canon.bounds[-1, 2]), int(canon.bounds[-1, 3]))
    return last if last.entry >= 0 else None


__all__ = ["entries_of", "last_entry"]
