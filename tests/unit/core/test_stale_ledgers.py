"""A ledger list is a snapshot: the open (last) ledger grows after it, and ledgers may come
after it. Neither the fold nor the guard may treat what the snapshot does not show as
absent: an entry they cannot see may exist and be unacked.

Checked per entry against the true ledgers, with stale, partial and missing lists."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.cursor import AckPlan, CursorState, fold
from cursorsync.core.guard import check_safe
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import TopicMapping


def test_fold_does_not_clamp_inside_the_open_ledger() -> None:
    """Ledger 7 had 6 entries when listed; 7:6 and 7:7 may exist now, unacked."""
    acked = RangeSet.parse("[(7:7..8:3]]") | RangeSet.up_to(Position(7, 5))
    md, rest = fold(Position(7, 5), acked, Ledgers.of([(7, 6)]))
    assert md == Position(7, 5)
    assert rest == RangeSet.parse("[(7:7..8:3]]")


def test_fold_still_joins_ranges_across_a_closed_ledger_end() -> None:
    acked = RangeSet.parse("[(8:-1..8:3]]") | RangeSet.up_to(Position(7, 5))
    md, rest = fold(Position(7, 5), acked, Ledgers.of([(7, 6), (8, 10)]))
    assert md == Position(8, 3) and not rest


def test_fold_does_not_reach_into_an_empty_open_ledger() -> None:
    """An empty last ledger may have entries now: a range starting inside it stays apart."""
    acked = RangeSet.parse("[(9:2..12:0]]") | RangeSet.up_to(Position(7, 5))
    md, _ = fold(Position(7, 5), acked, Ledgers.of([(7, 6), (9, 0)]))
    assert md == Position(7, 5)


def _plan(md: Position, previous: Position) -> AckPlan:
    return AckPlan(md, RangeSet(), RangeSet(), previous, 0, 0, 0, 0, "exact")


def test_the_guard_refuses_a_cumulative_ack_over_entries_the_list_does_not_show() -> None:
    target = CursorState(Position(7, 5), RangeSet.parse("[(7:7..8:3]]"), Ledgers.of([(7, 6)]))
    bad = check_safe(_plan(Position(8, 3), target.mark_delete),
                     CursorState(Position(-1, -1)), TopicMapping(), target)
    assert bad, "7:6 may exist and is not acked"


def test_the_guard_lets_a_cumulative_ack_over_closed_ledger_ends_through() -> None:
    target = CursorState(Position(7, 5), RangeSet.parse("[(8:-1..8:3]]"),
                         Ledgers.of([(7, 6), (8, 10)]))
    bad = check_safe(_plan(Position(8, 3), target.mark_delete),
                     CursorState(Position(-1, -1)), TopicMapping(), target)
    assert not bad


# ----------------------------------------------------------------- property


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[int, int]], Ledgers | None,
                                        set[Position], Position]:
    """(true ledgers, a stale/partial/missing view of them, acked entries, a markDelete)."""
    n = draw(st.integers(1, 4))
    ids = sorted(draw(st.lists(st.integers(1, 30), min_size=n, max_size=n, unique=True)))
    counts = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    true = list(zip(ids, counts, strict=True))
    view = draw(st.sampled_from(["exact", "stale", "partial", "missing"]))
    seen: Ledgers | None
    if view == "missing":
        seen = None
    else:
        keep = n if view != "partial" else draw(st.integers(1, n))
        shown = list(true[:keep])
        if view in ("stale", "partial"):
            last_id, last_n = shown[-1]
            shown[-1] = (last_id, draw(st.integers(0, last_n)))
        seen = Ledgers.of(shown)
    entries = [Position(lg, e) for lg, c in true for e in range(c)]
    acked = {p for p in entries if draw(st.booleans())}
    md_index = draw(st.integers(-1, len(entries) - 1)) if entries else -1
    md = entries[md_index] if md_index >= 0 else Position(ids[0], -1)
    return true, seen, acked, md


def _ranges(acked: set[Position]) -> RangeSet:
    rows = [(p.ledger, p.entry - 1, p.ledger, p.entry) for p in sorted(acked)]
    return RangeSet(np.array(rows, dtype=np.int64).reshape(-1, 4))


def _true_entries(true: list[tuple[int, int]]) -> list[Position]:
    return [Position(lg, e) for lg, c in true for e in range(c)]


@settings(max_examples=400, deadline=None)
@given(histories())
def test_fold_never_passes_an_unacked_entry_whatever_the_list(
        history: tuple[list[tuple[int, int]], Ledgers | None, set[Position], Position]) -> None:
    true, seen, acked, md = history
    new_md, rest = fold(md, _ranges(acked), seen)
    covered = {p for p in _true_entries(true) if p <= md} | acked
    skipped = [p for p in _true_entries(true) if p <= new_md and p not in covered]
    assert not skipped, f"markDelete {new_md} passes unacked {skipped} (list {seen})"
    assert not [p for p in _true_entries(true) if p in rest and p not in covered]


@settings(max_examples=400, deadline=None)
@given(histories(), st.data())
def test_the_guard_refuses_every_cumulative_ack_over_an_unacked_entry(
        history: tuple[list[tuple[int, int]], Ledgers | None, set[Position], Position],
        data: st.DataObject) -> None:
    true, seen, acked, md = history
    entries = _true_entries(true)
    target = CursorState(md, _ranges(acked), seen)
    candidates = [*entries, Position(true[-1][0] + 1, 0), Position(true[-1][0], 50)]
    plan_md = data.draw(st.sampled_from(candidates))
    bad = check_safe(_plan(plan_md, md), CursorState(Position(-1, -1)), TopicMapping(), target)
    unacked = [p for p in entries if md < p <= plan_md and p not in acked]
    if unacked:
        assert bad, f"cumulative ack to {plan_md} passes unacked {unacked} (list {seen})"
