"""Splitting skipped ids by a probe cursor, against a per-id oracle."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.filtered import split_filtered
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs

LEDGERS = [3, 5, 9]


def acked_set(ids: set[Position]) -> RangeSet:
    if not ids:
        return RangeSet()
    ordered = sorted(ids)
    return RangeSet.entries(np.array([p.ledger for p in ordered], np.int64),
                            np.array([p.entry for p in ordered], np.int64),
                            np.ones(len(ordered), np.int64))


def oracle(runs: list[tuple[int, int, int]], acked: set[Position], own: Position,
           sizes: dict[int, int]) -> tuple[list[tuple[int, int, int]],
                                           list[tuple[int, int, int]], int]:
    """One id at a time: claim while filtered; then the rest is absent or left."""
    taken, left, absent = [], [], 0
    for lg, first, count in runs:
        k = 0
        while k < count:
            p = Position(lg, first + k)
            stored = lg in sizes and p.entry < sizes[lg]
            if not (p in acked and p > own and stored):
                break
            k += 1
        if k:
            taken.append((lg, first, k))
        if k < count:
            if lg in sizes and first + k >= sizes[lg]:
                absent += count - k
            else:
                left.append((lg, first + k, count - k))
    return taken, left, absent


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], set[Position], Position,
                                     dict[int, int]]:
    sizes = {lg: draw(st.integers(0, 12)) for lg in LEDGERS if draw(st.booleans())}
    runs = []
    for lg in sorted(set(draw(st.lists(st.sampled_from(LEDGERS), max_size=3)))):
        at = 0
        for _ in range(draw(st.integers(1, 3))):
            at += draw(st.integers(0, 4))
            count = draw(st.integers(1, 5))
            runs.append((lg, at, count))
            at += count + 1
    ids = [Position(lg, e) for lg in LEDGERS for e in range(25)]
    acked = set(draw(st.lists(st.sampled_from(ids), max_size=40)))
    own = draw(st.sampled_from([Position(2, 0), Position(5, -1), *ids]))
    return runs, acked, own, sizes


@given(worlds())
def test_the_split_is_the_per_id_oracles(world: tuple) -> None:
    runs, acked, own, sizes = world
    split = split_filtered(Runs.of(*runs), acked_set(acked), own, sizes)
    taken, left, absent = oracle(runs, acked, own, sizes)
    assert split.filtered.rows.tolist() == [list(r) for r in taken]
    assert split.left.rows.tolist() == [list(r) for r in left]
    assert split.absent == absent


def test_a_worked_partition() -> None:
    """Ledger 5 holds 10 entries, the probe acked nothing itself past 5:2: 5:3 and 5:4 are
    markers, 5:5 a chunk, 5:8 a marker, 5:9 a marker at the ledger's end, 5:10 past it."""
    acked = acked_set({Position(5, e) for e in (0, 1, 2, 3, 4, 8, 9)})
    split = split_filtered(Runs.of((5, 1, 2), (5, 3, 4), (5, 8, 4)), acked, Position(5, 2),
                           {5: 10})
    # 5:1 and 5:2 are the probe's own acks: left for the per-id check, never claimed.
    assert split.filtered.rows.tolist() == [[5, 3, 2], [5, 8, 2]]
    assert split.left.rows.tolist() == [[5, 1, 2], [5, 5, 2]]
    assert split.absent == 2


def test_nothing_is_claimed_in_a_ledger_the_cursor_read_did_not_list() -> None:
    acked = acked_set({Position(7, e) for e in range(5)})
    split = split_filtered(Runs.of((7, 0, 5)), acked, Position(6, 0), {5: 10})
    assert split.filtered.rows.tolist() == [] and split.left.rows.tolist() == [[7, 0, 5]]


def test_no_candidates() -> None:
    split = split_filtered(Runs(), RangeSet(), Position(1, 1), {})
    assert len(split.filtered) == len(split.left) == split.absent == 0
