"""RangeSet algebra against a set-of-positions model, and ledger-aware folding."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core import keys as keys_mod
from cursorsync.core.cursor import fold
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet, spans

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


# ------------------------------------- sets whose keys come late, and the edges of the API

def _late(rs: RangeSet, ledger: int) -> RangeSet:
    """The same set made by the exact-key fallback: canonical bounds whose based keys are
    derived on first use (as results of the fallback and canonical plans are). ``ledger``
    is past every range of ``rs``; entries past 2**32 - 2 there have no based key."""
    wide = RangeSet.of((Position(ledger, 2**40), Position(ledger, 2**40 + 1)))
    return (rs | wide) - wide


#: Layouts for _late sets: ledger -1 only, a low ledger beside ledgers of the next key base,
#: and every ledger in the next key base (where ledger -1 must still key below them all).
LATE_LABELS = {
    "plain": {lg: lg for lg in [-1, *LEDGERS]},
    "low and high": {-1: -1, 0: 1, 3: 2**30 + 4, 7: 2**30 + 8},
    "high": {-1: -1, 0: 2**30 + 1, 3: 2**30 + 4, 7: 2**30 + 8},
}
LATE_SETS = [
    "[]",
    "[(-1:0..-1:5]]",
    "[(-1:0..-1:1],(-1:2..-1:3],(-1:4..-1:5]]",
    "[(-1:0..-1:1],(-1:2..-1:3],(-1:4..0:2],(3:1..3:4]]",
    "[(-1:-1..0:3],(7:0..7:2]]",
    "[(0:0..0:2],(0:3..0:5],(3:0..3:1],(7:1..7:3]]",
    "[(0:1..0:4],(3:0..7:2]]",
]


@pytest.mark.parametrize("labels", list(LATE_LABELS))
def test_sets_keyed_late_meet_keyed_sets_like_sets(labels: str) -> None:
    to = LATE_LABELS[labels]
    universe = [Position(to[lg], e) for lg in [-1, *LEDGERS] for e in range(-1, 8)]

    def entries(rs: RangeSet) -> set[Position]:
        return {p for p in universe if any(lo < p <= hi for lo, hi in rs)}

    sets = [_relabel(RangeSet.parse(text), to) for text in LATE_SETS]
    others = [*sets, *(RangeSet.up_to(Position(to[lg], 1)) for lg in LEDGERS)]
    for a in sets:
        late = _late(a, to[7] + 1)
        assert str(late) == str(a) and [p in late for p in universe] == [
            p in entries(a) for p in universe]
        for b in others:
            for got, want in ((late | b, entries(a) | entries(b)),
                              (late & b, entries(a) & entries(b)),
                              (late - b, entries(a) - entries(b)),
                              (b - late, entries(b) - entries(a))):
                assert entries(got) == want, (str(a), str(b))
                assert str(got) == str(RangeSet(got.bounds.copy()))


def test_entries_too_large_for_based_keys() -> None:
    # Entries past 2**32 - 2 have no based key: such sets keep to exact keys.
    big = 2**40
    across = RangeSet.of((Position(3, big), Position(5, 2)))
    assert [p in across for p in (P("3:7"), Position(3, big + 1), P("4:0"), P("5:2"),
                                  P("5:3"))] == [False, True, True, True, False]
    assert across & RangeSet.up_to(P("5:0")) == RangeSet.of((Position(3, big), P("5:0")))
    within = RangeSet.of((P("3:0"), Position(3, big)))
    assert P("4:0") not in within and P("3:5") in within
    assert str(within - RangeSet.up_to(P("3:5"))) == f"[(3:5..3:{big}]]"
    # Points with small entries only: the key space still holds the bounds' entries.
    assert across.contains_many([P("4:0"), P("6:0")]).tolist() == [True, False]


def test_sets_in_ledger_minus_one() -> None:
    """Ledger -1 (MIN_POSITION's) with no other: based keys of base 0."""
    low = RangeSet.up_to(P("-1:5"))
    assert str(low) == "[(-1:-1..-1:5]]" and P("-1:0") in low and P("0:0") not in low
    assert RangeSet.parse("[(1:0..1:5]]").contains_many([P("-1:3"), P("1:3")]).tolist() == [
        False, True]
    assert low | RangeSet.parse("[(-1:7..0:1]]") == RangeSet.parse(
        "[(-1:-1..-1:5],(-1:7..0:1]]")


def test_up_to_at_or_below_min_position_is_empty() -> None:
    for p in (Position(-1, -1), Position(-1, -2), Position(-2, 5)):
        assert not RangeSet.up_to(p)
    assert RangeSet.up_to(P("0:-1")) == RangeSet.parse("[(-1:-1..0:-1]]")


def test_spans_gathers_each_span_in_turn() -> None:
    assert spans(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist() == [5, 6, 9, 10, 11]


def test_bounds_of_any_integer_dtype_are_exact() -> None:
    # Unsigned ids (as an Arrow uint64 column holds them) past 2**53 stay exact.
    lg = 2**53 + 1
    got = RangeSet.entries(np.array([lg], np.uint64), np.array([5], np.uint64),
                           np.array([3], np.uint64))
    assert got == RangeSet.of((Position(lg, 4), Position(lg, 7)))
    assert RangeSet(np.array([[3, 0, 3, 5], [7, 1, 7, 2]], np.int32)) == RangeSet.parse(
        "[(3:0..3:5],(7:1..7:2]]")


def test_equality_tells_sets_apart() -> None:
    a = RangeSet.parse("[(1:0..1:5]]")
    far = RangeSet.of((Position(1, 2**40), Position(1, 2**40 + 5)))  # no based keys
    for other in (RangeSet.parse("[(1:0..1:6]]"), RangeSet.parse("[(1:1..1:5]]"),
                  RangeSet.parse("[(1:0..1:5],(1:7..1:8]]"), RangeSet(), far):
        assert a != other and other != a
    assert RangeSet() != "[]" and a != str(a) and a == RangeSet.parse(str(a))
    # Hashes spread (dict and set lookups rely on it), and equal sets hash alike.
    assert len({hash(RangeSet.up_to(Position(1, e))) for e in range(50)}) == 50


def test_is_canonical_rejects_what_the_constructor_would_fix() -> None:
    def raw(*rows: tuple[int, int, int, int]) -> RangeSet:
        return RangeSet(np.array(rows, np.int64), _canonical=True)

    assert raw((1, 0, 1, 1), (1, 5, 1, 8)).is_canonical()
    for bad in (raw((1, 5, 1, 3)), raw((1, 3, 1, 3)), raw((1, 0, 1, 3), (1, 3, 1, 5)),
                raw((1, 0, 1, 1), (1, 5, 1, 8), (1, 7, 1, 9))):
        assert not bad.is_canonical()


def test_repr_shows_the_set_up_to_200_characters() -> None:
    assert repr(RangeSet.parse("[(1:5..1:6]]")) == "RangeSet([(1:5..1:6]])"
    head = ",".join(f"(1:{2 * i}..1:{2 * i + 1}]" for i in range(15))
    for last in ("(1:30..1:310]", "(1:300..1:310]"):  # 200 and 201 characters
        text = f"[{head},{last}]"
        cut = text if len(text) < 200 else text[:200] + "..."
        assert repr(RangeSet.parse(text)) == f"RangeSet({cut})"


def test_contains_answers_a_boolean_per_point() -> None:
    keyed = RangeSet.parse("[(1:0..1:5]]")
    for rs, points in ((keyed, []), (RangeSet(), [P("1:1")]), (keyed, [P("1:1"), P("1:9")])):
        got = rs.contains_many(points)
        assert got.dtype == np.bool_ and got.tolist() == [p in members(rs) or (
            rs == keyed and p == P("1:1")) for p in points]


def test_iter_entries_without_ledgers_stays_within_one_ledger() -> None:
    rs = RangeSet.parse("[(1:-1..1:2],(1:5..1:7]]")
    assert [str(p) for p in rs.iter_entries()] == ["1:0", "1:1", "1:2", "1:6", "1:7"]
    with pytest.raises(ValueError, match=re.escape("range (1:5..2:3] spans ledgers; its")):
        list(RangeSet.parse("[(1:0..1:1],(1:5..2:3]]").iter_entries())


def test_parse_error_names_the_range_and_the_text() -> None:
    with pytest.raises(ValueError) as bad:
        RangeSet.parse("[(1:5..1:6],(6:0..5:9]]")
    assert str(bad.value) == ("range 1 of '[(1:5..1:6],(6:0..5:9]]', (6:0..5:9],"
                              " does not end after it starts")
    long = "[" + ",".join(f"(1:{2 * i}..1:{2 * i + 1}]" for i in range(30)) + ",(9:5..9:5]]"
    with pytest.raises(ValueError) as bad:
        RangeSet.parse(long)
    assert str(bad.value) == (f"range 30 of {long[:200]!r}, (9:5..9:5],"
                              " does not end after it starts")


def test_unsorted_bounds_far_apart_are_sorted_and_read_only() -> None:
    far = 2**40
    rows = [[far, 0, far, 5], [5, 0, 5, 3], [2**30 + 5, 0, 2**30 + 5, 1], [6, 0, 6, 1]]
    rs = RangeSet(np.array(rows, np.int64))
    assert str(rs) == f"[(5:0..5:3],(6:0..6:1],({2**30 + 5}:0..{2**30 + 5}:1],({far}:0..{far}:5]]"
    with pytest.raises(ValueError):
        rs.bounds[0, 0] = 9


def test_a_set_of_ledger_minus_one_alone_meets_a_set_keyed_far_from_it() -> None:
    """A set holding positions of ledger -1 only, keyed with a base far above another
    set's: nothing of it moves to the other base, and the algebra answers as for sets."""
    far = 2**40
    low = RangeSet.up_to(Position(far, 5)) - RangeSet.parse(f"[(-1:5..{far}:5]]")
    assert str(low) == "[(-1:-1..-1:5]]"
    other = RangeSet.parse("[(3:0..3:1]]")
    assert str(low | other) == "[(-1:-1..-1:5],(3:0..3:1]]"
    assert not (low & other) and other - low == other and low - other == low


@settings(max_examples=400)
@given(st.lists(st.integers(0, 12), min_size=0, max_size=4), st.data())
def test_few_ranges_are_counted_as_on_arrays(counts: list[int], data: st.DataObject) -> None:
    """A few ranges are counted on Python ints: the same counts as on arrays, with a ledger
    list (positions before, between, inside and past its ledgers) and without."""
    from cursorsync.core import ranges as ranges_mod

    ids = [10 * (i + 1) for i in range(len(counts))]
    ledgers = Ledgers.of(zip(ids, counts, strict=True)) if ids else None
    pts = [Position(lg, e) for lg in [-1, 5, *ids, 10 * len(ids) + 7] for e in range(-1, 14)]
    rows = []
    for _ in range(data.draw(st.integers(0, 20))):
        a, b = sorted(data.draw(st.lists(st.sampled_from(pts), min_size=2, max_size=2)))
        rows.append((a.ledger, a.entry, b.ledger, b.entry))
    rs = RangeSet(np.array(rows, dtype=np.int64).reshape(-1, 4))
    few = (rs.count_entries(ledgers), rs.count_entries())
    saved = ranges_mod._FEW_COUNTED
    ranges_mod._FEW_COUNTED = -1
    try:
        arrays = (rs.count_entries(ledgers), rs.count_entries())
    finally:
        ranges_mod._FEW_COUNTED = saved
    assert few == arrays
    if ledgers is not None:
        entries = [Position(lg, e) for lg, n in zip(ids, counts, strict=True) for e in range(n)]
        assert few[0] == sum(1 for p in entries if p in rs)
