"""RangeSet algebra against a set-of-positions model, and ledger-aware folding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core import keys as keys_mod
from cursorsync.core.cursor import fold
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet

P = Position.parse
LEDGERS = [0, 3, 7]
UNIVERSE = [Position(lg, e) for lg in LEDGERS for e in range(-1, 8)]


@st.composite
def rangesets(draw: st.DrawFn) -> RangeSet:
    rows = []
    for _ in range(draw(st.integers(0, 5))):
        a, b = sorted(draw(st.lists(st.sampled_from(UNIVERSE), min_size=2, max_size=2)))
        rows.append((a.ledger, a.entry, b.ledger, b.entry))
    return RangeSet(np.array(rows, dtype=np.int64).reshape(-1, 4))


def members(rs: RangeSet) -> set[Position]:
    return {p for p in UNIVERSE if any(lo < p <= hi for lo, hi in rs)}


@given(rangesets(), rangesets())
def test_algebra_matches_sets(a: RangeSet, b: RangeSet) -> None:
    assert members(a | b) == members(a) | members(b)
    assert members(a & b) == members(a) & members(b)
    assert members(a - b) == members(a) - members(b)
    for r in (a | b, a & b, a - b):
        assert r.is_canonical()
    assert a.union(b) == b | a
    assert a.intersection(b) == b & a


@given(rangesets())
def test_canonical_form_is_unique(a: RangeSet) -> None:
    again = RangeSet(a.bounds.copy())
    assert again == a and hash(again) == hash(a)
    assert RangeSet.parse(str(a)) == a
    assert all((p in a) == (p in members(a)) for p in UNIVERSE)


def test_contains_is_open_closed() -> None:
    r = RangeSet.parse("[(1:5..1:6]]")
    assert P("1:6") in r and P("1:5") not in r
    spanning = RangeSet.parse("[(1:9..2:3]]")
    assert P("1:10") in spanning and P("2:-1") in spanning and P("2:4") not in spanning


def test_touching_ranges_merge_and_values_are_immutable() -> None:
    r = RangeSet.parse("[(1:1..1:3],(1:3..1:5]]")
    assert str(r) == "[(1:1..1:5]]"
    with pytest.raises(ValueError):
        r.bounds[0, 0] = 9


def test_wide_ids_fall_back_to_exact_keys() -> None:
    big = 2**62
    a = RangeSet.of((Position(1, big), Position(1, big + 10)))
    b = RangeSet.of((Position(1, big + 5), Position(2**63 - 1, 2**63 - 2)))
    assert str(a & b) == f"[(1:{big + 5}..1:{big + 10}]]"
    assert Position(1, big + 7) in (a | b)


@settings(max_examples=200)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=4), st.data())
def test_ledger_canonical_form_keeps_entries_and_meets_across_ledgers(
        counts: list[int], data: st.DataObject) -> None:
    ids = [10 * (i + 1) for i in range(len(counts))]
    ledgers = Ledgers.of(zip(ids, counts, strict=True))
    universe = [Position(lg, e) for lg, n in zip(ids, counts, strict=True) for e in range(n)]
    pts = [Position(lg, e) for lg in [5, *ids, ids[-1] - 1] for e in range(-1, 14)]
    rows = []
    for _ in range(data.draw(st.integers(0, 4))):
        a, b = sorted(data.draw(st.lists(st.sampled_from(pts), min_size=2, max_size=2)))
        rows.append((a.ledger, a.entry, b.ledger, b.entry))
    rs = RangeSet(np.array(rows, dtype=np.int64).reshape(-1, 4))
    canon = rs.canonical(ledgers)
    inside = {p for p in universe if p in rs}
    assert {p for p in universe if p in canon} == inside
    assert set(canon.iter_entries(ledgers)) == inside
    assert canon.count_entries(ledgers) == len(inside)
    # A set covering every entry is one range once canonical.
    if universe:
        whole = RangeSet.entries(np.array(ids), np.zeros(len(ids), np.int64), np.array(counts))
        assert len(whole.canonical(ledgers)) == 1


def test_fold_like_the_broker() -> None:
    # Acks of 0,1,2,4,5,8 on a fresh cursor at 3:-1.
    acked = RangeSet.parse("[(3:-1..3:2],(3:3..3:5],(3:7..3:8]]")
    md, rest = fold(P("3:-1"), acked)
    assert md == P("3:2") and str(rest) == "[(3:3..3:5],(3:7..3:8]]"
    # Across a ledger end: ledger 3 ends at entry 9, ledger 5 follows.
    ledgers = Ledgers.of([(3, 10), (5, 4)])
    md, rest = fold(P("3:9"), RangeSet.parse("[(5:-1..5:1]]"), ledgers)
    assert md == P("5:1") and not rest
    # Without the ledger list, the gap between 3:9 and 5:0 is unknown: nothing folds.
    md, rest = fold(P("3:9"), RangeSet.parse("[(5:-1..5:1]]"))
    assert md == P("3:9") and str(rest) == "[(5:-1..5:1]]"


def test_fold_never_jumps_over_an_unacked_first_entry() -> None:
    ledgers = Ledgers.of([(1, 2)])
    md, rest = fold(P("1:-1"), RangeSet.parse("[(1:0..1:1]]"), ledgers)
    assert md == P("1:-1") and str(rest) == "[(1:0..1:1]]"


def test_count_entries_without_ledgers_is_a_lower_bound() -> None:
    r = RangeSet.parse("[(1:5..1:9],(1:20..2:3]]")
    assert r.count_entries() == 4 + 4
    assert r.count_entries(Ledgers.of([(1, 30), (2, 10)])) == 4 + 9 + 4


@given(rangesets(), rangesets().filter(lambda r: len(r) == 1))
def test_single_range_fast_path_matches_sets(a: RangeSet, one: RangeSet) -> None:
    """The O(log n) path used when a cursor-sized set meets one range (markDelete, horizon)."""
    r = one.bounds[0]
    assert members(a._with_one(r, "or")) == members(a) | members(one)
    assert members(a._with_one(r, "and")) == members(a) & members(one)
    assert members(a._with_one(r, "sub")) == members(a) - members(one)
    for op in ("or", "and", "sub"):
        out = a._with_one(r, op)
        assert out.is_canonical()
        assert out == RangeSet(out.bounds.copy())


@given(st.integers(-1, 2**40), st.integers(-1, 2**33), rangesets())
def test_up_to_keys_match_the_general_constructor(ledger: int, entry: int,
                                                  a: RangeSet) -> None:
    """up_to builds its keys from the position directly (it runs several times a plan);
    the set, and what it does with others, is the general constructor's."""
    direct = RangeSet.up_to(Position(ledger, entry))
    general = RangeSet(np.array([[-1, -1, ledger, entry]], dtype=np.int64))
    assert direct == general and np.array_equal(direct.bounds, general.bounds)
    assert direct.is_canonical()
    for op in ("__or__", "__and__", "__sub__"):
        assert getattr(a, op)(direct) == getattr(a, op)(general)


def test_parse_refuses_a_range_that_does_not_end_after_it_starts() -> None:
    assert RangeSet.parse("[(1:5..1:6],(1:8..1:9]]") == RangeSet.of(("1:5", "1:6"), ("1:8", "1:9"))
    for text in ("[(1:5..1:6],(5:3..5:1]]", "[(5:3..5:3]]", "[(6:0..5:9]]"):
        with pytest.raises(ValueError, match="does not end after it starts"):
            RangeSet.parse(text)


# ------------------------------------------- every algebra method, and every key layout


@st.composite
def key_sets(draw: st.DrawFn, max_ranges: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Canonical (lo, hi] intervals of integer keys, sized to cross every size threshold
    (dense and sparse, so that walks meet few or many runs)."""
    span = draw(st.sampled_from([5, 10, 40])) * max_ranges
    n = draw(st.integers(0, max_ranges))
    edges = sorted(draw(st.sets(st.integers(0, span), min_size=2 * n, max_size=2 * n)))
    lo, hi = np.array(edges[0::2], np.int64), np.array(edges[1::2], np.int64)
    if len(lo) > 1 and draw(st.booleans()):  # let some neighbours touch, then merge them
        lo, hi = keys_mod.merge(lo, np.maximum(hi, np.roll(lo, -1) * (np.arange(len(lo)) % 3
                                                                            == 0)))
    return lo, hi


def key_members(lo: np.ndarray, hi: np.ndarray) -> set[int]:
    return {k for a, b in zip(lo.tolist(), hi.tolist(), strict=True) for k in range(a + 1, b + 1)}


def assert_canonical_keys(lo: np.ndarray, hi: np.ndarray) -> None:
    assert (lo < hi).all() and (hi[:-1] < lo[1:]).all()


@settings(max_examples=300)
@given(key_sets(), key_sets())
def test_every_algebra_method_matches_sets(a: tuple[np.ndarray, np.ndarray],
                                           b: tuple[np.ndarray, np.ndarray]) -> None:
    """The walks that _algebra picks by size, each on any sizes, against sets of keys."""
    (alo, ahi), (blo, bhi) = a, b
    sa, sb = key_members(alo, ahi), key_members(blo, bhi)
    results = {
        "sweep or": (keys_mod.combine(alo, ahi, blo, bhi, "or"), sa | sb),
        "sweep and": (keys_mod.combine(alo, ahi, blo, bhi, "and"), sa & sb),
        "sweep sub": (keys_mod.combine(alo, ahi, blo, bhi, "sub"), sa - sb),
        "few or": (keys_mod.sweep_few(alo, ahi, blo, bhi, "or"), sa | sb),
        "few and": (keys_mod.sweep_few(alo, ahi, blo, bhi, "and"), sa & sb),
        "few sub": (keys_mod.sweep_few(alo, ahi, blo, bhi, "sub"), sa - sb),
        "dispatch or": (keys_mod.algebra(alo, ahi, blo, bhi, "or"), sa | sb),
        "dispatch and": (keys_mod.algebra(alo, ahi, blo, bhi, "and"), sa & sb),
        "dispatch sub": (keys_mod.algebra(alo, ahi, blo, bhi, "sub"), sa - sb),
        "walk and": (keys_mod.clip_runs(blo, bhi, alo, ahi)[:2], sa & sb),
        "contained sub": (keys_mod.algebra(*keys_mod.algebra(alo, ahi, blo, bhi, "and"),
                                           blo, bhi, "sub"), set()),
        "containing sub": (keys_mod.algebra(*keys_mod.algebra(alo, ahi, blo, bhi, "or"),
                                            blo, bhi, "sub"), sa - sb),
        "walk complement": (keys_mod.clip_runs(*keys_mod._complement(blo, bhi), alo, ahi)[:2],
                            sa - sb),
    }
    if len(alo):
        results["walk union"] = (keys_mod._union_small(alo, ahi, blo, bhi), sa | sb)
    if len(blo):
        results["walk gaps"] = (keys_mod._subtract_from(alo, ahi, blo, bhi), sa - sb)
    for name, ((lo, hi), want) in results.items():
        assert key_members(lo, hi) == want, name
        assert_canonical_keys(lo, hi)
        for side, operand in ((lo, alo), (hi, ahi), (lo, blo), (hi, bhi)):
            # An empty answer is no view of an operand: it would keep the operand's buffer.
            assert len(side) or side.base is None or all(
                side.base is not x for x in (operand, operand.base)), name


@given(key_sets(), key_sets())
def test_merge_canonicalises_any_intervals(a: tuple[np.ndarray, np.ndarray],
                                           b: tuple[np.ndarray, np.ndarray]) -> None:
    lo = np.concatenate((a[0], b[0], b[1]))
    hi = np.concatenate((a[1], b[1], b[0] + 3))  # some empty, some overlapping, unsorted
    want = key_members(lo, hi)
    got = keys_mod.merge(lo, hi)
    assert key_members(*got) == want
    assert_canonical_keys(*got)


def _relabel(rs: RangeSet, ledger_of: dict[int, int]) -> RangeSet:
    b = rs.bounds.copy()
    for col in (0, 2):
        b[:, col] = [ledger_of[x] for x in b[:, col].tolist()]
    return RangeSet(b)


#: Ledger labels that keep the order: as drawn, across a boundary between key bases, and
#: spread too wide for based keys (the exact key-space fallback). Ledger -1 stays.
LABELS = {
    "plain": {lg: lg for lg in [-1, *LEDGERS]},
    "across bases": {-1: -1, 0: 2**30 - 2, 3: 2**30 - 1, 7: 2**30 + 4},
    "too wide": {-1: -1, 0: 5, 3: 5 + 2**33, 7: 2**40},
}


@settings(max_examples=150)
@given(rangesets(), rangesets(), st.sampled_from(list(LABELS)),
       st.sampled_from(list(UNIVERSE)))
def test_results_do_not_depend_on_the_key_layout(a: RangeSet, b: RangeSet, labels: str,
                                                 md: Position) -> None:
    to = LABELS[labels]
    a, b = RangeSet.up_to(md) | a, b
    ra, rb = _relabel(a, to), _relabel(b, to)
    for got, want in ((ra | rb, a | b), (ra & rb, a & b), (ra - rb, a - b), (rb - ra, b - a)):
        assert got == _relabel(want, to)
        assert got.is_canonical()
    points = list(UNIVERSE)
    moved = [Position(to[p.ledger], p.entry) for p in points]
    assert ra.contains_many(moved).tolist() == a.contains_many(points).tolist()
    ledgers = Ledgers.of([(0, 4), (3, 0), (7, 6)])
    moved_ledgers = Ledgers.of([(to[0], 4), (to[3], 0), (to[7], 6)])
    assert ra.canonical(moved_ledgers) == _relabel(a.canonical(ledgers), to)
    assert ra.count_entries(moved_ledgers) == a.count_entries(ledgers)


def test_key_layout_corners() -> None:
    # Canonical bounds with many ranges in ledger -1 before the first real ledger.
    rows = [(-1, 2 * i, -1, 2 * i + 1) for i in range(6)] + [(5, 0, 5, 3)]
    rs = RangeSet(np.array(rows, np.int64), _canonical=True)
    assert rs | RangeSet.parse("[(5:2..5:7]]") == RangeSet(np.array(
        [*rows[:-1], (5, 0, 5, 7)], np.int64))
    # An empty set meets a range of another key base.
    far = 2**30 + 5
    one = RangeSet.of((Position(far, 1), Position(far, 4)))
    assert RangeSet()._with_one(one.bounds[0], "or") == one
    assert not RangeSet()._with_one(one.bounds[0], "and")
    # Two sets that each have based keys, but no base holds both: the exact fallback.
    near = RangeSet.of(("3:1", "3:9"), ("4:0", "4:2"))
    wide = RangeSet.of((Position(2**40, 0), Position(2**40, 5)))
    both = near | wide
    assert str(both) == f"[(3:1..3:9],(4:0..4:2],({2**40}:0..{2**40}:5]]"
    assert both - wide == near and not (near & wide)
    assert both.canonical(Ledgers.of([(3, 10), (4, 3), (2**40, 6)])).count_entries(
        Ledgers.of([(3, 10), (4, 3), (2**40, 6)])) == 8 + 2 + 5
    # A ledger list with nothing in it moves nothing.
    assert near.canonical(Ledgers.of([])) == near
