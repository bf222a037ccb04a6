"""Translation at its edges, in worked examples: target and source ledger ends, key layouts
the based keys cannot hold, implied gaps judged pair by pair, and what a plan counts.

Each example states the plan it expects; where every ledger is listed the per-entry oracle
agrees, and the guard passes the plan.
"""

from __future__ import annotations

import pytest

from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.guard import check_safe
from cursorsync.core.keys import MAX_KEYED_ENTRY
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.retention import live_part
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import (
    implied_unreplicated,
    safe_target_acks,
    translate,
    unmapped_source,
)
from cursorsync_devtools.oracle import oracle_translate

P = Position.parse
M = MAX_KEYED_ENTRY


def _plan(source: CursorState, mapping: TopicMapping, target: CursorState) -> AckPlan:
    """translate's plan, checked against the oracle and the guard."""
    assert source.ledgers is not None and target.ledgers is not None
    plan = translate(source, mapping, target)
    o = oracle_translate(source.mark_delete, source.individually_deleted, source.ledgers,
                         mapping, target.mark_delete, target.individually_deleted,
                         target.ledgers)
    assert set(plan.to_ack.iter_entries(target.ledgers)) == set(o.to_ack)
    assert plan.mark_delete == o.mark_delete
    assert plan.unmapped_acked_entries == o.unmapped_acked_entries
    assert not check_safe(plan, source, mapping, target)
    return plan


def _fresh(*ledgers: tuple[int, int]) -> CursorState:
    """A target cursor that has acked nothing, over these ledgers."""
    return CursorState(Position(ledgers[0][0], -1), RangeSet(), Ledgers.of(ledgers))


# ---------------------------------------------------------------- ledger ends on the target


def test_markers_join_across_a_target_ledger_end_and_the_mark_delete_follows() -> None:
    """Source 1:0..1:2 acked -> 7:0..7:2; markers 7:3 (the last of ledger 7) and 8:0; 1:3,
    1:4 -> 8:1, 8:2 not acked. 7:3 joins after 7:2, then 8:0 after 7:3 (its predecessor
    across the ledger end): two rounds, two markers, and the markDeletePosition reaches
    8:0."""
    source = CursorState(Position(1, 2), RangeSet(), Ledgers.of([(1, 5)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 3), Segment(1, 3, 8, 1, 2)]),
                           skippable=Runs.of((7, 3, 1), (8, 0, 1)))
    plan = _plan(source, mapping, _fresh((7, 4), (8, 3)))
    assert plan.mark_delete == P("8:0")
    assert not plan.individually_deleted
    assert plan.skippable_acked_entries == 2
    assert plan.to_ack == RangeSet.of(("7:-1", "7:3"), ("8:-1", "8:0"))


def test_a_plan_folds_across_a_target_ledger_end() -> None:
    """1:0..1:2 -> 7:0..7:2 (all of ledger 7), 1:3, 1:4 -> 8:0, 8:1: all acked, so the
    markDeletePosition moves to 8:1 and nothing stays individual."""
    source = CursorState(Position(1, 4), RangeSet(), Ledgers.of([(1, 5)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 3), Segment(1, 3, 8, 0, 2)]))
    plan = _plan(source, mapping, _fresh((7, 3), (8, 2)))
    assert plan.mark_delete == P("8:1")
    assert not plan.individually_deleted
    assert plan.outcome == "exact"


# ---------------------------------------------------------------- what a plan counts


def test_counts_span_source_ledgers() -> None:
    """Source ledgers 1 and 2 (ten entries each); only 1:0..1:4 is mapped. Unmapped acks,
    a rewind and unacked partial batches are all counted entry by entry across the ledger
    end (a count without the list would see only the last ledger's share)."""
    ledgers = Ledgers.of([(1, 10), (2, 10)])
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 5)]))
    target = _fresh((7, 5))
    everything = CursorState(Position(2, 9), RangeSet(), ledgers)
    plan = _plan(everything, mapping, target)
    assert plan.unmapped_acked_entries == 15  # 1:5..1:9 and 2:0..2:9
    assert plan.outcome == "partial"
    assert plan.rewound_entries == 0 and plan.partial_batches_unacked == 0
    back = CursorState(Position(1, 7), RangeSet(), ledgers)
    plan = translate(back, mapping, target, previous_source=everything,
                     partially_acked=RangeSet.of(("1:8", "2:1")))
    assert plan.rewound_entries == 12  # 1:8, 1:9 and 2:0..2:9
    assert plan.partial_batches_unacked == 3  # 1:9, 2:0, 2:1
    assert plan.unmapped_acked_entries == 3  # 1:5..1:7


def test_no_segment_at_all_is_unknown_not_exact() -> None:
    plan = translate(CursorState.parse("1:9"), TopicMapping(SegmentSet()), _fresh((7, 5)))
    assert plan.outcome == "unknown"
    assert plan.mark_delete == P("7:-1") and not plan.to_ack


def test_unmapped_acks_ending_at_a_source_ledger_start_are_counted() -> None:
    """1:0..1:4 -> 7:0..7:4, data nothing explains at 7:5, 2:0..2:5 -> 7:6..7:11, all of it
    acked: 1:5..1:9 are acked and unmapped; as a range, (1:4..2:-1], they end where ledger
    2 starts."""
    source = CursorState(Position(2, 5), RangeSet(), Ledgers.of([(1, 10), (2, 6)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 5), Segment(2, 0, 7, 6, 6)]))
    target = CursorState(Position(7, -1), RangeSet(), None)
    assert translate(source, mapping, target).unmapped_acked_entries == 5
    waiting = unmapped_source(source, mapping, None)
    assert set(waiting.iter_entries(source.ledgers)) == {Position(1, e) for e in range(5, 10)}


# ---------------------------------------------------------------- acks before the first segment


def test_one_entry_after_a_one_entry_first_segment_waits() -> None:
    """Only 1:0 -> 7:0 is known; 1:1..1:9 are acked and wait for their copies, the one right
    after the first segment too, although the target's stream starts mapped."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 1)]))
    plan = _plan(source, mapping, _fresh((7, 1)))
    assert plan.unmapped_acked_entries == 9


def test_one_ack_before_the_first_segment_waits_when_the_target_has_data_before_it() -> None:
    """1:1..1:9 -> 7:1..7:9; 7:0 is data nothing explains: it may be the copy of 1:0."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 1, 7, 1, 9)]))
    plan = _plan(source, mapping, _fresh((7, 10)))
    assert plan.unmapped_acked_entries == 1 and plan.outcome == "partial"


def test_acks_after_the_first_segment_wait_when_the_stream_starts_mapped() -> None:
    """Markers 7:0, 7:1, then 1:5..1:7 -> 7:2..7:4: 1:0..1:4 precede replication, but 1:8
    and 1:9 are acked and not mapped yet."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 5, 7, 2, 3)]), skippable=Runs.of((7, 0, 2)))
    target = _fresh((7, 5))
    plan = _plan(source, mapping, target)
    assert plan.unmapped_acked_entries == 2
    assert unmapped_source(source, mapping, target.ledgers) == RangeSet.of(("1:7", "1:9"))


@pytest.mark.parametrize("source_ledgers", [None, Ledgers.of([])], ids=["none", "empty"])
def test_acks_before_a_mapped_start_wait_for_nothing_without_a_source_ledger_list(
        source_ledgers: Ledgers | None) -> None:
    """Markers 7:0, 7:1, then 2:0..2:5 -> 7:2..7:7: every source ack before 2:0 precedes
    replication, whatever the source's ledgers are."""
    source = CursorState(Position(2, 5), RangeSet(), source_ledgers)
    mapping = TopicMapping(SegmentSet.of([Segment(2, 0, 7, 2, 6)]), skippable=Runs.of((7, 0, 2)))
    assert not unmapped_source(source, mapping, Ledgers.of([(7, 8)]))


# ---------------------------------------------------------------- implied gaps, pair by pair


def test_a_one_entry_gap_bridged_by_a_marker_is_implied() -> None:
    """1:0..1:2 -> 7:0..7:2, marker 7:3, 1:4..1:9 -> 7:4..7:9: 1:3 alone was not replicated
    as data, so the plan waits for nothing."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 3), Segment(1, 4, 7, 4, 6)]),
                           skippable=Runs.of((7, 3, 1)))
    target = _fresh((7, 10))
    assert implied_unreplicated(mapping, target.ledgers) == RangeSet.of(("1:2", "1:3"))
    plan = _plan(source, mapping, target)
    assert plan.unmapped_acked_entries == 0 and plan.outcome == "exact"


def test_a_gap_over_a_target_ledger_end_with_no_entry_between_is_implied() -> None:
    """1:0..1:3 -> 7:0..7:3 (the whole of ledger 7), 1:6..1:9 -> 8:0..8:3: the target
    holds no entry between the two, so 1:4 and 1:5 were not replicated as data."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 4), Segment(1, 6, 8, 0, 4)]))
    target = _fresh((7, 4), (8, 4))
    assert implied_unreplicated(mapping, target.ledgers) == RangeSet.of(("1:3", "1:5"))
    plan = _plan(source, mapping, target)
    assert plan.unmapped_acked_entries == 0 and plan.mark_delete == P("8:3")


def test_data_in_one_gap_blocks_that_gap_only() -> None:
    """Ledger 7 (7:0..7:3) <- 1:0..1:3; ledger 8 holds markers 8:0, 8:1 and data 8:2..8:4
    nothing explains; 9:0, 9:1 <- 1:6, 1:7, marker 9:2, 9:3 <- 1:9. The first gap (7:3..
    9:-1] may hold copies of 1:4, 1:5; the second holds only a marker, so 1:8 is implied."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    mapping = TopicMapping(
        SegmentSet.of([Segment(1, 0, 7, 0, 4), Segment(1, 6, 9, 0, 2), Segment(1, 9, 9, 3, 1)]),
        skippable=Runs.of((8, 0, 2), (9, 2, 1)))
    target = _fresh((7, 4), (8, 5), (9, 10))
    assert implied_unreplicated(mapping, target.ledgers) == RangeSet.of(("1:7", "1:8"))
    plan = _plan(source, mapping, target)
    assert plan.unmapped_acked_entries == 2  # 1:4, 1:5


def test_a_gap_is_found_by_its_own_position_among_every_pair() -> None:
    """1:0, 1:1 -> 7:0, 7:1; markers 8:0..8:98; 1:3, 1:4 -> 8:99, 8:100; a copy of 1:0 sent
    again -> 9:0; data nothing explains at 9:1; 1:6 -> 9:2. Only 1:2 is implied: the gap
    after the copy holds data, and the pair before it goes back."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 2), Segment(1, 3, 8, 99, 2),
                                          Segment(1, 0, 9, 0, 1), Segment(1, 6, 9, 2, 1)]),
                           skippable=Runs.of((8, 0, 99)))
    target = _fresh((7, 2), (8, 101), (9, 3))
    assert implied_unreplicated(mapping, target.ledgers) == RangeSet.of(("1:1", "1:2"))
    assert _plan(source, mapping, target).unmapped_acked_entries == 4  # 1:5, 1:7..1:9


def _resent_world(between: str) -> tuple[CursorState, TopicMapping]:
    """Source 1:0..1:3, all acked. The target's ledger 7, since deleted: 7:0 <- 1:0, then
    ``between`` at 7:1 (a marker, or a copy of 1:1 no evidence pairs), 7:2 <- 1:2, and a
    marker at 7:3. The
    replicator started again at 1:1 ("copy" only): ledger 8 holds 8:0 <- 1:1 unpaired,
    then 1:2, 1:3 at 8:1, 8:2; otherwise ledger 8 holds 1:2, 1:3 again at 8:0, 8:1."""
    source = CursorState(Position(1, 3), RangeSet(), Ledgers.of([(1, 4)]))
    again = 1 if between == "copy" else 0
    segments = SegmentSet.of([Segment(1, 0, 7, 0, 1), Segment(1, 2, 7, 2, 1),
                              Segment(1, 2, 8, again, 2)])
    skips = Runs.of((7, 1, 1), (7, 3, 1)) if between == "marker" else Runs.of((7, 3, 1))
    return source, TopicMapping(segments, skippable=skips)


def test_a_gap_bridged_by_markers_in_a_deleted_target_ledger_stays_implied() -> None:
    """Once ledger 7 is deleted, the known marker at 7:1 still says 1:1 was not replicated
    as data, and trimming the mapping keeps that as a source fact, so the count waits for
    nothing, with or without a ledger list."""
    source, mapping = _resent_world("marker")
    live = Ledgers.of([(8, 2)])
    assert implied_unreplicated(mapping, live) == RangeSet.of(("1:0", "1:1"))
    trimmed = live_part(mapping, None, 8)
    assert trimmed is not None and not trimmed.skippable.entry_count()
    assert trimmed.unreplicated.ranges() == RangeSet.of(("1:0", "1:1"))
    for target_ledgers in (live, None):
        assert not unmapped_source(source, trimmed, target_ledgers).count_entries(source.ledgers)


def test_a_gap_holding_data_in_a_deleted_target_ledger_says_nothing() -> None:
    """7:1 is data nothing pairs, and the copy of 1:1 sent again lies in the live ledger
    8: a consumer of the target can still receive it, so 1:1 counts as unmapped."""
    source, mapping = _resent_world("copy")
    live = Ledgers.of([(8, 3)])
    assert not implied_unreplicated(mapping, live)
    trimmed = live_part(mapping, None, 8)
    assert trimmed is None or not trimmed.unreplicated.entry_count()
    waiting = unmapped_source(source, trimmed or mapping, live)
    assert set(waiting.iter_entries(source.ledgers)) == {P("1:1")}


def test_a_gap_over_a_target_ledger_end_says_nothing_without_the_ledger_list() -> None:
    """1:0..1:3 -> 7:0..7:3, 1:6..1:9 -> 8:0..8:3: how many entries ledger 7 holds past 7:3
    only its ledger list says."""
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 4), Segment(1, 6, 8, 0, 4)]))
    assert not implied_unreplicated(mapping, None)
    assert not implied_unreplicated(mapping, Ledgers.of([(8, 4)]))


def test_each_pair_is_judged_against_its_own_predecessor() -> None:
    """In target order the sources run 5:0..5:1, 3:0..3:1, 3:4..3:5, 4:1..4:2 (the source
    goes back once). The pair that goes back says nothing; the others imply their gaps:
    3:2, 3:3 in one ledger, and 3:6.. to 4:0 across a source ledger end."""
    mapping = TopicMapping(SegmentSet.of([
        Segment(5, 0, 7, 0, 2), Segment(3, 0, 7, 2, 2), Segment(3, 4, 7, 4, 2),
        Segment(4, 1, 7, 6, 2)]))
    assert implied_unreplicated(mapping, Ledgers.of([(7, 8)])) == RangeSet.of(
        ("3:1", "3:3"), ("3:5", "4:0"))


# ---------------------------------------------------------------- keys that cannot hold


def test_far_apart_segments_map_only_acked_entries_of_their_own_ledgers() -> None:
    """Segments from ledgers 3 and 2**40 (too far apart for one key base): acks in ledger
    4, which no segment maps, map to nothing, and nothing acked in ledger 2**40 maps
    nothing there."""
    far = 2**40
    segs = SegmentSet.of([Segment(3, 0, 7, 0, 5), Segment(far, 0, 7, 5, 5)])
    assert safe_target_acks(RangeSet.of(("3:1", "3:5")), segs) == RangeSet.of(("7:1", "7:4"))
    got = safe_target_acks(RangeSet.of(("3:1", "3:5"), ("4:2", "4:4")), segs)
    assert got == RangeSet.of(("7:1", "7:4"))


def test_a_source_run_past_the_keyed_entry_limit_maps_exactly() -> None:
    """2:(M-3)..2:(M+1) -> 7:0..7:4, the last entry id one past what a based key holds;
    2:(M-3)..2:(M-1) are acked, so exactly 7:0..7:2 are."""
    segs = SegmentSet.of([Segment(2, M - 3, 7, 0, 5)])
    got = safe_target_acks(RangeSet.of(("2:-1", f"2:{M - 1}")), segs)
    assert got == RangeSet.of(("7:-1", "7:2"))


def test_a_target_run_past_the_keyed_entry_limit_maps_exactly() -> None:
    """1:0..1:4 -> 8:(M-3)..8:(M+1), all acked: the acks end at 8:(M+1), not at the end
    of ledger 8 (9:-1), which would take in any later entry of ledger 8."""
    segs = SegmentSet.of([Segment(1, 0, 8, M - 3, 5)])
    got = safe_target_acks(RangeSet.of(("1:-1", "1:4")), segs)
    assert str(got) == f"[(8:{M - 4}..8:{M + 1}]]"
