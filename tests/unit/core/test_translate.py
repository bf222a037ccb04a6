"""Translation against the per-entry oracle, and the invariants on every random world."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import check_safe
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import is_monotone, safe_target_acks, translate, unmapped_source
from cursorsync_devtools.oracle import oracle_translate
from tests.support.core_strategies import World, worlds

P = Position.parse
SETTINGS = settings(max_examples=int(os.environ.get("CURSORSYNC_EXAMPLES", "200")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def entries(rs: RangeSet, world: World) -> set[Position]:
    return set(rs.iter_entries(world.target_ledgers))


@SETTINGS
@given(worlds())
def test_translation_equals_the_per_entry_oracle(w: World) -> None:
    plan = translate(w.source, w.mapping, w.target)
    o = oracle_translate(w.source.mark_delete, w.source.individually_deleted, w.source_ledgers,
                         w.mapping, w.target.mark_delete, w.target.individually_deleted,
                         w.target_ledgers)
    assert entries(plan.to_ack, w) == set(o.to_ack)
    assert plan.mark_delete == o.mark_delete
    after = RangeSet.up_to(plan.mark_delete) | plan.individually_deleted
    assert entries(after.canonical(w.target_ledgers), w) == set(o.acked_after)
    assert plan.unmapped_acked_entries == o.unmapped_acked_entries


@SETTINGS
@given(worlds())
def test_safety_against_ground_truth(w: World) -> None:
    """No deliverable target entry is acked unless its true source entry is acked."""
    plan = translate(w.source, w.mapping, w.target)
    src_acked = set(w.source.acked().canonical(w.source_ledgers).iter_entries(w.source_ledgers))
    back = w.origin
    for t in entries(plan.to_ack, w):
        if t in w.skippable:
            continue
        assert t not in w.foreign, f"foreign entry {t} acked"
        assert t in back and back[t] in src_acked, f"{t} acked but its source is not"
    # The cumulative part too: everything up to the new markDelete is acked or was acked.
    cumulative, _ = plan.split(cumulative=True)
    if cumulative is not None:
        before = RangeSet.up_to(cumulative).canonical(w.target_ledgers)
        current = set(w.target.acked().canonical(w.target_ledgers).iter_entries(w.target_ledgers))
        for t in before.iter_entries(w.target_ledgers):
            ok = t in current or t in w.skippable or (t in back and back[t] in src_acked)
            assert ok, f"cumulative ack to {cumulative} would ack {t}"
    assert not check_safe(plan, w.source, w.mapping, w.target)
    assert is_monotone(plan, w.target)


@SETTINGS
@given(worlds())
def test_progress_with_full_evidence(w: World) -> None:
    """With every pair known, every target counterpart of a source ack is acked."""
    full = SegmentSet.from_pairs(
        np.array([s.ledger for s in w.origin.values()], np.int64),
        np.array([s.entry for s in w.origin.values()], np.int64),
        np.array([t.ledger for t in w.origin], np.int64),
        np.array([t.entry for t in w.origin], np.int64))
    mapping = TopicMapping(full, w.mapping.skippable, w.mapping.foreign, w.mapping.unreplicated)
    plan = translate(w.source, mapping, w.target)
    after = (RangeSet.up_to(plan.mark_delete) | plan.individually_deleted)
    acked_t = set(after.canonical(w.target_ledgers).iter_entries(w.target_ledgers))
    src_acked = set(w.source.acked().canonical(w.source_ledgers).iter_entries(w.source_ledgers))
    for t, s in w.origin.items():
        if s in src_acked:
            assert t in acked_t, f"{t}, a copy of acked {s}, is not acked"
    assert plan.unmapped_acked_entries == 0


@SETTINGS
@given(worlds())
def test_without_ledger_info_still_safe_and_never_more(w: World) -> None:
    """Ledger lists only add progress across ledger ends; without them nothing unsafe appears."""
    src = CursorState(w.source.mark_delete, w.source.individually_deleted, None)
    tgt = CursorState(w.target.mark_delete, w.target.individually_deleted, None)
    bare = translate(src, w.mapping, tgt)
    full = translate(w.source, w.mapping, w.target)
    assert entries(bare.to_ack, w) <= entries(full.to_ack, w)
    assert bare.mark_delete <= full.mark_delete or bare.mark_delete == w.target.mark_delete
    assert not check_safe(bare, src, w.mapping, tgt)


@SETTINGS
@given(worlds())
def test_idempotent_and_monotone_over_repeated_syncs(w: World) -> None:
    plan = translate(w.source, w.mapping, w.target)
    applied = CursorState(plan.mark_delete, plan.individually_deleted, w.target_ledgers)
    again = translate(w.source, w.mapping, applied)
    assert not again.to_ack.canonical(w.target_ledgers).count_entries(w.target_ledgers)
    assert again.mark_delete == plan.mark_delete


# ---------------------------------------------------------------- worked examples


def test_pulsar_docs_worked_example() -> None:
    """markDeletePosition 1:4, individuallyDeletedMessages [(1:5..1:6], (1:8..1:9]]."""
    source = CursorState.parse("1:4", "[(1:5..1:6], (1:8..1:9]]")
    # Source 1:0..1:5 -> 7:100..7:105, a marker at 7:106, 1:6..1:9 -> 7:107..7:110.
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 100, 6), Segment(1, 6, 7, 107, 4)]),
                           skippable=Runs.of((7, 106, 1)))
    target = CursorState.parse("7:99")
    plan = translate(source, mapping, target)
    # Acked on the source: 1:0..1:4, 1:6, 1:9. 1:5 (-> 7:105) is not, so the marker stays.
    assert plan.mark_delete == P("7:104")
    assert str(plan.individually_deleted) == "[(7:106..7:107],(7:109..7:110]]"
    assert str(plan.to_ack) == "[(7:99..7:104],(7:106..7:107],(7:109..7:110]]"
    assert plan.split(cumulative=True) == (
        P("7:104"), RangeSet.parse("[(7:106..7:107],(7:109..7:110]]"))
    assert plan.outcome == "exact"

    # Once 1:5 is acked the marker joins and everything folds into the markDeletePosition.
    later = translate(CursorState.parse("1:9"), mapping,
                      CursorState(plan.mark_delete, plan.individually_deleted))
    assert later.mark_delete == P("7:110")
    assert later.skippable_acked_entries == 1
    assert not later.individually_deleted


def test_unmapped_source_acks_are_counted_not_acked() -> None:
    source = CursorState.parse("1:9")
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 5, 0, 5)]))
    plan = translate(source, mapping, CursorState.parse("5:-1"))
    assert plan.mark_delete == P("5:4")
    assert plan.unmapped_acked_entries == 5  # 1:5..1:9 acked but not mapped yet
    assert plan.outcome == "partial"


def test_source_rewind_is_reported_and_nothing_is_taken_back() -> None:
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 5, 0, 10)]))
    before = CursorState.parse("1:7")
    plan = translate(before, mapping, CursorState.parse("5:-1"))
    rewound = CursorState.parse("1:2")
    plan2 = translate(rewound, mapping, CursorState(plan.mark_delete, plan.individually_deleted),
                      previous_source=before)
    assert plan2.rewound_entries == 5
    assert plan2.mark_delete == P("5:7")
    assert not plan2.to_ack


def test_partial_batches_are_counted() -> None:
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 5, 0, 10)]))
    plan = translate(CursorState.parse("1:3", "[(1:5..1:6]]"), mapping, CursorState.parse("5:-1"),
                     partially_acked=RangeSet.of(("1:3", "1:5"), ("1:7", "1:8")))
    assert plan.partial_batches_unacked == 3  # 1:4, 1:5, 1:8 (1:6 is wholly acked)


def test_foreign_entries_are_never_acked_and_block_the_mark_delete() -> None:
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 5, 0, 3), Segment(1, 3, 5, 4, 3)]),
                           foreign=Runs.of((5, 3, 1)))
    plan = translate(CursorState.parse("1:5"), mapping, CursorState.parse("5:-1"))
    assert plan.mark_delete == P("5:2")
    assert str(plan.individually_deleted) == "[(5:3..5:6]]"
    assert not plan.to_ack.contains(P("5:3"))


def test_safe_target_acks_never_extrapolates_past_a_segment() -> None:
    segs = SegmentSet.of([Segment(1, 10, 2, 0, 5)])
    got = safe_target_acks(RangeSet.up_to(P("1:100")), segs)
    assert str(got) == "[(2:-1..2:4]]"


@pytest.mark.parametrize("md", ["3:-1", "3:0"])
def test_fresh_target_cursor_acks_leading_markers(md: str) -> None:
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 3, 2, 3)]), skippable=Runs.of((3, 0, 2)))
    plan = translate(CursorState.parse("1:2"), mapping, CursorState.parse(md))
    assert plan.mark_delete == P("3:4")


def test_guard_refuses_a_cumulative_ack_over_an_unacked_entry() -> None:
    from dataclasses import replace

    from cursorsync.core.guard import UnsafePlanError, guard

    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 7, 0, 3)]))
    src = CursorState.parse("1:-1", "[(1:0..1:2]]")  # 1:0 is not acked
    tgt = CursorState.parse("7:-1")
    plan = translate(src, mapping, tgt)
    assert plan.mark_delete == P("7:-1")
    guard(plan, src, mapping, tgt)  # the honest plan passes
    forged = replace(plan, mark_delete=P("7:2"))
    assert str(check_safe(forged, src, mapping, tgt)) == "[(7:-1..7:0]]"
    with pytest.raises(UnsafePlanError, match="7:0"):
        guard(forged, src, mapping, tgt)


@SETTINGS
@given(worlds())
def test_implied_unreplicated_never_holds_a_replicated_entry(w: World) -> None:
    """Entries the unmapped count leaves out as never replicated really were not (or came
    over as markers): none has a data counterpart on the target."""
    from cursorsync.core.translate import implied_unreplicated

    implied = implied_unreplicated(w.mapping, w.target_ledgers)
    assert not set(implied.iter_entries(w.source_ledgers)) & set(w.origin.values())


def _trimmed(w: World, deleted: int) -> Ledgers | None:
    """The target's ledger list once its first ``deleted`` ledgers are deleted (None when
    that would leave none)."""
    ids, counts = w.target_ledgers.ids, w.target_ledgers.entries
    if len(ids) <= deleted:
        return None
    return Ledgers.of(zip(ids[deleted:].tolist(), counts[deleted:].tolist(), strict=True))


@SETTINGS
@given(worlds(), st.integers(1, 3))
def test_what_the_count_leaves_out_past_deleted_target_ledgers_has_no_live_copy(
        w: World, deleted: int) -> None:
    """With the target's first ledgers deleted (consumed, or expired) and the mapping
    trimmed to what the sync still reads, an acked source entry the count leaves out
    without mapping it (never replicated, or implied so) has no data copy in a live target
    ledger: failing over cannot deliver it again. Copies the replicator sent again after a
    restart are among the worlds."""
    from cursorsync.core.retention import live_part
    from cursorsync.core.translate import implied_unreplicated

    live = _trimmed(w, deleted)
    if live is None:
        return
    mapping = live_part(w.mapping, None, int(live.ids[0])) or w.mapping
    left_out = implied_unreplicated(mapping, live) | mapping.unreplicated.ranges()
    mapped = mapping.segments.source_ranges()
    for target, source in w.origin.items():
        if left_out.contains(source) and not mapped.contains(source):
            assert target.ledger < live.ids[0], (target, source)


@SETTINGS
@given(worlds(), st.integers(1, 3))
def test_the_unmapped_count_past_deleted_target_ledgers_equals_the_oracle(
        w: World, deleted: int) -> None:
    """Segments into deleted target ledgers: gaps inside one such ledger are judged on the
    known runs alone, in the plan's count and the per-entry oracle's alike."""
    live = _trimmed(w, deleted)
    if live is None:
        return
    target = CursorState(w.target.mark_delete, w.target.individually_deleted, live)
    plan = translate(w.source, w.mapping, target)
    o = oracle_translate(w.source.mark_delete, w.source.individually_deleted, w.source_ledgers,
                         w.mapping, w.target.mark_delete, w.target.individually_deleted, live)
    assert plan.unmapped_acked_entries == o.unmapped_acked_entries


@SETTINGS
@given(worlds())
def test_implied_unreplicated_finds_every_gap_full_evidence_explains(w: World) -> None:
    """With every pair and every marker known and nothing foreign, each unreplicated source
    entry between two replicated ones is implied: the plan can be exact."""
    from cursorsync.core.translate import implied_unreplicated

    if w.mapping.segments.entry_count() != len(w.origin) or w.foreign or not w.origin:
        return
    skips = Runs.from_positions(np.array([p.ledger for p in w.skippable], np.int64),
                                np.array([p.entry for p in w.skippable], np.int64))
    mapping = TopicMapping(w.mapping.segments, skips)
    implied = set(implied_unreplicated(mapping, w.target_ledgers).iter_entries(w.source_ledgers))
    lo, hi = min(w.origin.values()), max(w.origin.values())
    assert {p for p in w.unreplicated if lo < p < hi} <= implied


def test_acks_before_the_first_segment_wait_for_evidence_unless_replication_starts_there() -> None:
    """Source 1:0..1:9 acked; only 1:5.. is mapped (to 7:2..). Target entries 7:0 and 7:1
    come before the first mapped one: unexplained data may be the counterparts of 1:0..1:4,
    so those acks are unmapped and the plan is not exact. Once 7:0 and 7:1 are known
    markers, nothing before the first segment was replicated as data."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    target_ledgers = Ledgers.of([(7, 7)])
    segments = SegmentSet.of([Segment(1, 5, 7, 2, 5)])
    target = CursorState(Position(7, -1), RangeSet(), target_ledgers)
    plan = translate(source, TopicMapping(segments), target)
    assert plan.unmapped_acked_entries == 5 and plan.outcome == "partial"
    markers = TopicMapping(segments, skippable=Runs(np.array([[7, 0, 2]], np.int64)))
    plan = translate(source, markers, target)
    assert plan.unmapped_acked_entries == 0 and plan.outcome == "exact"
    unknown = CursorState(Position(7, -1), RangeSet(), None)
    assert translate(source, markers, unknown).outcome == "partial"


# ---------------------------------------------------------------- key layouts

Relabel = Callable[[np.ndarray], np.ndarray]

#: Order-keeping ledger relabellings (ledger -1 stays): ids across a boundary between key
#: bases, and ids spread too wide for based keys (the exact key-space fallback).
LAYOUTS: dict[str, Callable[[int], Relabel]] = {
    "as drawn": lambda low: lambda ids: ids,
    "across bases": lambda low: lambda ids: np.where(ids == -1, -1, ids - low + 2**30 - 2),
    "too wide": lambda low: lambda ids: np.where(ids == -1, -1, (ids - low) * 2**31 + 7),
}


def _moved_ranges(rs: RangeSet, f: Relabel) -> RangeSet:
    b = rs.bounds.copy()
    b[:, 0], b[:, 2] = f(b[:, 0]), f(b[:, 2])
    return RangeSet(b)


def _moved_position(p: Position, f: Relabel) -> Position:
    return Position(int(f(np.array([p.ledger]))[0]), p.entry)


def _moved_cursor(c: CursorState, f: Relabel) -> CursorState:
    assert c.ledgers is not None
    return CursorState(_moved_position(c.mark_delete, f), _moved_ranges(c.individually_deleted, f),
                       Ledgers(f(c.ledgers.ids), c.ledgers.entries))


def _moved_runs(r: Runs, f: Relabel) -> Runs:
    rows = r.rows.copy()
    rows[:, 0] = f(rows[:, 0])
    return Runs(rows)


@SETTINGS
@given(worlds(), st.sampled_from(list(LAYOUTS)), st.sampled_from(list(LAYOUTS)))
def test_plans_do_not_depend_on_the_key_layout(w: World, src_layout: str, tgt_layout: str) -> None:
    fs = LAYOUTS[src_layout](int(w.source_ledgers.ids[0]))
    ft = LAYOUTS[tgt_layout](int(w.target_ledgers.ids[0]))
    rows = w.mapping.segments.rows.copy()
    rows[:, 0], rows[:, 2] = fs(rows[:, 0]), ft(rows[:, 2])
    anchors = w.mapping.anchors.rows.copy()
    anchors[:, 0], anchors[:, 2] = fs(anchors[:, 0]), ft(anchors[:, 2])
    mapping = TopicMapping(SegmentSet(rows, w.mapping.segments.evidence_codes),
                           _moved_runs(w.mapping.skippable, ft), _moved_runs(w.mapping.foreign, ft),
                           _moved_runs(w.mapping.unreplicated, fs),
                           unpaired=_moved_runs(w.mapping.unpaired, ft), anchors=Anchors(anchors))
    source, target = _moved_cursor(w.source, fs), _moved_cursor(w.target, ft)
    plan = translate(w.source, w.mapping, w.target)
    moved = translate(source, mapping, target)
    assert moved.mark_delete == _moved_position(plan.mark_delete, ft)
    assert moved.individually_deleted == _moved_ranges(plan.individually_deleted, ft)
    assert moved.to_ack == _moved_ranges(plan.to_ack, ft)
    assert moved.unmapped_acked_entries == plan.unmapped_acked_entries
    assert moved.skippable_acked_entries == plan.skippable_acked_entries
    assert moved.outcome == plan.outcome
    assert unmapped_source(source, mapping, target.ledgers) == _moved_ranges(
        unmapped_source(w.source, w.mapping, w.target.ledgers), fs)
    assert not check_safe(moved, source, mapping, target)


def test_safe_target_acks_with_segments_too_far_apart_for_one_key_base() -> None:
    segs = SegmentSet.of([Segment(3, 0, 7, 0, 5), Segment(2**40, 0, 7, 5, 5)])
    got = safe_target_acks(RangeSet.of(("3:1", "3:5"), (f"{2**40}:3", f"{2**40}:4")), segs)
    assert str(got) == "[(7:1..7:4],(7:8..7:9]]"


# ---------------------------------------------------------------- implied gaps, worked


def _gap_world(marker: bool) -> tuple[CursorState, TopicMapping, Ledgers]:
    """Source 1:0..1:9, all acked. 1:0..1:2 -> 7:0..7:2 and 1:6..1:9 -> 7:4..7:7; 7:3 lies
    between them. 1:3..1:5 are not known as unreplicated."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    segments = SegmentSet.of([Segment(1, 0, 7, 0, 3), Segment(1, 6, 7, 4, 4)])
    skips = Runs.of((7, 3, 1)) if marker else Runs()
    return source, TopicMapping(segments, skippable=skips), Ledgers.of([(7, 8)])


def test_a_gap_bridged_only_by_markers_is_implied_unreplicated() -> None:
    """Two segments next to each other on the target with only a marker between: the source
    entries between them were not replicated as data, so the plan waits for nothing."""
    from cursorsync.core.translate import implied_unreplicated

    source, mapping, target_ledgers = _gap_world(marker=True)
    assert implied_unreplicated(mapping, target_ledgers) == RangeSet.of(("1:2", "1:5"))
    assert not unmapped_source(source, mapping, target_ledgers)
    plan = translate(source, mapping, CursorState(Position(7, -1), RangeSet(), target_ledgers))
    assert plan.unmapped_acked_entries == 0 and plan.outcome == "exact"
    assert plan.mark_delete == P("7:7")
    # Inside one ledger every id between the ends exists: no ledger list is needed (the
    # list may be stale, or the ledger deleted).
    assert implied_unreplicated(mapping, None) == RangeSet.of(("1:2", "1:5"))
    assert implied_unreplicated(mapping, Ledgers.of([(7, 4)])) == RangeSet.of(("1:2", "1:5"))
    assert implied_unreplicated(mapping, Ledgers.of([(9, 4)])) == RangeSet.of(("1:2", "1:5"))


def test_a_gap_with_unexplained_data_between_is_not_implied() -> None:
    from cursorsync.core.translate import implied_unreplicated

    source, mapping, target_ledgers = _gap_world(marker=False)
    assert not implied_unreplicated(mapping, target_ledgers)
    plan = translate(source, mapping, CursorState(Position(7, -1), RangeSet(), target_ledgers))
    assert plan.unmapped_acked_entries == 3 and plan.outcome == "partial"


@pytest.mark.parametrize("second", [Segment(1, 8, 7, 6, 2), Segment(1, 8, 8, 0, 2)],
                         ids=["same ledger, shorter", "next ledger, lower entry"])
def test_replication_starts_at_the_first_mapped_target_entry(second: Segment) -> None:
    """Markers 7:0, 7:1, then 1:5..1:7 -> 7:2..7:4 and a later segment: nothing before the
    first mapped target entry is data, so acks before the first segment wait for nothing
    (the first segment is the first in target order, whatever the others look like)."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 8), (8, 2)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 5, 7, 2, 3), second]),
                           skippable=Runs.of((7, 0, 2)))
    plan = translate(source, mapping, target)
    o = oracle_translate(source.mark_delete, source.individually_deleted, source.ledgers,
                         mapping, target.mark_delete, target.individually_deleted,
                         target.ledgers)
    assert plan.unmapped_acked_entries == o.unmapped_acked_entries == 0


def test_data_in_an_earlier_target_ledger_keeps_acks_before_the_first_segment_waiting() -> None:
    """Ledger 6 holds three unexplained entries before the markers and the first mapped
    entry in ledger 7: they may be the copies of 1:0..1:4."""
    source = CursorState(Position(1, 9), RangeSet(), Ledgers.of([(1, 10)]))
    target = CursorState(Position(6, -1), RangeSet(), Ledgers.of([(6, 3), (7, 7)]))
    mapping = TopicMapping(SegmentSet.of([Segment(1, 5, 7, 2, 5)]),
                           skippable=Runs.of((7, 0, 2)))
    plan = translate(source, mapping, target)
    assert plan.unmapped_acked_entries == 5 and plan.outcome == "partial"


def test_monotone_judges_entries_not_how_a_ledger_end_is_written() -> None:
    """Ledger 3 ends at 3:9, ledger 5 follows: a plan at 3:9 with (5:-1..5:1] keeps every
    entry of a target at 5:1."""
    ledgers = Ledgers.of([(3, 10), (5, 4)])
    target = CursorState(Position(5, 1), RangeSet(), ledgers)
    plan = translate(CursorState.parse("1:-1"), TopicMapping(SegmentSet()), target)
    from dataclasses import replace

    kept = replace(plan, mark_delete=P("3:9"), individually_deleted=RangeSet.parse("[(5:-1..5:1]]"))
    assert is_monotone(kept, target)
    assert not is_monotone(replace(kept, mark_delete=P("3:8")), target)
