"""The job's mappings are kept packed, with a version per partition: a packed mapping is
the same mapping, a version changes exactly when the mapping does, and a mapping no plan
read in a batch is dropped from memory but for its bytes."""

from __future__ import annotations

import mmap
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.packed import (
    NO_VERSION,
    HeldMappings,
    PackedMappings,
    key_bytes,
    pack_mapping,
    packed_version,
    unpack_mapping,
)
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import translate
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.tables.spill import Spill, SpillError
from tests.support.core_strategies import World, worlds

KEY = PartitionKey("persistent://t/n/orders", 0)
OTHER = PartitionKey("persistent://t/n/orders", 1)
NOW = datetime(2026, 11, 23, tzinfo=UTC)

anchor_rows = st.lists(st.tuples(*[st.integers(0, 50)] * 4), max_size=6)


@settings(max_examples=300, deadline=None)
@given(worlds(), anchor_rows, st.one_of(st.none(), st.floats(0, 2e9)), st.integers(0, 2**62))
def test_a_packed_mapping_unpacks_to_the_same_mapping(
        w: World, anchors: list[tuple[int, int, int, int]], written_at: float | None,
        version: int) -> None:
    """Every part survives, and translation through it is the same."""
    mapping = replace(w.mapping, anchors=Anchors.of(*[
        (Position(a, b), Position(c, d)) for a, b, c, d in anchors]), written_at=written_at)
    data = pack_mapping(mapping, version)
    back = unpack_mapping(data)
    assert packed_version(data) == version
    assert back.segments == mapping.segments
    assert back.segments.evidence_codes.tolist() == mapping.segments.evidence_codes.tolist()
    for kind in ("skippable", "foreign", "unreplicated", "unpaired"):
        assert getattr(back, kind) == getattr(mapping, kind), kind
    assert back.anchors == mapping.anchors
    assert back.written_at == mapping.written_at
    assert pack_mapping(back, version) == data
    assert translate(w.source, back, w.target) == translate(w.source, mapping, w.target)


def _mapping(count: int) -> TopicMapping:
    return TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, count)]),
                        unreplicated=Runs.of((5, count, 1)), written_at=1.5)


def test_a_version_changes_exactly_when_the_mapping_does() -> None:
    held = PackedMappings()
    assert held.version(KEY) == NO_VERSION and held.get(KEY) is None and KEY not in held
    held.put(KEY, _mapping(10))
    first = held.version(KEY)
    assert first != NO_VERSION and held.version(KEY) == first
    held.next_batch()
    held.next_batch()
    assert held.version(KEY) == first  # packed and built again: the same mapping
    held.merge(KEY, _mapping(10))  # adds nothing, but is a new value as far as anyone knows
    assert held.version(KEY) != first
    second = held.version(KEY)
    held.merge(KEY, TopicMapping(SegmentSet.of([Segment(5, 10, 7, 10, 5)])))
    assert held.version(KEY) not in (first, second)
    assert held[KEY].segments == SegmentSet.of([Segment(5, 0, 7, 0, 15)])
    assert held[KEY].unreplicated == Runs.of((5, 10, 1)) and held[KEY].written_at == 1.5
    assert list(held) == [KEY] and len(held) == 1


def test_a_mapping_no_plan_read_in_a_batch_is_kept_packed_only() -> None:
    held = PackedMappings()
    held.put(KEY, _mapping(10))
    held.put(OTHER, _mapping(20))
    assert held.built == 2  # written in this batch
    held.next_batch()
    m = held.get(KEY)
    held.next_batch()
    assert held.built == 1 and held.get(KEY) is m  # read in the last batch: still built
    held.next_batch()
    held.next_batch()  # a batch without a read
    assert held.built == 0
    again = held.get(KEY)
    assert again is not m and again is not None and again.segments == m.segments
    assert held.built == 1 and held.get(KEY) is again  # built once, while it is read


def test_mappings_held_as_objects_change_version_with_the_object() -> None:
    held = HeldMappings()
    a, b = _mapping(10), _mapping(10)
    held.adopt({KEY: a})
    v = held.version(KEY)
    assert held.adopt({KEY: a}).version(KEY) == v and held.get(KEY) is a
    assert held.adopt({KEY: b}).version(KEY) != v
    assert held.adopt({}).version(KEY) == NO_VERSION and held.get(KEY) is None


def test_an_idle_cursor_leaves_its_mapping_packed_and_a_new_mapping_moves_it() -> None:
    """Idle: the step reads versions only, so the partition's mapping is not built. Rows
    that say more (target entries 7:10..7:12 are markers) give the partition a new version;
    the cursor is planned again with them, and the acks they allow are sent."""
    source = CursorState(Position(5, 14), RangeSet(), Ledgers.of([(5, 15)]))
    target = [CursorState(Position(7, 9), RangeSet(), Ledgers.of([(7, 13)]))]
    sent: list[RangeSet] = []

    class Emitter:
        def apply(self, topic: str, subscription: str, safe: object, *, cumulative: bool,
                  ledgers: Ledgers | None = None) -> object:
            sent.append(safe.plan.to_ack)  # type: ignore[attr-defined]
            target.append(CursorState(Position(7, 12), RangeSet(), target[0].ledgers))
            return None

    held = PackedMappings()
    held.put(KEY, TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]),
                               unreplicated=Runs.of((5, 10, 5))))
    step = SyncStep(StepSettings(), Emitter(), lambda t, s: target[-1])
    obs = ObservedCursor(KEY, "sub", source, NOW)
    for _ in range(4):
        held.next_batch()
        (record,) = step.run([obs], held).records
        assert record.result == "emitted" and not record.plan.to_ack
        assert record.plan.mark_delete == Position(7, 9)
    assert held.built == 0 and not sent  # idle since the second batch: mapping dropped
    held.next_batch()
    held.merge(KEY, TopicMapping(skippable=Runs.of((7, 10, 3))))
    (record,) = step.run([obs], held).records
    assert sent == [RangeSet.of(("7:9", "7:12"))]
    assert record.plan.mark_delete == Position(7, 12)


_universe = [PartitionKey(t, p) for t in ("persistent://t/n/a", "persistent://t/n/a-long",
                                          "persistent://t/n/b") for p in (-1, 0, 1, 10)]
_ops = st.lists(st.tuples(st.sampled_from(["put", "merge", "settle", "batch"]),
                          st.sampled_from(_universe), st.integers(1, 30)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(_ops, st.booleans())
def test_settled_and_fresh_mappings_read_as_one_dict(ops: list, spilled: bool) -> None:
    """Whatever mix of fresh and settled rows, on the heap or mapped from files: every
    partition reads back its last mapping and version, and an absent one reads as absent
    (by itself and in a batch of keys)."""
    held = PackedMappings(Spill() if spilled else None)
    want: dict[PartitionKey, TopicMapping] = {}
    versions: dict[PartitionKey, int] = {}
    for op, key, count in ops:
        if op == "settle":
            held.settle(always=True)
        elif op == "batch":
            held.next_batch()
        else:
            mapping = _mapping(count)
            if op == "put":
                held.put(key, mapping)
                want[key] = mapping
            else:
                held.merge(key, mapping)
                want[key] = want[key].union(mapping) if key in want else mapping
            assert held.version(key) not in versions.values()  # new, never seen
            versions[key] = held.version(key)
        assert len(held) == len(want) and set(held) == set(want)
        for k in _universe:
            assert (k in held) == (k in want)
            assert held.version(k) == versions.get(k, NO_VERSION)
            got = held.get(k)
            assert (got is None) == (k not in want)
            if got is not None:
                assert got.segments == want[k].segments
                assert got.unreplicated == want[k].unreplicated
        wanted = np.array([key_bytes(k) for k in _universe])
        assert held.versions(wanted).tolist() == [versions.get(k, NO_VERSION)
                                                 for k in _universe]


def test_settled_mappings_are_mapped_from_a_file_not_the_heap() -> None:
    held = PackedMappings.of({KEY: _mapping(10), OTHER: _mapping(20)}, Spill())
    assert held.fresh == 0 and held.settled_bytes > 0
    assert all(isinstance(a.base, mmap.mmap) or isinstance(getattr(a.base, "base", None),
               mmap.mmap) for a in held.settled_arrays())
    assert held[OTHER].segments == _mapping(20).segments


def test_a_spill_directory_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    with pytest.raises(SpillError, match=str(missing)):
        Spill(missing).array(np.arange(3))


class _FailingSpill(Spill):
    """Fails its ``n``-th array."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.calls, self.n = 0, n

    def array(self, values: np.ndarray, *, writable: bool = False) -> np.ndarray:
        self.calls += 1
        if self.calls == self.n:
            raise SpillError("no room")
        return super().array(values, writable=writable)


@pytest.mark.parametrize("n", [1, 3, 4])
def test_a_settle_whose_spill_fails_leaves_the_mappings_as_they_were(n: int) -> None:
    held = PackedMappings(_FailingSpill(n))
    held.put(KEY, _mapping(10))
    v = held.version(KEY)
    with pytest.raises(SpillError):
        held.settle(always=True)
    assert held.fresh == 1 and held.version(KEY) == v and len(held) == 1
    assert held[KEY].segments == _mapping(10).segments
    held.settle(always=True)  # the spill works again
    assert held.fresh == 0 and held.version(KEY) == v and list(held) == [KEY]
