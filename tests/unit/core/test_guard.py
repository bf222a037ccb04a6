"""The guard against a per-entry oracle, on plans drawn apart from translate, and the
SafePlan only the guard makes."""

from __future__ import annotations

import copy
import os
import pickle
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, event, given, settings

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.guard import (
    AnchorConflictError,
    SafePlan,
    UnsafePlanError,
    _all_backed,
    _licensed_copies,
    check_safe,
    guard,
    may_hold_entries,
)
from cursorsync.core.keys import MAX_KEYED_ENTRY
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import translate
from cursorsync_devtools.oracle import entries_of
from tests.support.core_strategies import LAYOUTS, GuardCase, guard_cases, relabelled

P = Position.parse
SETTINGS = settings(max_examples=int(os.environ.get("CURSORSYNC_EXAMPLES", "200")) * 2,
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------ the oracle


def _acked(cursor: CursorState, p: Position) -> bool:
    return p <= cursor.mark_delete or any(lo < p <= hi for lo, hi in cursor.individually_deleted)


def _entries(runs: Runs) -> set[Position]:
    return {Position(lg, e + k) for lg, e, n in runs.rows.tolist() for k in range(n)}


def oracle_refusals(case: GuardCase) -> set[Position]:
    """Entry by entry: every target entry the plan would ack, individually or under its
    cumulative markDeletePosition, that is not acked on the target, not skippable, not a
    copy an anchor licenses, and not mapped from a source entry acked on the source."""
    m = case.mapping
    source_of = {Position(s.target_ledger, s.target_entry + k):
                 Position(s.source_ledger, s.source_entry + k)
                 for s in m.segments for k in range(s.count)}
    skippable = _entries(m.skippable)
    tops = [t for s, t in m.anchors if s <= case.source.mark_delete]
    licensed = ({p for p in _entries(m.unpaired) if p <= max(tops)} if tops else set())
    bad = set()
    for t in entries_of(case.universe):
        wanted = t <= case.plan.mark_delete or any(lo < t <= hi for lo, hi in case.plan.to_ack)
        if not wanted or _acked(case.target, t) or t in skippable or t in licensed:
            continue
        if t in source_of and _acked(case.source, source_of[t]):
            continue
        bad.add(t)
    return bad


@SETTINGS
@given(guard_cases())
def test_every_verdict_matches_the_per_entry_oracle(case: GuardCase) -> None:
    want = oracle_refusals(case)
    event(f"{case.kind}: {'refused' if want else 'passed'}")
    bad = check_safe(case.plan, case.source, case.mapping, case.target)
    assert set(bad.iter_entries(case.universe)) == want
    assert bool(bad) == bool(want), f"refused positions that hold no entry: {bad}"
    if not case.kind.endswith(("across bases", "too wide")):
        # Where based keys hold the ids, the fast pass answers for every plan that passes
        # (and for none that does not): the exact pass is for refusals.
        acked = case.target.acked()
        rest = ((case.plan.to_ack - acked)
                | may_hold_entries(RangeSet.up_to(case.plan.mark_delete) - acked,
                                   case.target.ledgers))
        if rest:
            licensed = _licensed_copies(case.source.mark_delete, case.mapping)
            assert _all_backed(rest, case.source.acked(), case.mapping, licensed) == (not want)
    if want:
        with pytest.raises(UnsafePlanError, match="refusing to emit"):
            guard(case.plan, case.source, case.mapping, case.target)
    else:
        assert guard(case.plan, case.source, case.mapping, case.target).plan is case.plan


# ------------------------------------------------------------------ worked examples

#: Source 1:0..1:5 -> 7:0..7:5, a marker at 7:6, source 1:6..1:9 -> 7:7..7:10.
MAPPING = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 6), Segment(1, 6, 7, 7, 4)]),
                       skippable=Runs.of((7, 6, 1)))
FRESH = CursorState(P("7:-1"), RangeSet(), Ledgers.of([(7, 11)]))


def _plan(md: str, to_ack: str = "[]", previous: str = "7:-1") -> AckPlan:
    return AckPlan(P(md), RangeSet(), RangeSet.parse(to_ack), P(previous), 0, 0, 0, 0, "exact")


@pytest.mark.parametrize(("md", "to_ack", "bad"), [
    ("7:4", "[(7:-1..7:4]]", "[]"),                 # 1:0..1:4 acked
    ("7:5", "[(7:-1..7:5]]", "[(7:4..7:5]]"),       # 1:5 is not
    ("7:-1", "[(7:4..7:5]]", "[(7:4..7:5]]"),       # 1:5 alone, though 1:6 is acked
    ("7:-1", "[(7:3..7:4]]", "[]"),                 # 1:4 alone, though 1:5 is not
    ("7:-1", "[(7:6..7:7]]", "[]"),                 # 1:6 is acked
    ("7:-1", "[(7:5..7:7]]", "[]"),                 # the marker is always safe
    ("7:-1", "[(7:9..7:10]]", "[(7:9..7:10]]"),     # 1:9 is not
    ("7:-1", "[(7:10..7:12]]", "[(7:10..7:12]]"),   # past the mapping: unknown
    ("7:7", "[]", "[(7:4..7:5]]"),                  # the cumulative ack crosses 7:5
])
def test_each_target_range_is_walked_back_to_its_source(md: str, to_ack: str, bad: str) -> None:
    source = CursorState.parse("1:4", "[(1:5..1:8]]")  # acked 1:0..1:4, 1:6..1:8
    assert str(check_safe(_plan(md, to_ack), source, MAPPING, FRESH)) == bad


def test_a_range_across_ledgers_is_checked_in_position_space() -> None:
    """``to_ack`` positions between two ledgers hold no entry a segment can map: the range
    passes only where the target has them acked already."""
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 3), Segment(1, 3, 9, 0, 2)]))
    source = CursorState.parse("1:4")
    ledgers = Ledgers.of([(7, 3), (9, 2)])
    plan = _plan("7:0", "[(7:0..9:1]]", previous="7:0")
    assert str(check_safe(plan, source, mapping, CursorState(P("7:0"), RangeSet(), ledgers))
               ) == "[(7:2..9:-1]]"
    assert not check_safe(plan, source, mapping, CursorState(P("9:-1"), RangeSet(), ledgers))


def test_the_cumulative_span_skips_only_what_the_ledger_list_rules_out() -> None:
    """Closed ledger ends and absent ledgers hold no entry; the open ledger may hold more
    than its count says."""
    ledgers = Ledgers.of([(7, 3), (9, 2)])
    assert str(may_hold_entries(RangeSet.up_to(P("9:5")), ledgers)) == "[(7:-1..7:2],(9:-1..9:5]]"
    assert may_hold_entries(RangeSet.of(("7:5", "9:-1")), ledgers) == RangeSet()
    assert may_hold_entries(RangeSet.of(("7:5", "9:-1")), None) == RangeSet.of(("7:5", "9:-1"))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 3), Segment(1, 3, 9, 0, 2)]))
    target = CursorState(P("7:-1"), RangeSet(), ledgers)
    assert not check_safe(_plan("9:1"), CursorState.parse("1:4"), mapping, target)
    assert str(check_safe(_plan("9:2"), CursorState.parse("1:4"), mapping, target)
               ) == "[(9:1..9:2]]"
    assert str(check_safe(_plan("9:1"), CursorState.parse("1:4"), mapping,
                          CursorState(P("7:-1"), RangeSet(), None))) == "[(7:2..9:-1]]"


def test_copies_map_back_to_one_source_entry_each() -> None:
    """A replicator that sent 1:2..1:3 twice: both copies follow that one source entry."""
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 4), Segment(1, 2, 7, 4, 4)]))
    to_ack = "[(7:-1..7:7]]"
    assert not check_safe(_plan("7:7", to_ack), CursorState.parse("1:5"), mapping, FRESH)
    hole = CursorState.parse("1:1", "[(1:2..1:5]]")  # 1:2 unacked: 7:2 and its copy 7:4
    assert str(check_safe(_plan("7:-1", to_ack), hole, mapping, FRESH)) == \
        "[(7:1..7:2],(7:3..7:4]]"


def test_anchored_copies_pass_only_once_the_source_reaches_the_anchor() -> None:
    """Unpaired copies 7:0..7:3, an anchor 1:10 -> 7:2: once the source's markDeletePosition
    is at or past 1:10, the copies up to 7:2 may go; 7:3 may not."""
    mapping = TopicMapping(unpaired=Runs.of((7, 0, 4)),
                           anchors=Anchors.of((P("1:10"), P("7:2"))))
    plan = _plan("7:2", "[(7:-1..7:2]]")
    assert str(check_safe(plan, CursorState.parse("1:9"), mapping, FRESH)) == "[(7:-1..7:2]]"
    assert not check_safe(plan, CursorState.parse("1:10"), mapping, FRESH)
    assert str(check_safe(_plan("7:3", "[(7:-1..7:3]]"), CursorState.parse("1:20"), mapping,
                          FRESH)) == "[(7:2..7:3]]"


def test_an_anchor_contradiction_refuses_every_plan() -> None:
    """A segment mapping source 1:10 to 7:1 while an anchor says every target entry up to
    7:5 came from before 1:8: even an empty plan is refused."""
    mapping = TopicMapping(SegmentSet.of([Segment(1, 10, 7, 1, 1)]),
                           anchors=Anchors.of((P("1:8"), P("7:5"))))
    with pytest.raises(AnchorConflictError, match="contradicts"):
        guard(_plan("7:-1"), CursorState.parse("1:20"), mapping, FRESH)
    done = CursorState(P("7:5"), RangeSet(), FRESH.ledgers)
    assert guard(_plan("7:5", previous="7:5"), CursorState.parse("1:20"), mapping, done)


def test_entries_the_target_acked_already_and_overlapping_evidence() -> None:
    """What the target acked stays acked; a mapping that calls an entry both skippable and
    mapped lets it through either way (the exact path decides)."""
    source = CursorState.parse("1:-1")
    target = CursorState(P("7:-1"), RangeSet.parse("[(7:1..7:3]]"), FRESH.ledgers)
    assert not check_safe(_plan("7:-1", "[(7:1..7:3]]"), source, MAPPING, target)
    assert str(check_safe(_plan("7:-1", "[(7:0..7:3]]"), source, MAPPING, target)) == \
        "[(7:0..7:1]]"
    both = TopicMapping(MAPPING.segments, skippable=Runs.of((7, 2, 3)))  # 7:2..7:4
    assert str(check_safe(_plan("7:-1", "[(7:0..7:5]]"), source, both, FRESH)) == \
        "[(7:0..7:1],(7:4..7:5]]"


def test_keys_too_wide_for_based_keys_give_the_same_answer() -> None:
    far = 2**40
    mapping = TopicMapping(SegmentSet.of([Segment(3, 0, 7, 0, 5), Segment(far, 0, 7, 5, 5)]))
    source = CursorState(P("3:4"), RangeSet.of((f"{far}:0", f"{far}:2")))
    assert not check_safe(_plan("7:4", "[(7:-1..7:4],(7:5..7:7]]"), source, mapping, FRESH)
    assert str(check_safe(_plan("7:-1", "[(7:4..7:9]]"), source, mapping, FRESH)) == \
        "[(7:4..7:5],(7:7..7:9]]"


def test_the_exact_pass_keys_every_ledger_in_play() -> None:
    """A refused plan across ledgers no segment covers, and pieces from two source ledgers
    of which only one is unacked: each ledger keeps its own keys."""
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 20), Segment(2, 0, 6, 0, 3)]))
    source = CursorState.parse("1:19")  # ledger 1 acked, ledger 2 not
    plan = _plan("5:-1", "[(5:0..5:3],(6:-1..6:2],(7:-1..7:5]]", previous="5:-1")
    target = CursorState(P("5:-1"), RangeSet(), None)
    assert str(check_safe(plan, source, mapping, target)) == "[(5:0..5:3],(6:-1..6:2]]"


def test_one_piece_can_meet_several_unacked_ranges() -> None:
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 6)]))
    source = CursorState.parse("1:0", "[(1:1..1:2],(1:3..1:5]]")  # 1:1 and 1:3 unacked
    assert str(check_safe(_plan("7:-1", "[(7:-1..7:4]]"), source, mapping, FRESH)) == \
        "[(7:0..7:1],(7:2..7:3]]"


def test_licensed_copies_reach_exactly_the_newest_anchor_the_source_passed() -> None:
    """Anchors reached from an earlier source ledger, naming target positions in two
    ledgers: the furthest (8:1) counts, by ledger first. Copies 7:2..7:3 and 8:0..8:2;
    7:1, 7:4 and 8:2 are not licensed, whatever lies around them."""
    mapping = TopicMapping(unpaired=Runs.of((7, 2, 2), (8, 0, 3)),
                           anchors=Anchors.of((P("0:10"), P("7:5")), (P("0:12"), P("8:1")),
                                              (P("2:0"), P("8:2"))))
    target = CursorState(P("7:-1"), RangeSet(), Ledgers.of([(7, 6), (8, 3)]))
    source = CursorState.parse("1:0")
    assert not check_safe(_plan("7:-1", "[(7:1..7:3],(8:-1..8:1]]"), source, mapping, target)
    for to_ack, bad in (("[(7:0..7:3]]", "[(7:0..7:1]]"), ("[(7:1..7:4]]", "[(7:3..7:4]]"),
                        ("[(8:-1..8:2]]", "[(8:1..8:2]]")):
        assert str(check_safe(_plan("7:-1", to_ack), source, mapping, target)) == bad


#: Three target ledgers: 5 no segment names; 6 mapped from source ledger 2, none of it
#: acked; 7 as :data:`MAPPING` but with its marker at 7:6 between runs whose sources
#: 1:5 and 1:6 are unacked, copies at 7:10..7:11 an anchor from source ledger 0 licenses,
#: and 7:12..7:13 unknown. Acked on the source: 1:0..1:1, 1:3..1:4, 1:7.
SWEPT = TopicMapping(SegmentSet.of([Segment(2, 0, 6, 0, 4), Segment(1, 0, 7, 0, 6),
                                    Segment(1, 6, 7, 7, 3)]),
                     skippable=Runs.of((7, 6, 1)), unpaired=Runs.of((7, 10, 2)),
                     anchors=Anchors.of((P("0:10"), P("7:11"))))
SWEPT_SOURCE = CursorState.parse("1:1", "[(1:2..1:4],(1:6..1:7]]")
SWEPT_LEDGERS = Ledgers.of([(5, 4), (6, 4), (7, 14)])


def _swept_plans() -> list[AckPlan]:
    """Every window of positions, every markDeletePosition, and the pairs of single entries
    in two ledgers or with one entry between them."""
    starts = [P(f"{lg}:-1") for lg in (5, 6, 7)]
    entries = [Position(lg, e) for lg, n in ((5, 4), (6, 4), (7, 14)) for e in range(n)]
    points = sorted(starts + entries)
    plans = [_plan(str(md)) for md in points]
    plans += [_plan("5:-1", f"[({a}..{b}]]") for i, a in enumerate(points) for b in points[i + 1:]]
    plans += [_plan("5:-1", f"[({_before(a)}..{a}],({_before(b)}..{b}]]")
              for i, a in enumerate(entries) for b in entries[i + 1:]
              if a.ledger != b.ledger or b.entry == a.entry + 2]
    return plans


def _before(p: Position) -> Position:
    return Position(p.ledger, p.entry - 1)


@pytest.mark.parametrize("layout", ["as drawn", *LAYOUTS])
def test_every_small_plan_on_a_fixed_mapping_matches_the_oracle(layout: str) -> None:
    """Exhaustive over one small mapping, its ledger ids as drawn, across key bases and
    too wide for them: ranges that start or end exactly where a run does, next to runs
    whose sources are unacked, and single entries in two ledgers with a mapped ledger
    between them. Each verdict is the oracle's and refuses nothing the plan does not ack;
    as drawn, the fast pass answers for exactly the plans that pass."""
    world = SimpleNamespace(source_ledgers=Ledgers.of([(0, 11), (1, 9), (2, 4)]))
    target = CursorState(P("5:-1"), RangeSet(), SWEPT_LEDGERS)
    passed = 0
    for plan in _swept_plans():
        case = GuardCase(world, SWEPT_SOURCE, SWEPT, target,  # type: ignore[arg-type]
                         SWEPT_LEDGERS, plan, "swept")
        if layout != "as drawn":
            case = relabelled(case, layout)
        want = oracle_refusals(case)
        bad = check_safe(case.plan, case.source, case.mapping, case.target)
        assert set(bad.iter_entries(case.universe)) == want, plan
        rest = case.plan.to_ack | may_hold_entries(RangeSet.up_to(case.plan.mark_delete),
                                                   case.universe)
        assert not bad - rest, f"refused positions the plan does not ack: {plan}"
        if rest and layout == "as drawn":
            # In position space: a range past a closed ledger's last entry is refused
            # though it holds no entry there, so the fast pass answers to ``bad``.
            licensed = _licensed_copies(case.source.mark_delete, case.mapping)
            assert _all_backed(rest, case.source.acked(), case.mapping, licensed) == \
                (not bad), plan
        passed += not bad
    assert passed > 10  # not a sweep of refusals alone


def test_licensed_copies_too_far_for_based_keys_cover_no_other_ledger() -> None:
    """Copies an anchor licenses in ledger 2**32 + 7, a plan acking the same entries of
    ledger 7, which nothing maps: ids 2**32 apart share no based keys, so nothing passes."""
    far = 2**32 + 7
    mapping = TopicMapping(unpaired=Runs.of((far, 10, 2)), anchors=Anchors.of((P("0:10"),
                                                                            P(f"{far}:11"))))
    target = CursorState(P("7:-1"), RangeSet(), Ledgers.of([(7, 12), (far, 12)]))
    plan = _plan("7:-1", "[(7:9..7:11]]")
    assert str(check_safe(plan, CursorState.parse("1:0"), mapping, target)) == "[(7:9..7:11]]"
    assert not check_safe(_plan("7:-1", f"[({far}:9..{far}:11]]"), CursorState.parse("1:0"),
                          mapping, target)


def test_source_ledgers_too_far_for_based_keys_back_nothing() -> None:
    """A segment from source ledger 2**40, unacked, beside one from acked ledger 1: the
    source side has no based keys, and the unacked entries are refused all the same."""
    far = 2**40
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 6), Segment(far, 0, 7, 6, 4)]))
    bad = check_safe(_plan("7:-1", "[(7:-1..7:9]]"), CursorState.parse("1:5"), mapping, FRESH)
    assert str(bad) == "[(7:5..7:9]]"


def test_a_run_ending_past_the_keyed_entry_limit_covers_no_more_than_its_entries() -> None:
    """1:0..1:4 -> 7:(M-3)..7:(M+1), the last entry id one past what a based key holds, and
    1:5..1:8 -> 8:0..8:3, all acked. A range from 7:(M-4) to 8:3 also takes in every
    position of ledger 7 after 7:(M+1), which nothing maps: those are refused."""
    m = MAX_KEYED_ENTRY
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, m - 3, 5), Segment(1, 5, 8, 0, 4)]))
    source = CursorState.parse("1:8")
    bad = check_safe(_plan("7:-1", f"[(7:{m - 4}..8:3]]"), source, mapping, FRESH)
    assert str(bad) == f"[(7:{m + 1}..8:-1]]"
    exact = f"[(7:{m - 4}..7:{m + 1}],(8:-1..8:3]]"
    assert not check_safe(_plan("7:-1", exact), source, mapping, FRESH)


def test_acks_in_the_next_source_ledger_back_no_entry_past_the_keyed_entry_limit() -> None:
    """2:(M-3)..2:(M+6) -> 7:0..7:9, the run's end past what a based key holds; the source
    acked 3:0..3:4. 7:5..7:9 are copies of 2:(M+2)..2:(M+6), none of them acked."""
    m = MAX_KEYED_ENTRY
    mapping = TopicMapping(SegmentSet.of([Segment(2, m - 3, 7, 0, 10)]))
    source = CursorState(P("1:-1"), RangeSet.parse("[(3:-1..3:4]]"))
    bad = check_safe(_plan("7:-1", "[(7:4..7:9]]"), source, mapping, FRESH)
    assert str(bad) == "[(7:4..7:9]]"


def test_overlapping_runs_cover_no_more_than_they_hold() -> None:
    """Evidence that overlaps (a segment's 7:1..7:2 and a marker at 7:2) counts each entry
    once: 7:3, which nothing maps, is refused though the runs' lengths add up to the plan's."""
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 1, 2)]),
                           skippable=Runs.of((7, 0, 1), (7, 2, 1)))
    bad = check_safe(_plan("7:-1", "[(7:-1..7:3]]"), CursorState.parse("1:5"), mapping, FRESH)
    assert str(bad) == "[(7:2..7:3]]"


def test_a_range_from_a_late_entry_meets_the_ledgers_after_it() -> None:
    """Entry ids above the ledger ids: a range from 1:5 to 3:0 meets ledger 2's segment,
    which maps from acked entries; only 1:6.. and 3:0, which nothing maps, are refused."""
    mapping = TopicMapping(SegmentSet.of([Segment(9, 0, 2, 0, 3)]))
    target = CursorState(P("1:-1"), RangeSet(), Ledgers.of([(1, 7), (2, 3), (3, 2)]))
    bad = check_safe(_plan("1:-1", "[(1:5..3:0]]", previous="1:-1"), CursorState.parse("9:5"),
                     mapping, target)
    assert str(bad) == "[(1:5..2:-1],(2:2..3:0]]"


def test_refusal_messages_name_what_went_wrong() -> None:
    mapping = TopicMapping(SegmentSet.of([Segment(1, 10 + i, 7, i, 1) for i in range(4)]),
                           anchors=Anchors.of((P("1:8"), P("7:5"))))
    with pytest.raises(AnchorConflictError) as err:
        guard(_plan("7:-1"), CursorState.parse("1:20"), mapping, FRESH)
    shown = str(err.value).split("(", 1)[1].rsplit(")", 1)[0]
    assert shown.count("; ") == 2 and shown.count("segment 1:") == 3
    # The first three contradictions, each whole, as the mapping's check words them.
    assert shown.split("; ") == mapping.anchors.contradictions(
        mapping.segments.rows, after_target=FRESH.mark_delete)[:3]
    assert str(err.value).endswith("nothing was sent until the mapping is repaired")
    with pytest.raises(UnsafePlanError) as unsafe:
        guard(_plan("7:5", "[(7:-1..7:5]]"), CursorState.parse("1:4"), MAPPING, FRESH)
    assert str(unsafe.value) == ("refusing to emit: target positions [(7:4..7:5]] are not "
                                 "acked on the source (source markDelete=1:4 individual=[]); "
                                 "nothing was sent")


# ------------------------------------------------------------------ SafePlan


def _safe() -> tuple[SafePlan, AckPlan]:
    source = CursorState.parse("1:4")
    plan = translate(source, MAPPING, FRESH)
    return guard(plan, source, MAPPING, FRESH), plan


def test_the_guard_makes_a_safe_plan_for_exactly_the_plan_it_checked() -> None:
    safe, plan = _safe()
    assert safe.plan is plan
    assert copy.copy(safe) is safe and copy.deepcopy(safe) is safe
    assert "SafePlan(AckPlan(" in repr(safe)


def test_nothing_else_makes_a_safe_plan() -> None:
    safe, plan = _safe()
    with pytest.raises(TypeError, match=r"^a SafePlan comes only from cursorsync\.core\.guard"
                                        r"\.guard\(\)$"):
        SafePlan(plan)
    with pytest.raises(TypeError, match="dataclass"):
        replace(safe, plan=plan)  # type: ignore[type-var]
    with pytest.raises(TypeError, match=r"^a SafePlan is not pickled: guard the plan in the "
                                        r"process that emits it$"):
        pickle.dumps(safe)
    with pytest.raises(TypeError, match=r"^SafePlan has no subclasses: a SafePlan comes only "
                                        r"from guard\(\)$"):
        type("Forged", (SafePlan,), {})
    bare = object.__new__(SafePlan)
    with pytest.raises(TypeError, match="not made by"):
        _ = bare.plan
    assert repr(bare) == "SafePlan(not from the guard)"
    with pytest.raises(AttributeError):
        object.__setattr__(safe, "plan", plan)
    with pytest.raises(AttributeError):
        object.__setattr__(safe, "_plan", plan)


def test_a_plan_changed_after_the_guard_passed_it_is_refused() -> None:
    safe, plan = _safe()
    object.__setattr__(plan, "to_ack", plan.to_ack | RangeSet.parse("[(7:4..7:10]]"))
    with pytest.raises(TypeError, match="to_ack changed"):
        _ = safe.plan


def test_a_safe_plan_lives_as_long_as_it_is_held() -> None:
    import gc
    import weakref

    from cursorsync.core import guard as guard_module

    safe, _ = _safe()
    ref = weakref.ref(safe)
    held = len(guard_module._GUARDED)
    del safe
    gc.collect()
    assert ref() is None and len(guard_module._GUARDED) == held - 1


def test_unknown_names_are_not_found_in_the_guard() -> None:
    """The planner's rule lives in translate alone: the guard does not answer to its name."""
    from cursorsync.core import guard as guard_module

    for name in ("nothing", "safe_target_acks"):
        with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
            _ = getattr(guard_module, name)
