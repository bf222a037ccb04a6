"""Entries a source cursor covers only because their ledgers are gone, against a per-entry
oracle."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.continuity import count_vanished, vanished_unacked
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet


def _acked(state: CursorState, p: Position) -> bool:
    return p <= state.mark_delete or state.individually_deleted.contains(p)


@st.composite
def observations(draw: st.DrawFn) -> tuple[CursorState, CursorState]:
    ids = sorted(draw(st.sets(st.integers(1, 30), min_size=1, max_size=5)))
    counts = [draw(st.integers(0, 6)) for _ in ids]
    entries = [Position(i, e) for i, n in zip(ids, counts, strict=True) for e in range(n)]

    def cursor(ledgers: Ledgers, pool: list[Position]) -> CursorState:
        md = draw(st.sampled_from(pool)) if pool and draw(st.booleans()) else Position(
            int(ledgers.ids[0]) if len(ledgers.ids) else 1, -1)
        picked = sorted(draw(st.sets(st.sampled_from(pool), max_size=6))) if pool else []
        idm = RangeSet.entries([p.ledger for p in picked], [p.entry for p in picked],
                               [1] * len(picked)) if picked else RangeSet()
        return CursorState(md, idm, ledgers)

    previous = cursor(Ledgers.of(zip(ids, counts, strict=True)), entries)
    # Later: some ledgers gone (trimmed, or all of them with the topic), some new ones.
    kept = [(i, n) for i, n in zip(ids, counts, strict=True) if draw(st.booleans())]
    new = [(i, draw(st.integers(0, 6))) for i in sorted(draw(st.sets(st.integers(31, 40),
                                                                      max_size=2)))]
    later = Ledgers.of(kept + new)
    pool = [Position(i, e) for i, n in kept + new for e in range(n)] + entries
    return previous, cursor(later, pool)


@given(observations())
def test_vanished_unacked_against_each_entry(pair: tuple[CursorState, CursorState]) -> None:
    previous, current = pair
    assert previous.ledgers is not None and current.ledgers is not None
    listed = set(current.ledgers.ids.tolist())
    expected = {
        Position(i, e)
        for i, n in zip(previous.ledgers.ids.tolist(), previous.ledgers.entries.tolist(),
                        strict=True)
        if i not in listed for e in range(n)
        if not _acked(previous, Position(i, e)) and _acked(current, Position(i, e))}
    found = vanished_unacked(previous, current)
    within_snapshot = {
        p for i, n in zip(previous.ledgers.ids.tolist(), previous.ledgers.entries.tolist(),
                          strict=True)
        for e in range(n) if found.contains(p := Position(i, e))}
    assert within_snapshot == expected
    assert count_vanished(previous, found) == len(expected)
    # Nothing in a ledger the later list still has, nor in one the earlier did not list.
    for lo_l, _, hi_l, _ in found.bounds.tolist():
        assert lo_l not in listed
        assert lo_l in previous.ledgers.ids or hi_l in previous.ledgers.ids


def test_the_open_ledger_counts_whole() -> None:
    """Entries past the earlier snapshot of its open ledger went with it too."""
    previous = CursorState.parse("5:3", "[]", Ledgers.of([(5, 10), (7, 4)]))
    current = CursorState.parse("20:-1", "[]", Ledgers.of([(20, 0)]))
    gone = vanished_unacked(previous, current)
    assert gone.contains(Position(7, 1000))
    assert count_vanished(previous, gone) == 6 + 4


def test_trimmed_ledgers_with_everything_acked_vanish_nothing() -> None:
    previous = CursorState.parse("5:9", "[]", Ledgers.of([(5, 10), (7, 4)]))
    current = CursorState.parse("7:1", "[]", Ledgers.of([(7, 6)]))
    assert not vanished_unacked(previous, current)
    unknown = CursorState(Position(7, 1))
    assert not vanished_unacked(previous, unknown)
