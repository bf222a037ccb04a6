"""Sets reaching the top keyed ledger slot and the last keyed entry."""

from __future__ import annotations

import itertools

import numpy as np

from cursorsync.core.keys import LEDGER_SPAN, MAX_KEYED_ENTRY
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet

BASE = 5
TOP = BASE + LEDGER_SPAN
M = MAX_KEYED_ENTRY
POINTS = [Position(BASE, 0), Position(BASE, 1), Position(TOP - 1, M), Position(TOP, 0),
          Position(TOP, M - 1), Position(TOP, M), Position(TOP, M + 1), Position(TOP + 1, 0)]


def one(p: Position) -> RangeSet:
    return RangeSet.entries(np.array([p.ledger]), np.array([p.entry]), np.array([1]))


def test_sets_at_the_top_slot_agree_with_sets_of_points() -> None:
    sets = {}
    for r in range(1, 4):
        for combo in itertools.combinations(POINTS, r):
            s = RangeSet()
            for p in combo:
                s = s | one(p)
            sets[combo] = s
    for (ca, a), (cb, b) in itertools.product(list(sets.items())[:40], list(sets.items())[-40:]):
        for op, expect in ((a | b, set(ca) | set(cb)), (a & b, set(ca) & set(cb)),
                           (a - b, set(ca) - set(cb)), (b - a, set(cb) - set(ca))):
            assert {p for p in POINTS if p in op} == expect, (ca, cb, op)


def test_canonical_at_the_top_slot_keeps_the_entries() -> None:
    """Ledger-aware canonical form over ledgers BASE (2 entries) and TOP (M + 1 entries):
    the same entries, whatever the set's base."""
    from cursorsync.core.ledgers import Ledgers

    ledgers = Ledgers.of([(BASE, 2), (TOP, M + 1)])
    entries = [p for p in POINTS if p.ledger in (BASE, TOP) and p.entry <= M]
    for r in range(1, 4):
        for combo in itertools.combinations(entries, r):
            s = RangeSet()
            for p in combo:
                s = s | one(p)
            c = s.canonical(ledgers)
            assert {p for p in entries if p in c} == set(combo), (combo, s, c)
            assert c.count_entries(ledgers) == len(combo), (combo, s, c)
    wider = RangeSet.parse(f"[({BASE}:-1..{TOP}:{M}]]").canonical(ledgers)
    assert {p for p in entries if p in wider} == set(entries)
