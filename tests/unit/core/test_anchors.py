"""Snapshot anchors: licensed positions and contradictions against per-entry oracles, no false
alarm on any truthful world, and the guard refusing a mapping an anchor contradicts."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import AnchorConflictError, guard
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs, SegmentSet, TopicMapping
from cursorsync.core.translate import translate
from tests.support.core_strategies import World, worlds

P = Position.parse
SETTINGS = settings(max_examples=int(os.environ.get("CURSORSYNC_EXAMPLES", "200")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

positions = st.builds(Position, st.integers(1, 4), st.integers(0, 12))


@SETTINGS
@given(st.lists(st.tuples(positions, positions), max_size=8), positions)
def test_licensed_is_the_furthest_target_of_the_anchors_at_or_before_the_source(
        pairs: list[tuple[Position, Position]], md: Position) -> None:
    ok = [t for s, t in pairs if s <= md]
    assert Anchors.of(*pairs).licensed(md) == (max(ok) if ok else None)


segment_rows = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 10), st.integers(1, 3),
                                  st.integers(0, 10), st.integers(1, 6)), max_size=6)


@SETTINGS
@given(segment_rows, st.lists(st.tuples(positions, positions), max_size=6),
       st.none() | positions)
def test_contradictions_equal_the_per_entry_oracle(
        rows: list[tuple[int, int, int, int, int]], pairs: list[tuple[Position, Position]],
        after: Position | None) -> None:
    """A pair conflicts when one of the segment's entries maps a source at or after S to a
    target at or before T; with ``after_target``, only anchors and segments reaching past it
    count."""
    anchors = Anchors.of(*pairs)
    expected = 0
    for sl, se, tl, te, n in rows:
        if after is not None and Position(tl, te + n - 1) <= after:
            continue
        for s, t in anchors:
            if after is not None and t <= after:
                continue
            expected += any(Position(tl, te + k) <= t and Position(sl, se + k) >= s
                            for k in range(n))
    seg = np.array(rows, np.int64).reshape(-1, 5)
    assert len(anchors.contradictions(seg, after_target=after, limit=10**6)) == expected


@SETTINGS
@given(worlds())
def test_no_truthful_world_contradicts_its_anchors(w: World) -> None:
    """The brokers' anchors never contradict the true mapping, copies sent again included;
    the guard passes every plan of a truthful world."""
    assert w.mapping.anchors.contradictions(w.mapping.segments.rows, limit=1) == []
    guard(translate(w.source, w.mapping, w.target), w.source, w.mapping, w.target)


@SETTINGS
@given(worlds(), st.data())
def test_anchored_acks_follow_the_source_to_the_newest_anchor_never_past(
        w: World, data: st.DataObject) -> None:
    """Every known copy at or before the licensed T is acked; nothing after it is acked
    because of the anchors but markers (skippable runs are acked once the entry before
    them is, and an anchored copy can be that entry)."""
    plan = translate(w.source, w.mapping, w.target)
    top = w.mapping.anchors.licensed(w.source.mark_delete)
    after = (RangeSet.up_to(plan.mark_delete) | plan.individually_deleted).canonical(
        w.target_ledgers)
    acked = set(after.iter_entries(w.target_ledgers))
    copies = set(w.mapping.unpaired.ranges().iter_entries(w.target_ledgers))
    for t in copies:
        if top is not None and t <= top:
            assert t in acked
    bare = TopicMapping(w.mapping.segments, w.mapping.skippable, w.mapping.foreign,
                        w.mapping.unreplicated, unpaired=w.mapping.unpaired)
    without = translate(w.source, bare, w.target)
    extra = plan.to_ack - without.to_ack - w.mapping.skippable.ranges()
    for t in extra.canonical(w.target_ledgers).iter_entries(w.target_ledgers):
        assert top is not None and t <= top, t


def test_a_segment_shifted_onto_earlier_targets_is_refused_and_nothing_is_sent() -> None:
    """Source 1:0..1:9 -> target 7:0..7:9. The snapshot anchor (1:6 -> 7:4): every target entry
    up to 7:4 came from before 1:6. A mapping that claims 1:5..1:9 are 7:2..7:6 contradicts it."""
    anchors = Anchors.of((P("1:6"), P("7:4")))
    true = SegmentSet.from_pairs(np.full(10, 1), np.arange(10), np.full(10, 7), np.arange(10))
    target = CursorState(P("7:-1"))
    source = CursorState(P("1:9"))
    ok = TopicMapping(true, anchors=anchors)
    guard(translate(source, ok, target), source, ok, target)
    wrong = TopicMapping(SegmentSet.from_pairs(np.full(5, 1), np.arange(5, 10), np.full(5, 7),
                                               np.arange(2, 7)), anchors=anchors)
    with pytest.raises(AnchorConflictError, match="1:6->7:4"):
        guard(translate(source, wrong, target), source, wrong, target)
    # Once the target is acked past the anchor, the settled part is no longer compared.
    done = CursorState(P("7:4"))
    guard(translate(source, wrong, done), source, wrong, done)


def test_snapshot_only_acks_known_copies_up_to_the_newest_anchor_at_or_before_the_source(
        ) -> None:
    """No segment at all: copies 7:0..7:9, a foreign entry 7:3 and anchors (1:4 -> 7:5),
    (1:9 -> 7:8). The source at 1:6 licenses 7:5: 7:0..7:5 less 7:3, never 7:6 on."""
    copies = Runs.of((7, 0, 3), (7, 4, 6))
    m = TopicMapping(foreign=Runs.of((7, 3, 1)), unpaired=copies,
                     anchors=Anchors.of((P("1:4"), P("7:5")), (P("1:9"), P("7:8"))))
    target = CursorState(P("7:-1"))
    plan = translate(CursorState(P("1:6")), m, target)
    assert plan.to_ack == RangeSet.of((P("7:-1"), P("7:2")), (P("7:3"), P("7:5")))
    assert plan.mark_delete == P("7:2")
    guard(plan, CursorState(P("1:6")), m, target)
    assert translate(CursorState(P("1:3")), m, target).to_ack == RangeSet()


@SETTINGS
@given(worlds())
def test_vouched_segments_stop_at_the_newest_anchor_and_plan_a_subset(w: World) -> None:
    """With snapshot evidence on, segments count only up to the newest anchor's target
    position: what is left is part of what was there, and its plan acks a subset."""
    cut = w.mapping.vouched()
    top = w.mapping.anchors.newest_target()
    kept = cut.segments.target_ranges()
    assert not (kept - w.mapping.segments.target_ranges())
    if top is None:
        assert not len(cut.segments)
    else:
        assert not kept.after(top)
        assert (w.mapping.segments.target_ranges() & RangeSet.up_to(top)) == kept
    full = translate(w.source, w.mapping, w.target)
    part = translate(w.source, cut, w.target)
    assert not (part.to_ack - full.to_ack)
    guard(part, w.source, cut, w.target)
