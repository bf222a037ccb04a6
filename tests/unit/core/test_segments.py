"""Segments from evidence, their invariant, runs, holes and identity alignment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.positions import Position
from cursorsync.core.segments import (
    Runs,
    Segment,
    SegmentSet,
    evidence_code,
    holes,
)
from cursorsync.errors import MappingConflictError

P = Position.parse
A = np.array


def test_pairs_collapse_into_runs_broken_by_ledger_and_gaps() -> None:
    # Source 1:0..1:5 -> 9:10..9:15, except 1:3 is missing; then 2:0..2:1 -> 9:16, 11:0.
    sl = A([1, 1, 1, 1, 1, 2, 2])
    se = A([0, 1, 2, 4, 5, 0, 1])
    tl = A([9, 9, 9, 9, 9, 9, 11])
    te = A([10, 11, 12, 14, 15, 16, 0])
    segs = SegmentSet.from_pairs(sl, se, tl, te)
    assert [str(s) for s in segs] == [
        "1:0+3->9:10 (position-property)", "1:4+2->9:14 (position-property)",
        "2:0+1->9:16 (position-property)", "2:1+1->11:0 (position-property)"]
    assert segs.lookup(P("1:2")) == P("9:12")
    assert segs.lookup(P("1:3")) is None
    assert segs.lookup(P("0:0")) is None and segs.lookup(P("3:0")) is None
    assert segs.entry_count() == 7


def test_duplicate_evidence_is_idempotent_and_union_merges() -> None:
    a = SegmentSet.of([Segment(1, 0, 5, 0, 10)])
    b = SegmentSet.of([Segment(1, 10, 5, 10, 5)])
    assert (a | a) == a
    assert list(a | b) == [Segment(1, 0, 5, 0, 15)]


@pytest.mark.parametrize("segs", [
    [Segment(1, 0, 5, 0, 10), Segment(2, 0, 5, 5, 3)],
    [Segment(1, 0, 5, 0, 10), Segment(1, 0, 5, 9, 3)],
    [Segment(1, 0, 5, 0, 3), Segment(2, 0, 5, 20, 3), Segment(3, 0, 5, 1, 30)],
])
def test_two_sources_for_one_target_entry_conflict_and_name_the_segments(
        segs: list[Segment]) -> None:
    with pytest.raises(MappingConflictError) as err:
        SegmentSet.of(segs)
    assert "overlap on the target" in str(err.value)
    assert str(segs[0]) in str(err.value) and str(segs[-1]) in str(err.value)


def test_copies_sent_again_map_one_source_entry_to_several_target_entries() -> None:
    """A source broker crash: the replicator sends 3:1..3:9 again after 17:0..17:9 and
    then goes on with 3:10. Each target entry keeps one source; lookup gives the first
    copy, ``copies`` every one."""
    pairs = [(3, e, 17, e) for e in range(10)] + [(3, e, 17, 9 + e) for e in range(1, 15)]
    sl, se, tl, te = (A([p[i] for p in pairs]) for i in range(4))
    segs = SegmentSet.from_pairs(sl, se, tl, te)
    assert [str(s) for s in segs] == ["3:0+10->17:0 (position-property)",
                                      "3:1+14->17:10 (position-property)"]
    assert not segs.conflicts()
    assert segs.lookup(P("3:4")) == P("17:4")
    assert segs.copies(P("3:4")) == [P("17:4"), P("17:13")]
    assert segs.copies(P("3:0")) == [P("17:0")] and segs.copies(P("3:12")) == [P("17:21")]
    assert segs.copies(P("3:15")) == [] and segs.lookup(P("3:15")) is None
    # The same evidence in two batches, split anywhere, unions to the same set.
    half = len(pairs) // 2
    a = SegmentSet.from_pairs(sl[:half], se[:half], tl[:half], te[:half])
    b = SegmentSet.from_pairs(sl[half:], se[half:], tl[half:], te[half:])
    assert (a | b) == segs == (b | a)


def test_contradicting_pairs_for_one_entry_conflict() -> None:
    """Two sources for target 5:0 contradict; one source at 5:0 and 5:1 is a copy."""
    with pytest.raises(MappingConflictError):
        SegmentSet.from_pairs(A([1, 1]), A([0, 1]), A([5, 5]), A([0, 0]))
    assert SegmentSet.from_pairs(A([1, 1]), A([0, 0]), A([5, 5]), A([0, 1])).copies(
        P("1:0")) == [P("5:0"), P("5:1")]


@given(st.lists(st.integers(0, 40), unique=True, max_size=40), st.integers(0, 3))
def test_from_pairs_round_trips_any_monotone_pairing(src: list[int], jump: int) -> None:
    src = sorted(src)
    tgt = [e + jump * (i // 7) for i, e in enumerate(src)]
    segs = SegmentSet.from_pairs(A([1] * len(src)), A(src), A([4] * len(src)), A(tgt))
    assert segs.entry_count() == len(src)
    for s, t in zip(src, tgt, strict=True):
        assert segs.lookup(Position(1, s)) == Position(4, t)
    assert not segs.conflicts()


def test_runs_and_holes() -> None:
    runs = Runs.from_positions(A([3, 3, 3, 4]), A([5, 6, 8, 0]))
    assert runs.rows.tolist() == [[3, 5, 2], [3, 8, 1], [4, 0, 1]]
    # A reader saw 3:0, 3:1, 3:4, then 5:2: holes 3:2..3:3 and 5:0..5:1, nothing after 3:4.
    h = holes(A([3, 3, 3, 5]), A([0, 1, 4, 2]))
    assert h.rows.tolist() == [[3, 2, 2], [5, 0, 2]]
    # Continuing a stream: the previous batch ended at 5:2.
    assert holes(A([5]), A([6]), previous=P("5:2")).rows.tolist() == [[5, 3, 3]]
    assert len(holes(A([5]), A([0]))) == 0


def test_adjacent_runs_join_whatever_evidence_and_keep_every_kind() -> None:
    """Evidence alternating entry by entry is one segment whose summary names both kinds;
    rows that agree merge their kinds, and a contradiction still raises."""
    n = 25
    idx = np.arange(n, dtype=np.int64)
    codes = np.where(idx % 2 == 1, evidence_code("identity"),
                     evidence_code("position-property")).astype(np.int8)
    segs = SegmentSet.from_pairs(np.full(n, 3), idx, np.full(n, 7), idx, codes)
    assert [str(s) for s in segs] == ["3:0+25->7:0 (position-property,identity)"]
    # Written in two batches as two rows, by two kinds: one segment again.
    first = SegmentSet.of([Segment(3, 0, 7, 0, 10, "position-property")])
    second = SegmentSet.of([Segment(3, 10, 7, 10, 15, "identity")])
    assert first | second == segs
    # The same row read with another kind is the same segment, not a conflict.
    assert len(first | SegmentSet.of([Segment(3, 0, 7, 0, 10, "identity")])) == 1
    with pytest.raises(MappingConflictError):
        first | SegmentSet.of([Segment(4, 0, 7, 5, 1, "identity")])


def test_one_claim_read_in_pieces_of_any_cut_unions_to_one_segment() -> None:
    """A segment already joined with its continuation meets one of its pieces again (a row
    of the table maintenance's merge beside the rows it merged, a retried batch): same
    ledgers, same offset, overlapping or touching: one segment, evidence joined. At another
    offset, an overlap is still a conflict."""
    joined = SegmentSet.of([Segment(1, 0, 10, 3, 10, "identity")])
    piece = SegmentSet.of([Segment(1, 2, 10, 5, 4, "position-property")])
    later = SegmentSet.of([Segment(1, 8, 10, 11, 5, "identity")])
    for union, count in ((joined | piece, 10), (piece | joined, 10),
                         (joined | piece | later, 13), (later | piece | joined, 13)):
        assert list(union) == [Segment(1, 0, 10, 3, count, next(iter(union)).evidence)]
    assert "position-property" in next(iter(joined | piece)).evidence
    with pytest.raises(MappingConflictError, match="overlap on the target"):
        joined | SegmentSet.of([Segment(2, 0, 10, 4, 2)])
