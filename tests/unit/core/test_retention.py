"""A mapping without what names only deleted ledgers plans the same acks as the whole mapping:
the sync keeps the live part only, so its memory follows the live ledgers, not the history."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import CursorState, fold
from cursorsync.core.guard import UnsafePlanError, guard
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.packed import PackedMappings
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.retention import LiveLedgers, first_ledger, live_part
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import translate
from cursorsync.sync.step import StepSettings, SyncStep
from tests.support.core_strategies import World, worlds


def _deleted(state: CursorState, first: int) -> CursorState:
    """``state`` once the broker deleted the ledgers before ``first``: it does so only when
    the cursor is past them."""
    ids, entries = state.ledgers.ids, state.ledgers.entries  # type: ignore[union-attr]
    keep = ids >= first
    live = Ledgers(ids[keep].copy(), entries[keep].copy())
    md, individually = fold(max(state.mark_delete, Position(first, -1)),
                            state.individually_deleted, live)
    return CursorState(md, individually.after(md), live)


def _verdict(plan: object, source: CursorState, mapping: TopicMapping,
             target: CursorState) -> str:
    try:
        guard(plan, source, mapping, target)  # type: ignore[arg-type]
    except UnsafePlanError as err:
        return type(err).__name__
    return "safe"


@settings(max_examples=600, deadline=None)
@given(worlds(), st.data())
def test_a_mapping_without_its_deleted_ledgers_plans_the_same(w: World, data: st.DataObject,
                                                             ) -> None:
    target_ids, source_ids = w.target_ledgers.ids, w.source_ledgers.ids
    cut_t = data.draw(st.integers(0, len(target_ids) - 1), label="target ledgers deleted")
    cut_s = data.draw(st.integers(0, len(source_ids) - 1), label="source ledgers deleted")
    assume(cut_t or cut_s)
    target = _deleted(w.target, int(target_ids[cut_t]))
    source = _deleted(w.source, int(source_ids[cut_s]))
    firsts = first_ledger(source.ledgers), first_ledger(target.ledgers)
    live = live_part(w.mapping, *firsts)
    mapping = w.mapping if live is None else live
    whole = translate(source, w.mapping, target, previous_source=w.source)
    plan = translate(source, mapping, target, previous_source=w.source)
    # The same acks; fewer source acks may wait for evidence: one whose copy can only have
    # been in a deleted target ledger waits for nothing.
    assert replace(plan, unmapped_acked_entries=0, outcome="exact") == replace(
        whole, unmapped_acked_entries=0, outcome="exact")
    assert plan.unmapped_acked_entries <= whole.unmapped_acked_entries
    assert _verdict(plan, source, mapping, target) == _verdict(whole, source, w.mapping, target)
    # With snapshot evidence the segments count up to the newest anchor: the same acks.
    vouched = translate(source, mapping.vouched(), target, previous_source=w.source)
    whole_vouched = translate(source, w.mapping.vouched(), target, previous_source=w.source)
    assert (vouched.mark_delete, vouched.individually_deleted, vouched.to_ack) == (
        whole_vouched.mark_delete, whole_vouched.individually_deleted, whole_vouched.to_ack)
    again = live_part(mapping, *firsts)
    assert again is None  # nothing left to drop


def test_the_live_part_drops_each_kind_by_its_side_s_first_ledger() -> None:
    mapping = TopicMapping(
        SegmentSet.of([Segment(1, 0, 10, 0, 5), Segment(2, 0, 11, 0, 5),
                       Segment(3, 0, 12, 0, 5)]),
        skippable=Runs.of((10, 5, 1), (12, 5, 1)), foreign=Runs.of((11, 6, 2)),
        unreplicated=Runs.of((1, 5, 1), (3, 5, 1)), unpaired=Runs.of((10, 7, 1)),
        anchors=Anchors.of((Position(1, 6), Position(10, 5)), (Position(3, 6), Position(12, 5))),
        written_at=7.0)
    live = live_part(mapping, 3, 11)  # the first live ledger of each side
    assert live is not None
    # A segment goes with both its ledgers: 1 -> 10. Source ledger 2 is gone but its target
    # copies (11) live.
    assert live.segments == SegmentSet.of([Segment(2, 0, 11, 0, 5), Segment(3, 0, 12, 0, 5)])
    kept = live_part(mapping, 1, 11)
    assert kept is not None and kept.segments == mapping.segments
    assert live.skippable == Runs.of((12, 5, 1)) and live.foreign == Runs.of((11, 6, 2))
    assert live.unreplicated == Runs.of((3, 5, 1)) and live.unpaired == Runs.of()
    assert live.anchors == Anchors.of((Position(3, 6), Position(12, 5)))
    assert live.written_at == 7.0
    assert live_part(live, 3, 11) is None
    # Unknown (or empty) ledger lists drop nothing.
    assert live_part(mapping, None, None) is None
    assert first_ledger(Ledgers(np.empty(0, np.int64), np.empty(0, np.int64))) is None
    assert first_ledger(None) is None and first_ledger(Ledgers.of([(3, 6), (4, 0)])) == 3


def test_the_sync_keeps_the_live_part_and_its_cursor_then_goes_idle() -> None:
    """Planning a cursor whose topic deleted ledgers on both sides trims the held mapping
    (once: a new version), and the cursor goes idle on the trimmed one."""
    key = PartitionKey("persistent://t/n/orders", 0)
    held = PackedMappings()
    held.put(key, TopicMapping(SegmentSet.of([Segment(1, 0, 10, 0, 5), Segment(2, 0, 11, 0, 5)]),
                               skippable=Runs.of((10, 5, 1))))
    source = CursorState(Position(2, 4), RangeSet(), Ledgers.of([(2, 5)]))
    target = CursorState(Position(11, 4), RangeSet(), Ledgers.of([(11, 5)]))
    step = SyncStep(StepSettings(), None, lambda t, s: target)
    obs = ObservedCursor(key, "sub", source, datetime(2026, 11, 23, tzinfo=UTC))
    before = held.version(key)
    versions = []
    for _ in range(5):
        held.next_batch()
        (record,) = step.run([obs], held).records
        assert record.result == "emitted" and not record.plan.to_ack
        assert record.plan.mark_delete == Position(11, 4)
        versions.append(held.version(key))
    assert before != versions[0] and len(set(versions)) == 1  # trimmed once
    assert held[key].segments == SegmentSet.of([Segment(2, 0, 11, 0, 5)])
    assert held[key].skippable == Runs.of()
    assert step.kept.target_reads_skipped >= 3  # idle on the trimmed mapping


def test_the_builder_trims_its_known_mappings_with_the_ledgers_the_sync_read() -> None:
    """The builder reads no ledger lists: the sync's step hands it the first live ledgers of
    each partition it plans, and the builder keeps the live part of its known mapping."""
    from cursorsync.mapping.builder import BuilderSettings, MappingBuilder

    key = PartitionKey("persistent://t/n/orders", 0)
    live = LiveLedgers()
    builder = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), live=live)
    builder.seed_known({key: TopicMapping(
        SegmentSet.of([Segment(1, 0, 10, 0, 5), Segment(2, 0, 11, 0, 5)]),
        skippable=Runs.of((10, 5, 1), (11, 5, 1)))})
    step = SyncStep(StepSettings(), None, lambda t, s: CursorState(
        Position(11, 4), RangeSet(), Ledgers.of([(11, 6)])), live_ledgers=live)
    step.run([ObservedCursor(key, "sub", CursorState(Position(2, 4), RangeSet(),
                                                     Ledgers.of([(2, 5)])),
                             datetime(2026, 11, 23, tzinfo=UTC))],
             {key: builder.known[key]})
    outcome = builder.process(pa.table({
        "cluster": ["B"], "topic": [key.topic], "partition": pa.array([0], pa.int32()),
        "ledger": pa.array([11], pa.int64()), "entry": pa.array([6], pa.int64()),
        "batch_index": pa.array([-1], pa.int32()), "source_position": ["2:5"],
        "entry_identity": pa.array([None], pa.binary())}))
    known = builder.known[key]
    assert known.segments == SegmentSet.of([Segment(2, 0, 11, 0, 5), Segment(2, 5, 11, 6, 1)])
    assert known.skippable == Runs.of((11, 5, 1))
    assert live.take() == {}  # taken by the builder
    assert outcome.live == {key: (2, 11)}  # for the table's live row
    step.run([ObservedCursor(key, "sub", CursorState(Position(2, 5), RangeSet(),
                                                     Ledgers.of([(2, 6)])),
                             datetime(2026, 11, 23, tzinfo=UTC))],
             {key: builder.known[key]})
    assert live.take() == {}  # nothing dead in what the sync planned: nothing handed over
