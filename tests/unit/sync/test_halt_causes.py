"""Each halt names its cause, in the halts table and in cursorsync_halted_partitions: a
source that moved back, a source topic created again, a target reset back, a first sync
over older copies. Run with the real sync sink and step on a Delta table."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from cursorsync.app.metrics import Metrics
from cursorsync.app.queries import sync_sink_settings
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.records import RewindPolicy
from cursorsync.pulsar.admin import TopicCreation
from cursorsync.sync.halts import (
    HaltCause,
    cause_of,
    halt_cause,
    read_halt_causes,
    resume,
)
from cursorsync.sync.sink import SyncSink
from cursorsync.tables import TableStore
from tests.support.metrics_text import sample
from tests.support.sink_world import (
    KEY,
    T0,
    RecordingEmitter,
    new_sink,
    polled,
    sink_config,
    store_with_mapping,
)

CLUSTERS: dict[str, Any] = {"source_cluster": "A", "target_cluster": "B"}
TARGET_LEDGERS = Ledgers.of([(7, 20)])


def _state(mark_delete: str, ledgers: list[tuple[int, int]], acked: str = "[]"
           ) -> CursorState:
    return CursorState.parse(mark_delete, acked, Ledgers.of(ledgers))


# --------------------------------------------------------------------------- judged


@pytest.mark.parametrize(("current", "previous", "policy", "cause"), [
    # The markDeletePosition moved back (resetcursor, seek).
    (_state("5:4", [(5, 20)]), _state("5:9", [(5, 20)]), "halt", "source_rewind"),
    # Individual acks gone, the markDeletePosition where it was (acks the broker lost).
    (_state("5:4", [(5, 20)]), _state("5:4", [(5, 20)], "[(5:6..5:9]]"), "halt",
     "source_rewind"),
    # Ledger 5 gone with 5:5.. unacked, the cursor on a new ledger.
    (_state("9:-1", [(9, 0)]), _state("5:4", [(5, 20)]), "halt", "topic_recreated"),
    (_state("9:-1", [(9, 0)]), _state("5:4", [(5, 20)]), "report", "topic_recreated"),
    # The source as it was, or further on: what changed is the target's.
    (_state("9:3", [(9, 5)]), _state("9:2", [(9, 5)]), "halt", "target_reset"),
    # Under rewind_policy report a rewind halts nothing: the halt was the target's copies.
    (_state("5:4", [(5, 20)]), _state("5:9", [(5, 20)]), "report", "target_reset"),
    (_state("9:-1", [(9, 0)]), None, "halt", "first_sync"),
    (None, _state("5:4", [(5, 20)]), "halt", "unknown"),
])
def test_the_cause_is_judged_on_the_source_now_and_before(
        current: CursorState | None, previous: CursorState | None, policy: RewindPolicy,
        cause: str) -> None:
    assert halt_cause(current, previous, rewind_halts=policy == "halt") == cause


def test_the_cause_is_read_back_from_the_reason() -> None:
    for cause in HaltCause:
        assert cause_of(f"{cause}: anything after it") is cause
    # A halt recorded before causes were (or a resume's reason) names none.
    assert cause_of("the source cursor moved back over or lost 5 entries (a rewind, or "
                    "ledgers gone: deleted and created again?)") is HaltCause.UNKNOWN
    assert cause_of("resumed by an operator") is HaltCause.UNKNOWN
    assert cause_of("") is HaltCause.UNKNOWN


# --------------------------------------------------------------------------- recorded


def _sink(tmp_path: Path, store: TableStore, target: list[CursorState], metrics: Metrics,
          created: TopicCreation | None = None) -> SyncSink:
    """new_sink, recording into ``metrics``."""
    sink = new_sink(sink_config(tmp_path), store, RecordingEmitter(), target,
                    None if created is None else (lambda t: created))
    return SyncSink(sync_sink_settings(sink_config(tmp_path)), store, sink.step, metrics)


def _halted(metrics: Metrics, cause: str) -> float | None:
    return sample(metrics, "cursorsync_halted_partitions", subscription="billing", cause=cause)


def test_a_source_rewind_is_recorded_and_shown_until_resumed_across_a_restart(
        tmp_path: Path) -> None:
    store = store_with_mapping(sink_config(tmp_path))
    target = [CursorState(Position(7, -1), ledgers=TARGET_LEDGERS)]
    metrics = Metrics()
    sink = _sink(tmp_path, store, target, metrics)
    sink(polled("5:9", T0), 0)
    assert read_halt_causes(store, **CLUSTERS) == {}
    assert _halted(metrics, "source_rewind") is None
    target[0] = CursorState(Position(7, 9), ledgers=TARGET_LEDGERS)
    sink(polled("5:4", T0 + timedelta(seconds=1)), 1)
    assert read_halt_causes(store, **CLUSTERS) == {(KEY, "billing"): HaltCause.SOURCE_REWIND}
    (row,) = store.read("halts").to_pylist()
    assert row["reason"].startswith("source_rewind: the source cursor moved back over 5 ")
    assert _halted(metrics, "source_rewind") == 1
    # A restart: a new process's metrics show the halt from the table at its first batch.
    after = Metrics()
    restarted = _sink(tmp_path, store, target, after)
    restarted(polled("5:12", T0 + timedelta(seconds=2)), 2)
    assert _halted(after, "source_rewind") == 1
    resume(store, topic=KEY.topic, subscription="billing", **CLUSTERS)
    restarted(polled("5:13", T0 + timedelta(seconds=3)), 3)
    assert _halted(after, "source_rewind") == 0


def test_a_source_topic_created_again_is_its_own_cause(tmp_path: Path) -> None:
    store = store_with_mapping(sink_config(tmp_path))
    target = [CursorState(Position(7, -1), ledgers=TARGET_LEDGERS)]
    metrics = Metrics()
    created = TopicCreation("2026-11-24T00:00:02Z", (9,))
    sink = _sink(tmp_path, store, target, metrics, created)
    sink(polled("5:4", T0), 0)
    target[0] = CursorState(Position(7, 4), ledgers=TARGET_LEDGERS)
    sink(polled("9:-1", T0 + timedelta(seconds=3), ledgers=((9, 0),)), 1)
    assert read_halt_causes(store, **CLUSTERS) == {(KEY, "billing"): HaltCause.TOPIC_RECREATED}
    assert _halted(metrics, "topic_recreated") == 1
    assert _halted(metrics, "source_rewind") is None


def test_a_target_reset_back_past_the_sources_ledgers_is_the_targets_cause(
        tmp_path: Path) -> None:
    """Source ledger 5 (mapped to target 7) is trimmed; the target has 7:0..7:19 acked. An
    operator resets the target cursor back to its start: the target holds unacked copies of
    entries older than any ledger the source lists, and the sync halts, not for the source."""
    store = store_with_mapping(sink_config(tmp_path))
    target = [CursorState(Position(7, 19), ledgers=TARGET_LEDGERS)]
    metrics = Metrics()
    sink = _sink(tmp_path, store, target, metrics)
    sink(polled("9:1", T0, ledgers=((9, 5),)), 0)
    sink(polled("9:2", T0 + timedelta(seconds=1), ledgers=((9, 5),)), 1)
    assert read_halt_causes(store, **CLUSTERS) == {}
    target[0] = CursorState(Position(7, -1), ledgers=TARGET_LEDGERS)
    sink(polled("9:3", T0 + timedelta(seconds=2), ledgers=((9, 5),)), 2)
    assert read_halt_causes(store, **CLUSTERS) == {(KEY, "billing"): HaltCause.TARGET_RESET}
    assert _halted(metrics, "target_reset") == 1


def test_a_first_sync_over_older_copies_is_its_own_cause(tmp_path: Path) -> None:
    store = store_with_mapping(sink_config(tmp_path))
    target = [CursorState(Position(7, -1), ledgers=TARGET_LEDGERS)]
    metrics = Metrics()
    _sink(tmp_path, store, target, metrics)(polled("9:-1", T0, ledgers=((9, 0),)), 0)
    assert read_halt_causes(store, **CLUSTERS) == {(KEY, "billing"): HaltCause.FIRST_SYNC}
    assert _halted(metrics, "first_sync") == 1
