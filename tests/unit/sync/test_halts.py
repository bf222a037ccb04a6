"""A halt after a source rewind lasts: across batches, restarts and both emission modes,
until `cursorsync resume` clears it. Run with the real sync sink and a Delta table."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cursorsync.app.cli import app
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.records import RewindPolicy
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.errors import AdminUnavailableError
from cursorsync.pulsar.admin import TopicCreation
from cursorsync.sync.halts import NothingHaltedError, read_halts, resume
from cursorsync.tables import TableStore, open_store
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


def _outcome(store: TableStore, batch_id: int) -> str:
    rows = store.read("sync_progress").to_pylist()
    return next(r["outcome"] for r in rows if r["batch_id"] == batch_id)


def test_a_halt_holds_across_batches_and_restarts_until_resumed(tmp_path: Path) -> None:
    config = sink_config(tmp_path)
    store = open_store("delta-rs", config.tables.path)
    store.ensure_all()
    store.append("mappings", mapping_rows(KEY, TopicMapping(SegmentSet.of(
        [Segment(5, 0, 7, 0, 20)])), source_cluster="A", target_cluster="B", written_at=T0),
        app_id="m", batch_id=0)
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    emitter = RecordingEmitter()
    clusters: dict[str, Any] = {"source_cluster": "A", "target_cluster": "B"}

    sink = new_sink(config, store, emitter, target)
    sink(polled("5:9", T0), 0)
    assert _outcome(store, 0) == "exact" and len(emitter.sent) == 1
    target[0] = CursorState(Position(7, 9), ledgers=Ledgers.of([(7, 20)]))
    # The source moves back: halted, and recorded as a halt.
    sink(polled("5:4", T0 + timedelta(seconds=1)), 1)
    assert _outcome(store, 1) == "halted" and len(emitter.sent) == 1
    assert read_halts(store, **clusters) == {(KEY, "billing")}
    # The source moves on: still halted (the next batch does not forget).
    sink(polled("5:12", T0 + timedelta(seconds=2)), 2)
    assert _outcome(store, 2) == "halted" and len(emitter.sent) == 1
    # A restart: a new sink and step, nothing in memory; still halted.
    restarted = new_sink(config, store, emitter, target)
    restarted(polled("5:13", T0 + timedelta(seconds=3)), 3)
    assert _outcome(store, 3) == "halted" and len(emitter.sent) == 1
    # The operator resumes; the next batch syncs again.
    with pytest.raises(NothingHaltedError, match="nothing is halted"):
        resume(store, topic=KEY.topic, subscription="other", **clusters)
    (cleared,) = resume(store, topic=KEY.concrete_topic(), subscription="billing", **clusters)
    assert cleared.key == KEY and not cleared.halted
    assert read_halts(store, **clusters) == set()
    restarted(polled("5:14", T0 + timedelta(seconds=4)), 4)
    assert _outcome(store, 4) == "exact" and len(emitter.sent) == 2


def test_a_rewind_during_a_restart_is_still_seen(tmp_path: Path) -> None:
    """The previous state comes from cursor_states after a start, not from memory."""
    config = sink_config(tmp_path)
    store = open_store("delta-rs", config.tables.path)
    store.ensure_all()
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    new_sink(config, store, RecordingEmitter(), target)(polled("5:9", T0), 0)
    new_sink(config, store, RecordingEmitter(), target)(polled("5:2", T0 + timedelta(seconds=1)), 1)
    assert _outcome(store, 1) == "halted"


@pytest.mark.parametrize("policy", ["halt", "report"])
def test_a_source_topic_created_again_halts_whatever_the_policy(
        tmp_path: Path, policy: RewindPolicy) -> None:
    """Deleted and created again, the source topic is on a new ledger and its cursor's
    markDeletePosition covers the old ledger, where 5:5..5:19 were never acked: the topic
    owns no ledger as old as 5 now, so their copies on the target stay unacked, and the halt
    lasts across a restart."""
    config = sink_config(tmp_path)
    store = store_with_mapping(config)
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    emitter = RecordingEmitter()
    created = [TopicCreation("2026-10-25T00:00:00Z", (4, 5))]
    sink = new_sink(config, store, emitter, target, lambda t: created[0], policy)
    sink(polled("5:4", T0), 0)
    assert _outcome(store, 0) == "exact" and len(emitter.sent) == 1
    target[0] = CursorState(Position(7, 4), ledgers=Ledgers.of([(7, 20)]))

    created[0] = TopicCreation("2026-11-24T00:00:02Z", (9,))
    sink(polled("9:-1", T0 + timedelta(seconds=3), ledgers=((9, 0),)), 1)
    assert _outcome(store, 1) == "halted" and len(emitter.sent) == 1
    assert read_halts(store, source_cluster="A", target_cluster="B") == {(KEY, "billing")}
    (row,) = [r for r in store.read("sync_progress").to_pylist() if r["batch_id"] == 1]
    assert row["rewound_entries"] == 15
    restarted = new_sink(config, store, emitter, target, lambda t: created[0], policy)
    restarted(polled("9:3", T0 + timedelta(seconds=4), ledgers=((9, 8),)), 2)
    assert _outcome(store, 2) == "halted" and len(emitter.sent) == 1


def test_ledgers_trimmed_after_their_entries_were_acked_go_on(tmp_path: Path) -> None:
    """The same observations, but the source topic owns a ledger older than ledger 5 (a
    cursor's, 3): ledger 5 was its own and went by trimming, once its entries were acked,
    so the sync follows. No clock is asked."""
    config = sink_config(tmp_path)
    store = store_with_mapping(config)
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    emitter = RecordingEmitter()
    sink = new_sink(config, store, emitter, target,
                    lambda t: TopicCreation("2026-11-23T00:00:00Z", (3, 9)))
    sink(polled("5:4", T0), 0)
    target[0] = CursorState(Position(7, 4), ledgers=Ledgers.of([(7, 20)]))
    sink(polled("9:-1", T0 + timedelta(seconds=3), ledgers=((9, 0),)), 1)
    assert _outcome(store, 1) == "exact" and len(emitter.sent) == 2
    assert emitter.sent[1].plan.mark_delete == Position(7, 19)


def test_when_the_source_cannot_say_nothing_is_sent_and_the_evidence_stays(
        tmp_path: Path) -> None:
    config = sink_config(tmp_path)
    store = store_with_mapping(config)
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    emitter = RecordingEmitter()
    answer: list[TopicCreation | Exception] = [TopicCreation("2026-11-23T00:00:00Z", (4, 5))]

    def created_at(topic: str) -> TopicCreation:
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    sink = new_sink(config, store, emitter, target, created_at)
    sink(polled("5:4", T0), 0)
    target[0] = CursorState(Position(7, 4), ledgers=Ledgers.of([(7, 20)]))
    answer[0] = AdminUnavailableError("cluster A: internal-info failed after 3 attempts")
    sink(polled("9:-1", T0 + timedelta(seconds=3), ledgers=((9, 0),)), 1)
    assert len(emitter.sent) == 1
    assert not [r for r in store.read("sync_progress").to_pylist() if r["batch_id"] == 1]
    # The next answer still compares with the observation before the topic went.
    answer[0] = TopicCreation("2026-11-24T00:00:02Z", (9,))
    sink(polled("9:2", T0 + timedelta(seconds=4), ledgers=((9, 5),)), 2)
    assert _outcome(store, 2) == "halted" and len(emitter.sent) == 1


def test_without_a_way_to_ask_vanished_unacked_entries_are_not_acked(tmp_path: Path) -> None:
    config = sink_config(tmp_path)
    store = store_with_mapping(config)
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    emitter = RecordingEmitter()
    sink = new_sink(config, store, emitter, target, None)
    sink(polled("5:4", T0), 0)
    sink(polled("9:-1", T0 + timedelta(seconds=3), ledgers=((9, 0),)), 1)
    assert _outcome(store, 1) == "halted" and len(emitter.sent) == 1


def test_resume_from_the_command_line(tmp_path: Path) -> None:
    config = sink_config(tmp_path)
    path = tmp_path / "config.yaml"
    data = config.model_dump(mode="json", exclude_none=True, by_alias=True)
    path.write_text(yaml.safe_dump(data))
    store = open_store("delta-rs", config.tables.path)
    store.ensure_all()
    runner = CliRunner()
    args = ["resume", "-c", str(path), "--topic", KEY.topic, "--subscription", "billing"]
    nothing = runner.invoke(app, args)
    assert nothing.exit_code == 2 and "nothing is halted" in nothing.stderr
    target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
    sink = new_sink(config, store, RecordingEmitter(), target)
    sink(polled("5:9", T0), 0)
    sink(polled("5:2", T0 + timedelta(seconds=1)), 1)
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == f"resumed {KEY.concrete_topic()} billing"


def test_previous_states_read_recent_batches_and_history_only_when_needed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Executors look up each cursor's previous state every batch: the last few batches
    hold it, and the whole history is read only for a cursor that is not in them."""
    from cursorsync.core.records import ObservedCursor
    from cursorsync.sync import observed
    from cursorsync.tables.rows import cursor_state_rows

    monkeypatch.setattr(observed, "RECENT_BATCHES", 3)
    store = open_store("delta-rs", str(tmp_path / "tables"))
    clusters: dict[str, Any] = {"source_cluster": "A", "target_cluster": "B"}

    def seen(sub: str, md: str, batch: int) -> ObservedCursor:
        return ObservedCursor(KEY, sub, CursorState.parse(md), T0 + timedelta(seconds=batch))

    for batch in range(10):
        rows = [seen("busy", f"5:{batch}", batch)] + ([seen("quiet", "5:2", batch)]
                                                       if batch == 1 else [])
        store.append("cursor_states", cursor_state_rows(rows, **clusters), app_id="s",
                     batch_id=batch)
    reads: list[Any] = []
    read = store.read
    monkeypatch.setattr(store, "read", lambda t, f=None, **kw: reads.append(f) or read(t, f, **kw))

    prev = observed.previous_states(store, [seen("busy", "5:20", 10)], 10, **clusters)
    assert prev[(KEY, "busy")].state.mark_delete == Position(5, 9)
    assert [f.min_batch_id for f in reads] == [7]
    reads.clear()
    prev = observed.previous_states(store, [seen("busy", "5:20", 10), seen("quiet", "5:3", 10),
                                            seen("new", "5:0", 10)], 10, **clusters)
    assert prev[(KEY, "busy")].state.mark_delete == Position(5, 9)
    assert prev[(KEY, "quiet")].state.mark_delete == Position(5, 2)
    assert (KEY, "new") not in prev
    assert [f.min_batch_id for f in reads] == [7, None]
