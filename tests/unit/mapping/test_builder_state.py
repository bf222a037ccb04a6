"""The mapping builder's per-partition state as the sink keeps it with each batch: every
field survives its file, a version 1 document still loads, and a batch's rows are split
by partition in their order."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.alignment import NO_STREAM, NO_TIME, Memory
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.builder_state import (
    PartitionState,
    Pending,
    json_parts,
    read_state,
    state_parts,
    state_table,
    write_state,
)
from cursorsync.mapping.columns import partition_sides

_ids = st.integers(-1, 2**62)
_positions = st.one_of(st.none(), st.builds(Position, _ids, _ids))


@st.composite
def _pending(draw: st.DrawFn) -> Pending:
    n = draw(st.integers(0, 4))
    return Pending(draw(st.lists(_ids, min_size=n, max_size=n)),
                   draw(st.lists(_ids, min_size=n, max_size=n)),
                   draw(st.lists(st.binary(max_size=16), min_size=n, max_size=n)),
                   draw(st.lists(st.integers(-1, 2**62), min_size=n, max_size=n)),
                   draw(st.lists(st.integers(-1, 2**50), min_size=n, max_size=n)))


_digests = st.binary(min_size=16, max_size=16)
_memories = st.one_of(st.just(Memory()), st.builds(
    Memory, st.dictionaries(st.integers(-1, 2**62), st.tuples(
        st.integers(0, 2**50), st.frozensets(_digests, min_size=1, max_size=3)), max_size=4),
    st.one_of(st.none(), st.integers(-1, 2**50)), st.frozensets(_digests, max_size=3),
    st.booleans()))


_states = st.builds(
    PartitionState, _positions, _pending(), _pending(), _positions,
    st.floats(0, 2e9, allow_nan=False),
    st.one_of(st.just(PartitionState().unchecked), st.lists(
        st.tuples(_ids, _ids, st.integers(1, 64)), min_size=1, max_size=3).map(
            lambda rows: Runs(np.array(rows, np.int64)))),
    st.sets(st.tuples(_ids, _ids), max_size=3), _memories)
_keys = st.builds(PartitionKey, st.sampled_from(["persistent://t/n/a", "persistent://t/n/b",
                                                 "persistent://t/n/ü"]), st.integers(-1, 3))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, _states, max_size=6))
def test_every_field_survives_the_state_file(parts: dict[PartitionKey, PartitionState],
                                             ) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "builder-0.arrow"
        write_state(path, state_table(parts))
        assert state_parts(read_state(path)) == parts
        assert [p.name for p in Path(tmp).iterdir()] == ["builder-0.arrow"]


def test_a_version_1_document_still_loads() -> None:
    """What the sink wrote before the state was a file of columns: a restart after an
    upgrade replays its next batch from it."""
    doc = {"version": 1, "partitions": [{
        "topic": "persistent://t/n/a", "partition": 2, "last_target": "9:4",
        "last_source": None, "watch_until": 12.5,
        "target": {"ledger": [9], "entry": [3], "digest": ["00ff"]},
        "source": {"ledger": [], "entry": [], "digest": []},
        "unchecked": [[9, 5, 2]], "probes": [[9, 7]]}]}
    assert json_parts(doc) == {PartitionKey("persistent://t/n/a", 2): PartitionState(
        Position(9, 4), Pending([9], [3], [b"\x00\xff"]), Pending(), None, 12.5,
        Runs(np.array([[9, 5, 2]], np.int64)), {(9, 7)})}
    with pytest.raises(ValueError, match="delete the checkpoint's builder-state"):
        json_parts({"version": 7, "partitions": []})


def test_a_state_of_another_version_is_refused() -> None:
    table = state_table({PartitionKey("t", 0): PartitionState()})
    with pytest.raises(ValueError, match="version '1' is not 3; delete the checkpoint's"):
        state_parts(table.replace_schema_metadata({"version": "1"}))


def test_a_version_2_state_still_loads_without_streams_or_memory() -> None:
    """Version 2 kept no producer stream, publish time or given-up digest: its waiting
    entries load with none known (they order as one stream, and are older than any
    horizon), and nothing is taken as given up."""
    key = PartitionKey("persistent://t/n/a", 0)
    state = PartitionState(Position(9, 4), Pending([9], [3], [b"d" * 16]))
    v3 = state_table({key: state})
    v2 = v3.select([n for n in v3.column_names if n not in (
        "target_stream", "target_publish", "source_stream", "source_publish",
        "memory_stream", "memory_mark", "memory_digests", "horizon", "untimed", "blind")])
    loaded = state_parts(v2.replace_schema_metadata({"version": "2"}))[key]
    assert loaded == state
    waiting = loaded.target.waiting()
    assert (waiting.stream.tolist(), waiting.publish.tolist()) == ([NO_STREAM], [NO_TIME])
    assert loaded.memory == Memory()


def test_the_shared_empty_runs_cannot_be_written_to() -> None:
    """Every partition without skipped ids waiting shares one empty Runs."""
    a, b = PartitionState(), PartitionState()
    assert a.unchecked is b.unchecked
    with pytest.raises(ValueError):
        a.unchecked.rows[...] = 1


_rows = st.lists(st.tuples(st.sampled_from(["x", "y", "z"]), st.integers(-1, 2),
                           st.sampled_from(["a", "b", "c"]), st.integers(0, 3),
                           st.integers(0, 1000)), max_size=30, unique_by=lambda r: r)


@settings(max_examples=300, deadline=None)
@given(_rows)
def test_partition_sides_are_a_filter_per_partition_and_cluster(
        items: list[tuple[str, int, str, int, int]]) -> None:
    """Each partition's target (b) and source (a) rows, by position, as a filter of the
    whole table per partition and cluster would give them; another cluster's (c) left out."""
    table = pa.table({"topic": [r[0] for r in items],
                      "partition": pa.array([r[1] for r in items], pa.int32()),
                      "cluster": [r[2] for r in items],
                      "ledger": pa.array([r[3] for r in items], pa.int64()),
                      "entry": pa.array([r[4] for r in items], pa.int64()),
                      "entry_identity": pa.array([bytes([r[4] % 256]) for r in items]),
                      "source_position": pa.array([None] * len(items), pa.string())})
    got = {key: (target.ledger.tolist(), target.entry.tolist(), target.digests,
                 source.ledger.tolist(), source.entry.tolist())
           for key, target, source in partition_sides(table, "b", "a")}
    want = {}
    for topic, partition in {(r[0], r[1]) for r in items}:
        def side(cluster: str, topic: str = topic, partition: int = partition
                 ) -> list[tuple[int, int]]:
            return sorted((r[3], r[4]) for r in items
                          if (r[0], r[1], r[2]) == (topic, partition, cluster))
        target, source = side("b"), side("a")
        want[PartitionKey(topic, partition)] = (
            [lg for lg, _ in target], [e for _, e in target], [bytes([e % 256]) for _, e in target],
            [lg for lg, _ in source], [e for _, e in source])
    assert got == want


def test_partitions_share_only_what_cannot_change() -> None:
    """Idle partitions share their empty pending entries and probes; one partition's
    entries never reach another's."""
    a, b = PartitionState(), PartitionState()
    a.target.extend(np.array([9]), np.array([1]), [b"x"])
    a.probes = a.probes | {(9, 2)}
    assert (len(a.target), len(b.target), b.target.ledger, b.probes) == (1, 0, (), frozenset())
    with pytest.raises(AttributeError):
        b.probes.add((9, 3))  # type: ignore[attr-defined]


def test_a_state_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    path = tmp_path / "builder-7.arrow"
    path.write_bytes(b"not arrow")
    with pytest.raises(ValueError, match=f"builder state {path} cannot be read .*delete it"):
        read_state(path)
