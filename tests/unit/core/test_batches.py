"""Batch indexes carried to the target: checked message by message against a per-message
oracle, on drawn worlds with re-sent copies, unmapped entries and target-side partial
batches, and the guard's walk back from each index."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.batches import (
    IndexAck,
    PartialBatch,
    plan_index_acks,
    unbacked_index_acks,
)
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import UnsafePlanError, check_safe, guard
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import SegmentSet, TopicMapping
from cursorsync.core.translate import translate, with_index_acks

S, T = 1, 5  # the source's ledger and the target's


@dataclass(frozen=True)
class World:
    sizes: list[int]              # messages per source entry
    copies: list[int]             # target entry k copies source entry copies[k] (-1: foreign)
    source_md: int
    source_individual: frozenset[int]
    source_indexes: dict[int, frozenset[int]]   # partly acked source entries
    target_md: int
    target_indexes: dict[int, frozenset[int]]   # partly acked target entries

    def segments(self) -> SegmentSet:
        pairs = [(s, t) for t, s in enumerate(self.copies) if s >= 0]
        n = len(pairs)
        return SegmentSet.from_pairs(np.full(n, S), np.array([p[0] for p in pairs], np.int64),
                                     np.full(n, T), np.array([p[1] for p in pairs], np.int64))

    def source(self) -> CursorState:
        acked = RangeSet.of(*((Position(S, e - 1), Position(S, e))
                              for e in sorted(self.source_individual)))
        batches = tuple(PartialBatch(Position(S, e), self.sizes[e], ix)
                        for e, ix in sorted(self.source_indexes.items()))
        return CursorState(Position(S, self.source_md), acked, batches=batches)

    def target(self) -> CursorState:
        return CursorState(Position(T, self.target_md))

    def target_partials(self) -> dict[Position, PartialBatch]:
        return {Position(T, t): PartialBatch(Position(T, t), self._size_at(t), ix)
                for t, ix in self.target_indexes.items()}

    def _size_at(self, t: int) -> int:
        return self.sizes[self.copies[t]]

    def source_acked(self, entry: int, index: int) -> bool:
        """The oracle: is message ``index`` of source entry ``entry`` acked on the source?"""
        return (entry <= self.source_md or entry in self.source_individual
                or index in self.source_indexes.get(entry, frozenset()))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=12))
    n = len(sizes)
    copies = draw(st.lists(st.one_of(st.integers(0, n - 1), st.just(-1)),
                           min_size=1, max_size=2 * n))
    source_md = draw(st.one_of(st.just(-1), st.integers(-1, n - 1)))
    after = list(range(source_md + 1, n))
    individual = frozenset(draw(st.sets(st.sampled_from(after), max_size=len(after) // 2))
                           if after else ())
    indexes: dict[int, frozenset[int]] = {}
    for e in after:
        if e in individual or sizes[e] < 2:
            continue
        part = draw(st.sets(st.integers(0, sizes[e] - 1), min_size=1, max_size=sizes[e] - 1)
                    | st.just(set()))
        if part:
            indexes[e] = frozenset(part)
    target_md = draw(st.one_of(st.just(-1), st.integers(-1, max(len(copies) - 1, -1))))
    held: dict[int, frozenset[int]] = {}
    for t in range(target_md + 1, len(copies)):
        s = copies[t]
        if s in indexes and draw(st.booleans()):
            sub = draw(st.sets(st.sampled_from(sorted(indexes[s]))))
            if sub:
                held[t] = frozenset(sub)
    return World(sizes, copies, source_md, individual, indexes, target_md, held)


def _plan(w: World, *, known: bool) -> tuple[CursorState, TopicMapping, CursorState, object]:
    source, target = w.source(), w.target()
    mapping = TopicMapping(segments=w.segments())
    plan = translate(source, mapping, target)
    plan = with_index_acks(plan, source, mapping.segments, target,
                           w.target_partials() if known else None)
    return source, mapping, target, plan


@settings(max_examples=300, deadline=None)
@given(worlds(), st.booleans())
def test_index_acks_are_exactly_the_source_acked_messages_of_unacked_copies(
        w: World, known: bool) -> None:
    source, mapping, target, plan = _plan(w, known=known)
    acked_whole = target.acked() | plan.to_ack | RangeSet.up_to(plan.mark_delete)
    got: dict[int, frozenset[int]] = {}
    for a in plan.index_acks:
        assert a.target.ledger == T and a.target.entry not in got
        got[a.target.entry] = a.indexes
        s = w.copies[a.target.entry]
        assert a.size == w.sizes[s]
        # Safety, message by message: every index acked is acked on the source.
        assert all(w.source_acked(s, i) for i in a.indexes)
    for t, s in enumerate(w.copies):
        if s < 0 or Position(T, t) in acked_whole:
            assert t not in got
            continue
        want = w.source_indexes.get(s, frozenset())
        if known:
            want = want - w.target_indexes.get(t, frozenset())
        # Nothing the source holds is left out; what the target holds is not sent again.
        assert got.get(t, frozenset()) == want
    assert check_safe(plan, source, mapping, target) == RangeSet()
    guard(plan, source, mapping, target)


@settings(max_examples=300, deadline=None)
@given(worlds(), st.data())
def test_the_guard_refuses_an_index_the_source_has_not_acked(w: World, data: st.DataObject,
                                                            ) -> None:
    source, mapping, target, plan = _plan(w, known=False)
    candidates = [(t, i) for t, s in enumerate(w.copies) if s >= 0
                  for i in range(w.sizes[s]) if not w.source_acked(s, i)]
    if not candidates:
        return
    t, i = data.draw(st.sampled_from(candidates))
    bad = IndexAck(Position(T, t), w.sizes[w.copies[t]], frozenset({i}))
    tampered = replace(plan, index_acks=(*plan.index_acks, bad))
    assert Position(T, t) in check_safe(tampered, source, mapping, target)
    with pytest.raises(UnsafePlanError):
        guard(tampered, source, mapping, target)


def test_an_index_on_a_foreign_or_unmapped_entry_is_refused() -> None:
    segments = SegmentSet.from_pairs(np.array([S]), np.array([3]), np.array([T]), np.array([7]))
    partial = PartialBatch(Position(S, 3), 4, frozenset({0, 2}))
    ok = IndexAck(Position(T, 7), 4, frozenset({0, 2}))
    assert unbacked_index_acks([ok], [partial], RangeSet(), segments) == []
    nowhere = IndexAck(Position(T, 8), 4, frozenset({0}))
    resized = IndexAck(Position(T, 7), 5, frozenset({0}))
    more = IndexAck(Position(T, 7), 4, frozenset({0, 1, 2}))
    assert unbacked_index_acks([nowhere, resized, more], [partial], RangeSet(), segments) == [
        nowhere, resized, IndexAck(Position(T, 7), 4, frozenset({1}))]
    # A source entry acked whole backs any index of its batch.
    whole = RangeSet.of((Position(S, 2), Position(S, 3)))
    assert unbacked_index_acks([more], [], whole, segments) == []


def test_a_target_batch_of_another_size_is_not_the_same_batch() -> None:
    segments = SegmentSet.from_pairs(np.array([S]), np.array([3]), np.array([T]), np.array([7]))
    partial = PartialBatch(Position(S, 3), 4, frozenset({1}))
    held = {Position(T, 7): PartialBatch(Position(T, 7), 3, frozenset({0}))}
    assert plan_index_acks([partial], segments, RangeSet(), held) == ()
    assert plan_index_acks([partial], segments, RangeSet()) == (
        IndexAck(Position(T, 7), 4, frozenset({1})),)


def test_batches_no_segment_maps_wait_and_are_counted() -> None:
    source = CursorState(Position(S, -1), batches=(
        PartialBatch(Position(S, 0), 3, frozenset({1})),
        PartialBatch(Position(S, 4), 2, frozenset({0}))))
    mapping = TopicMapping(segments=SegmentSet.from_pairs(
        np.array([S]), np.array([0]), np.array([T]), np.array([0])))
    target = CursorState(Position(T, -1))
    plan = with_index_acks(translate(source, mapping, target), source, mapping.segments, target)
    assert plan.index_acks == (IndexAck(Position(T, 0), 3, frozenset({1})),)
    assert plan.partial_batches_unacked == 1


@pytest.mark.parametrize(("size", "acked"), [(0, {0}), (3, set()), (3, {3}), (3, {-1})])
def test_a_partial_batch_names_indexes_inside_its_batch(size: int, acked: set[int]) -> None:
    with pytest.raises(ValueError, match="batch at 1:2"):
        PartialBatch(Position(1, 2), size, frozenset(acked))
