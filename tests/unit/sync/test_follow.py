"""The sync follows the mapping: a sync batch that leaves acked source entries unmapped
waits for the mapping, and the mapping's next commit asks for a poll."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from cursorsync import wake
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.sync.follow import FollowMapping
from cursorsync.tables.rows import mapping_rows
from tests.support.sink_world import (
    KEY,
    T0,
    RecordingEmitter,
    new_sink,
    polled,
    sink_config,
    store_with_mapping,
)


def test_a_batch_with_acked_entries_not_mapped_yet_waits_for_the_mapping(
        tmp_path: Path) -> None:
    config = sink_config(tmp_path)
    store = store_with_mapping(config)  # source 5:0..5:19 mapped
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    sink = new_sink(config, store, RecordingEmitter(), target)
    path = tmp_path / "sync-wake"
    follow = FollowMapping(path, lambda: sink.waits_on_mapping)
    sink(polled("5:9", T0), 0)
    assert not sink.waits_on_mapping
    follow.mapping_committed()
    assert wake.requested(path) == 0
    # Acks past the mapping: 6:0..6:3 are not mapped yet.
    sink(polled("6:3", T0 + timedelta(seconds=1), ledgers=((5, 20), (6, 10))), 1)
    assert sink.waits_on_mapping
    follow.mapping_committed()
    follow.mapping_committed()
    assert wake.requested(path) == 2  # each commit while it waits asks again
    # The mapping catches up: the next batch waits for nothing.
    store.append("mappings", mapping_rows(KEY, TopicMapping(SegmentSet.of(
        [Segment(5, 0, 7, 0, 20), Segment(6, 0, 8, 0, 10)])), source_cluster="A",
        target_cluster="B", written_at=T0), app_id="m", batch_id=1)
    target[0] = CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20), (8, 10)]))
    sink(polled("6:3", T0 + timedelta(seconds=2), ledgers=((5, 20), (6, 10))), 2)
    assert not sink.waits_on_mapping
    rows = store.read("sync_progress", columns=["batch_id", "outcome"]).to_pylist()
    assert [r["outcome"] for r in sorted(rows, key=lambda r: r["batch_id"])] == [
        "exact", "partial", "exact"]
