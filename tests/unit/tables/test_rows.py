"""rows.py: mapping, cursor state and progress rows round trip through the store; topic
mappings are the union of what each batch wrote."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.errors import MappingConflictError
from cursorsync.tables import (
    RowFilter,
    open_store,
)
from cursorsync.tables.rows import (
    cursor_state_rows,
    cursor_states,
    mapping_rows,
    mappings_rows,
    sync_progress_rows,
    topic_mappings,
)
from tests.support.table_rows import NOW

# ----------------------------------------------------------------- rows.py


def test_mapping_rows_round_trip_through_the_store(tmp_path: Path) -> None:
    key = PartitionKey("persistent://t/ns/orders", 2)
    first = TopicMapping(
        SegmentSet.of([Segment(1, 0, 10, 0, 50, "identity"), Segment(2, 0, 10, 51, 10)]),
        skippable=Runs.of((10, 50, 1)), foreign=Runs.of((11, 0, 3)),
        unreplicated=Runs.of((1, 50, 2)),
    )
    later = TopicMapping(SegmentSet.of([Segment(2, 10, 10, 61, 5)]),  # continues segment 2
                         skippable=Runs.of((10, 50, 1)))  # a duplicate run
    store = open_store("delta-rs", str(tmp_path))
    kw = {"source_cluster": "A", "target_cluster": "B", "written_at": NOW}
    rows = mapping_rows(key, first, **kw)
    assert sorted(rows.column("kind").to_pylist()) == [
        "foreign", "segment", "segment", "skippable", "unreplicated"]
    store.append("mappings", rows, app_id="m", batch_id=0)
    store.append("mappings", mapping_rows(key, later, **kw), app_id="m", batch_id=1)
    store.append("mappings", mapping_rows(PartitionKey("other"), later, **kw),
                 app_id="m", batch_id=2)

    got = topic_mappings(store.read("mappings", RowFilter.of(topic=key.topic)))
    assert list(got) == [key]
    m = got[key]
    assert list(m.segments) == [Segment(1, 0, 10, 0, 50, "identity"), Segment(2, 0, 10, 51, 15)]
    assert m.skippable.rows.tolist() == [[10, 50, 1]]
    assert m.foreign.rows.tolist() == [[11, 0, 3]]
    assert m.unreplicated.rows.tolist() == [[1, 50, 2]]
    assert m.lookup(Position(2, 14)) == Position(10, 65)
    assert mapping_rows(key, TopicMapping(), **kw).num_rows == 0


def test_cursor_state_and_sync_progress_rows_round_trip(tmp_path: Path) -> None:
    key = PartitionKey("persistent://t/ns/orders", -1)
    state = CursorState.parse("7:4", "[(7:5..7:6],(7:8..7:9]]", Ledgers.of([(7, 50), (8, 3)]))
    observed = [ObservedCursor(key, "sub", state, NOW),
                ObservedCursor(key, "bare", CursorState.parse("7:9"), NOW)]
    store = open_store("delta-rs", str(tmp_path))
    store.append("cursor_states", cursor_state_rows(observed, source_cluster="A",
                                                    target_cluster="B"),
                 app_id="sync", batch_id=0)
    back = sorted(cursor_states(store.read("cursor_states")), key=lambda o: o.subscription)
    assert [o.subscription for o in back] == ["bare", "sub"]
    assert back[1].state.mark_delete == Position(7, 4)
    assert str(back[1].state.individually_deleted) == "[(7:5..7:6],(7:8..7:9]]"
    assert back[1].state.ledgers is not None
    assert back[1].state.ledgers.ids.tolist() == [7, 8]
    assert back[0].state.ledgers is None and not back[0].state.individually_deleted
    assert back[1].observed_at == NOW

    plan = AckPlan(
        mark_delete=Position(20, 9), individually_deleted=RangeSet.parse("[(20:10..20:12]]"),
        to_ack=RangeSet.parse("[(20:3..20:9],(20:10..20:12]]"),
        previous_mark_delete=Position(20, 3), unmapped_acked_entries=2, rewound_entries=0,
        partial_batches_unacked=1, skippable_acked_entries=1, outcome="partial",
    )
    record = SyncRecord(key, "sub", plan, acks_sent=2, dry_run=False,
                        source_observed_at=NOW, emitted_at=NOW + timedelta(milliseconds=1250))
    rows = sync_progress_rows([record], source_cluster="A", target_cluster="B")
    store.append("sync_progress", rows, app_id="sync", batch_id=0)
    r = store.read("sync_progress", RowFilter.of(topic=key.topic, subscription="sub")).to_pylist()
    assert len(r) == 1
    assert (r[0]["target_mark_delete_ledger"], r[0]["target_mark_delete_entry"]) == (20, 9)
    assert r[0]["acked_ranges"] == "[(20:3..20:9],(20:10..20:12]]"
    assert (r[0]["outcome"], r[0]["lag_ms"], r[0]["batch_id"]) == ("partial", 1250, 0)
    assert (r[0]["unmapped_acked_entries"], r[0]["partial_batches_unacked"]) == (2, 1)


EVIDENCES = ["identity", "position-property", "identity,snapshot"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3),  # partition
                          st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8),
                                             st.integers(1, 5), st.sampled_from(EVIDENCES)),
                                   max_size=3),
                          st.lists(st.tuples(st.sampled_from(
                              ["skippable", "foreign", "unreplicated", "unpaired", "anchor"]),
                              st.integers(0, 2), st.integers(0, 40), st.integers(1, 5)),
                              max_size=4),
                          st.integers(0, 5)),  # seconds after NOW
                min_size=1, max_size=8),
       st.randoms(use_true_random=False))
def test_topic_mappings_is_the_union_of_what_each_batch_wrote(
        batches: list[tuple[int, list[tuple[int, int, int, str]],
                            list[tuple[str, int, int, int]], int]],
        rnd: Any) -> None:
    """Rows of many batches and partitions, in any order, read back as the in-memory union
    of the mappings each batch wrote, per partition."""
    expected: dict[PartitionKey, TopicMapping] = {}
    tables = []
    for partition, segs, others, seconds in batches:
        key = PartitionKey("persistent://t/ns/x" + "ab"[partition % 2], partition)
        # One consistent correspondence (source l:e -> target l+10:e+3), so no two batches
        # disagree.
        runs: dict[str, list[tuple[int, int, int]]] = {}
        anchors = []
        for kind, ledger, entry, count in others:
            if kind == "anchor":
                anchors.append((ledger, entry, ledger + 10, entry + 3))
            else:
                runs.setdefault(kind, []).append((ledger, entry, count))
        # Segments are cells of a grid, 5 entries each, so batches repeat or continue each
        # other's segments (as retried and later batches do) but never cut one differently.
        cells = {(lg, cell): ev for lg, cell, _, ev in segs}
        mapping = TopicMapping(
            SegmentSet.of([Segment(lg, 5 * cell, lg + 10, 5 * cell + 3, 5, ev)
                           for (lg, cell), ev in cells.items()]),
            *(Runs().union(Runs.of(*runs.get(k, []))) for k in
              ("skippable", "foreign", "unreplicated")),
            written_at=(NOW + timedelta(seconds=seconds)).timestamp(),
            unpaired=Runs().union(Runs.of(*runs.get("unpaired", []))),
            anchors=Anchors(np.array(anchors, np.int64).reshape(-1, 4)))
        known = expected.get(key)
        expected[key] = mapping if known is None else known.union(mapping)
        tables.append(mapping_rows(key, mapping, source_cluster="A", target_cluster="B",
                                   written_at=NOW + timedelta(seconds=seconds)))
    rows = pa.concat_tables(tables)
    rows = rows.take(pa.array(rnd.sample(range(rows.num_rows), rows.num_rows), pa.int64()))
    got = topic_mappings(rows)
    shown = {k for k, m in expected.items() if mapping_rows(
        k, m, source_cluster="A", target_cluster="B", written_at=NOW).num_rows}
    assert set(got) == shown
    for key in shown:
        a, b = got[key], expected[key]
        # Compared collapsed: continuations join whichever batch wrote them.
        b_segments = SegmentSet.collapsed(b.segments.rows, b.segments.evidence_codes)
        assert list(a.segments) == list(b_segments)
        assert a.segments.evidence_codes.tolist() == b_segments.evidence_codes.tolist()
        for kind in ("skippable", "foreign", "unreplicated", "unpaired"):
            assert getattr(a, kind) == getattr(b, kind), kind
        assert a.anchors.rows.tolist() == b.anchors.rows.tolist()
        newest = max(NOW.timestamp() + s for p, sg, o, s in batches
                     if PartitionKey("persistent://t/ns/x" + "ab"[p % 2], p) == key
                     and (sg or o))
        assert a.written_at == newest


def test_topic_mappings_refuses_rows_that_disagree() -> None:
    key = PartitionKey("t")
    kw = {"source_cluster": "A", "target_cluster": "B", "written_at": NOW}
    rows = pa.concat_tables([
        mapping_rows(key, TopicMapping(SegmentSet.of([Segment(1, 0, 10, 0, 5)])), **kw),
        mapping_rows(key, TopicMapping(SegmentSet.of([Segment(2, 0, 10, 3, 5)])), **kw),
    ])
    with pytest.raises(MappingConflictError, match="overlap on the target"):
        topic_mappings(rows)


def _expected_rows(key: PartitionKey, m: TopicMapping,
                   live: tuple[int | None, int | None] | None) -> list[dict[str, Any]]:
    """One partition's rows listed one by one: the oracle of mappings_rows' columns."""
    base = {"topic": key.topic, "partition": key.partition, "source_cluster": "A",
            "target_cluster": "B", "written_at": NOW}
    out = [{**base, "kind": "segment", "source_ledger": s.source_ledger,
            "source_entry": s.source_entry, "target_ledger": s.target_ledger,
            "target_entry": s.target_entry, "count": s.count, "evidence": s.evidence}
           for s in m.segments]
    out += [{**base, "kind": "anchor", "source_ledger": a[0], "source_entry": a[1],
             "target_ledger": a[2], "target_entry": a[3], "count": 1, "evidence": "snapshot"}
            for a in m.anchors.rows.tolist()]
    for kind, side in (("skippable", "target"), ("foreign", "target"),
                       ("unreplicated", "source"), ("unpaired", "target")):
        other = "target" if side == "source" else "source"
        out += [{**base, "kind": kind, f"{side}_ledger": lg, f"{side}_entry": e,
                 f"{other}_ledger": None, f"{other}_entry": None, "count": n, "evidence": None}
                for lg, e, n in getattr(m, kind).rows.tolist()]
    if live is not None:
        out.append({**base, "kind": "live", "source_ledger": live[0], "source_entry": None,
                    "target_ledger": live[1], "target_entry": None, "count": 0,
                    "evidence": None})
    return out


_runs = st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(1, 9)),
                 max_size=3)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 9), st.sampled_from(EVIDENCES)),
             max_size=4, unique_by=lambda s: s[0]),
    st.lists(st.tuples(*[st.integers(0, 2**62)] * 4), max_size=2),
    st.tuples(_runs, _runs, _runs, _runs),
    st.one_of(st.none(), st.tuples(st.one_of(st.none(), st.integers(0, 2**62)),
                                   st.one_of(st.none(), st.integers(0, 2**62))))),
    max_size=6))
def test_mappings_rows_lists_every_partitions_rows_in_order(
        items: list[tuple[list[tuple[int, int, str]], list[tuple[int, int, int, int]],
                          tuple[list[tuple[int, int, int]], ...],
                          tuple[int | None, int | None] | None]]) -> None:
    """Many partitions' rows built column by column are each partition's rows, one by
    one, partition after partition as given: segments, anchors, each kind of run, live."""
    given_items = []
    for i, (segs, anchors, runs, live) in enumerate(items):
        mapping = TopicMapping(
            SegmentSet.of([Segment(7, 10 * cell, 2**50 + i, 10 * cell, n, ev)
                           for cell, n, ev in segs]),
            *(Runs().union(Runs.of(*r)) for r in runs[:3]),
            unpaired=Runs().union(Runs.of(*runs[3])),
            anchors=Anchors(np.array(anchors, np.int64).reshape(-1, 4)))
        given_items.append((PartitionKey(f"persistent://t/ns/x{i % 2}", i), mapping, live))
    got = mappings_rows(given_items, source_cluster="A", target_cluster="B", written_at=NOW)
    expected = [r for item in given_items for r in _expected_rows(*item)]
    assert got.to_pylist() == expected
    assert got.schema == mapping_rows(PartitionKey("t"), TopicMapping(), source_cluster="A",
                                      target_cluster="B", written_at=NOW).schema
