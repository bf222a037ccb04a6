"""The sync lag split by stage (cursorsync_devtools.testbed.lag_stages): worked examples
with every time known, so each stage's figure is checked to the second."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from cursorsync.core.positions import Position
from cursorsync_devtools.testbed.lag_stages import (
    EntryTimes,
    entry_times,
    figures,
    figures_by_window,
    stages,
)
from cursorsync_devtools.testbed.workload import Produced, WorkloadResult, WorkloadSpec

TOPIC = "persistent://t/ns/live"
PART = f"{TOPIC}-partition-0"
SUB = "sync-shared"
T0 = 1_800_000_000.0


def at(s: float) -> datetime:
    return datetime.fromtimestamp(T0 + s, UTC)


def test_the_stages_add_up_to_the_lag_and_mapping_counts_only_when_it_came_later() -> None:
    t = EntryTimes(acked=np.array([0.0, 0.0, 0.0]), observed=np.array([1.0, 1.0, np.nan]),
                   mapped=np.array([0.5, 3.0, 1.0]), emitted=np.array([2.0, 4.0, 2.0]),
                   covered=np.array([2.5, 4.25, 3.0]))
    got = stages(t)
    # The third entry was never observed: it has no split at all.
    assert got["source poll"].tolist() == [1.0, 1.0]
    assert got["mapping"].tolist() == [0.0, 2.0]
    assert got["sync"].tolist() == [1.0, 1.0]
    assert got["target"].tolist() == [0.5, 0.25]
    total = sum(got.values(), np.zeros(2))
    assert total.tolist() == (t.covered - t.acked)[:2].tolist()
    f = figures(t)
    assert f["entries"] == 3 and f["with_every_time"] == 2
    assert f["lag"]["p50_s"] == 3.375


def test_the_stages_of_a_topics_first_seconds_and_of_the_rest_apart() -> None:
    t = EntryTimes(acked=np.array([0.0, 5.0, 12.0]), observed=np.array([1.0, 6.0, 12.5]),
                   mapped=np.array([4.0, 6.0, 12.0]), emitted=np.array([5.0, 7.0, 13.0]),
                   covered=np.array([5.5, 7.5, 13.5]))
    got = figures_by_window(t, 0.0, 10)
    assert list(got) == ["first 10 s", "after 10 s"]
    first, after = got["first 10 s"], got["after 10 s"]
    assert first["entries"] == 2 and after["entries"] == 1
    assert first["mapping"]["p99_s"] > 2.9 and after["mapping"]["p99_s"] == 0.0
    assert after["lag"]["p50_s"] == 1.5


def _result() -> WorkloadResult:
    msgs = [Produced(PART, f"k{i}", Position(5, i), -1, 0) for i in range(3)]
    result = WorkloadResult(WorkloadSpec(partitioned_topic="live", partitions=1,
                                         chunked_topic=None), messages=msgs)
    # k2 is never acked on a: it has no lag to split.
    result.acked[SUB] = {"k0": T0 + 0.0, "k1": T0 + 0.2}
    return result


def test_each_step_time_is_the_first_row_covering_the_entry() -> None:
    on_b = {"k0": Position(9, 10), "k1": Position(9, 11), "k2": Position(9, 12)}
    states = pa.Table.from_pylist([
        # k0 individually acked first; then the markDeletePosition moves past both.
        {"topic": TOPIC, "partition": 0, "subscription": SUB, "mark_delete_ledger": 5,
         "mark_delete_entry": -1, "individually_deleted": "[(5:-1..5:0]]",
         "observed_at": at(0.5)},
        {"topic": TOPIC, "partition": 0, "subscription": SUB, "mark_delete_ledger": 5,
         "mark_delete_entry": 1, "individually_deleted": "[]", "observed_at": at(1.5)},
        {"topic": TOPIC, "partition": 0, "subscription": "other", "mark_delete_ledger": 5,
         "mark_delete_entry": 9, "individually_deleted": "[]", "observed_at": at(0.1)},
    ])
    mappings = pa.Table.from_pylist([
        {"topic": TOPIC, "partition": 0, "kind": "segment", "source_ledger": 5,
         "source_entry": 0, "count": 1, "written_at": at(0.25)},
        {"topic": TOPIC, "partition": 0, "kind": "segment", "source_ledger": 5,
         "source_entry": 1, "count": 2, "written_at": at(2.0)},
        {"topic": TOPIC, "partition": 0, "kind": "skippable", "source_ledger": None,
         "source_entry": None, "count": 5, "written_at": at(0.0)},
    ])
    progress = pa.Table.from_pylist([
        {"topic": TOPIC, "partition": 0, "subscription": SUB, "target_mark_delete_ledger": 9,
         "target_mark_delete_entry": 9, "acked_ranges": "[(9:9..9:10]]", "dry_run": False,
         "emitted_at": at(1.0)},
        {"topic": TOPIC, "partition": 0, "subscription": SUB, "target_mark_delete_ledger": 9,
         "target_mark_delete_entry": 11, "acked_ranges": "[]", "dry_run": True,
         "emitted_at": at(2.1)},
        {"topic": TOPIC, "partition": 0, "subscription": SUB, "target_mark_delete_ledger": 9,
         "target_mark_delete_entry": 11, "acked_ranges": "[]", "dry_run": False,
         "emitted_at": at(3.0)},
    ])
    changes = {(PART, SUB): [(T0 + 1.2, "9:9", "[(9:9..9:10]]"), (T0 + 3.5, "9:11", "[]")]}
    t = entry_times(_result(), SUB, on_b, changes, states, mappings, progress)
    assert np.allclose(t.acked - T0, [0.0, 0.2])
    assert np.allclose(t.observed - T0, [0.5, 1.5])
    assert np.allclose(t.mapped - T0, [0.25, 2.0])
    # The dry run's row acked nothing: k1's emission is the later real one.
    assert np.allclose(t.emitted - T0, [1.0, 3.0])
    assert np.allclose(t.covered - T0, [1.2, 3.5])
    got = stages(t)
    assert np.allclose(got["source poll"], [0.5, 1.3])
    assert np.allclose(got["mapping"], [0.0, 0.5])
    assert np.allclose(got["sync"], [0.5, 1.0])
    assert np.allclose(got["target"], [0.2, 0.5])
