"""The job's pieces, most without Spark: cursor rows, incremental mapping loads, empty batches,
the mapping sink; and what the job asks of Spark's checkpoints on a restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.mapping.builder_state import json_parts, read_state, state_parts
from cursorsync.mapping.sink import STATE_FILES_KEPT
from cursorsync.sync.observed import Observations, observations
from cursorsync.tables import open_store
from cursorsync.tables.mappings_table import MappingStore
from cursorsync.tables.rows import mapping_rows, row_schema

KEY = PartitionKey("persistent://public/default/orders", 2)


def test_cursor_rows_become_observed_states() -> None:
    rows = pa.Table.from_pylist([{
        "cluster": "A", "topic": KEY.topic, "partition": 2, "subscription": "billing",
        "mark_delete": "5:3", "individually_deleted": "[(5:4..5:6], (5:8..5:9]]",
        "ledgers": [{"ledger_id": 5, "entries": 12}],
        "observed_at": datetime(2026, 1, 1, 12, 0, 0), "messages_consumed_counter": 9,
    }])
    (obs,) = observations(rows)
    assert obs.key == KEY and obs.subscription == "billing"
    assert obs.state.mark_delete == Position(5, 3)
    assert str(obs.state.individually_deleted) == "[(5:4..5:6],(5:8..5:9]]"
    assert obs.state.ledgers is not None and obs.state.ledgers.entries.tolist() == [12]
    assert obs.observed_at.tzinfo is UTC
    assert obs.checked_at is None and obs.confirmed_at == obs.observed_at  # no column: read


def test_mapping_store_loads_only_new_batches_and_merges(tmp_path: Path) -> None:
    store = open_store("delta-rs", str(tmp_path))
    store.ensure_all()
    now = datetime.now(UTC)

    def write(batch: int, m: TopicMapping) -> None:
        rows = mapping_rows(KEY, m, source_cluster="A", target_cluster="B", written_at=now)
        assert store.append("mappings", rows, app_id="mapping", batch_id=batch)

    ms = MappingStore(store, "A", "B")
    write(0, TopicMapping(SegmentSet.of([Segment(1, 0, 9, 0, 5)]), skippable=Runs.of((9, 5, 1))))
    first = ms.refresh()[KEY]
    assert first.lookup(Position(1, 4)) == Position(9, 4) and ms.loaded_upto == 0
    write(1, TopicMapping(SegmentSet.of([Segment(1, 5, 9, 6, 5)])))
    second = ms.refresh()[KEY]
    assert ms.loaded_upto == 1
    assert second.lookup(Position(1, 9)) == Position(9, 10)
    assert second.skippable.rows.tolist() == [[9, 5, 1]]
    assert ms.refresh()[KEY] == second  # nothing new: unchanged


def test_an_empty_batch_is_recorded_once(tmp_path: Path) -> None:
    store = open_store("delta-rs", str(tmp_path))
    empty = row_schema("mappings").empty_table()
    assert store.append("mappings", empty, app_id="mapping", batch_id=0)
    assert not store.append("mappings", empty, app_id="mapping", batch_id=0)
    assert store.last_batch("mapping") == 0


def test_sync_metrics_come_from_the_progress_rows() -> None:
    """One recorder for both emission paths: acks, unmapped, lag and last sync per subscription."""
    from cursorsync.app.metrics import Metrics
    from cursorsync.core.cursor import CursorState
    from cursorsync.core.records import SyncRecord
    from cursorsync.core.translate import translate
    from cursorsync.sync.sink import SyncSink, _Synced
    from cursorsync.sync.step import StepSettings, SyncStep
    from cursorsync.tables.rows import sync_progress_rows

    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 9, 0, 5)]))
    plan = translate(CursorState.parse("1:9"), mapping, CursorState.parse("9:-1"))
    now = datetime.now(UTC)
    records = [SyncRecord(KEY, "billing", plan, 1, False, now, now),
               *(SyncRecord(KEY, "billing", plan, 0, False, now, now, result)
                 for result in ("refused", "refused", "failed", "halted"))]
    rows = sync_progress_rows(records, source_cluster="A", target_cluster="B")
    sink = SyncSink.__new__(SyncSink)
    sink.metrics = Metrics()
    sink.step = SyncStep(StepSettings(cumulative=True), None, lambda t, s: None)
    sink._not_ready = {}
    sink.step.lookups.count, sink.step.lookups.tail_checks = 3, 2
    reads = SimpleNamespace(requests=4, plugin=SimpleNamespace(reads=1))
    sink.target_reads, sink._target_reads_seen = reads, {}  # type: ignore[assignment]
    tails = {"plugin-tail": 3, "tail-check": 1}
    sink.source_tail = SimpleNamespace(requests_by_kind=lambda: dict(tails))
    sink._tail_requests_seen = {}
    sink.source_lookups, sink._lookups_seen = None, {}  # each entry looked up: a raw read
    sink._record(_Synced([], rows, 0.01), 0.5)
    reads.requests += 2  # the next batch's: counted once each
    tails["plugin-tail"] += 2
    sink._record(_Synced([], rows, 0.01), 0.5)
    text = sink.metrics.exposition()
    assert 'cursorsync_target_cursor_reads_total{way="internal-stats"} 6.0' in text
    assert 'cursorsync_target_cursor_reads_total{way="plugin"} 1.0' in text
    assert 'cursorsync_acks_sent_total{kind="cumulative",subscription="billing"} 2.0' in text
    assert 'cursorsync_unmapped_acked_entries{subscription="billing"} 5.0' in text
    assert 'cursorsync_errors_total{stage="guard"} 4.0' in text
    assert 'cursorsync_source_lookups_total{kind="raw-entry"} 6.0' in text
    # The tail checks' requests as their client counts them (not the checks answered).
    assert 'cursorsync_source_lookups_total{kind="tail-check"} 1.0' in text
    assert 'cursorsync_source_lookups_total{kind="plugin-tail"} 5.0' in text
    assert 'cursorsync_errors_total{stage="emit"} 2.0' in text
    for result, n in (("emitted", 2), ("refused", 4), ("failed", 2), ("halted", 2)):
        assert (f'cursorsync_sync_outcomes_total{{result="{result}",subscription="billing"}} '
                f'{n}.0') in text
    # The marker lookups' client counting its requests by kind: the plugin's, one per
    # partition and lookup, and the raw reads it fell back to.
    sink.metrics = Metrics()
    lookups = {"plugin-markers": 4, "raw-entry": 1}
    sink.source_lookups = SimpleNamespace(requests_by_kind=lambda: dict(lookups))
    sink._record(_Synced([], rows, 0.01), 0.5)
    lookups["plugin-markers"] += 3
    sink._record(_Synced([], rows, 0.01), 0.5)
    text = sink.metrics.exposition()
    assert 'cursorsync_source_lookups_total{kind="plugin-markers"} 7.0' in text
    assert 'cursorsync_source_lookups_total{kind="raw-entry"} 1.0' in text
    assert rows.column("outcome").to_pylist() == ["partial", "refused", "refused", "failed",
                                                  "halted"]


def test_driver_java_options_add_to_ours_and_the_embedded_config_sets_c1() -> None:
    from pathlib import Path as _P

    from cursorsync.app.session import driver_java_options
    from cursorsync.app.settings import load_config

    conf = _P(__file__).resolve().parents[3] / "conf" / "embedded.yaml"
    opts = driver_java_options(load_config(conf))
    assert opts.startswith("-Dlog4j2.configurationFile=") and "log4j2.properties" in opts
    assert opts.endswith(" -XX:TieredStopAtLevel=1")


class _FakeQuery:
    def __init__(self, name: str) -> None:
        self.name, self.isActive, self.error = name, True, None
        self.progress: dict | None = None

    @property
    def lastProgress(self) -> object | None:
        import json as _json
        from types import SimpleNamespace

        return None if self.progress is None else SimpleNamespace(json=_json.dumps(self.progress))

    def exception(self) -> object | None:
        return self.error


def test_progress_poller_records_each_new_batch_once_and_a_failed_query() -> None:
    from cursorsync.app.job import _ProgressPoller
    from cursorsync.app.metrics import Metrics

    class Recording(Metrics):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, int]] = []
            self.errors: list[str] = []

        def observe_progress(self, progress, query=None):  # type: ignore[no-untyped-def]
            self.seen.append((progress["name"], progress["batchId"]))
            super().observe_progress(progress, query)

        def record_error(self, stage):  # type: ignore[no-untyped-def]
            self.errors.append(stage)
            super().record_error(stage)

    m = Recording()
    q = _FakeQuery("cursorsync-mapping")
    poller = _ProgressPoller([q], m, 60)
    poller.poll()
    q.progress = {"name": q.name, "batchId": 3, "numInputRows": 10, "durationMs": {"addBatch": 7}}
    poller.poll()
    poller.poll()
    q.progress = {**q.progress, "batchId": 4}
    poller.poll()
    assert m.seen == [("cursorsync-mapping", 3), ("cursorsync-mapping", 4)]
    assert 'cursorsync_query_batch_id{query="cursorsync-mapping"} 4.0' in m.exposition()
    q.isActive, q.error = False, RuntimeError("boom")
    poller.poll()
    poller.poll()
    assert m.errors == ["query"]


def _in_a_session(cwd: Path, body: str) -> subprocess.CompletedProcess[str]:
    """``body`` run in a fresh process, after ``spark = build_session(...)`` of the embedded
    config (the JVM's set-up happens once per process); it must exit 0."""
    conf = Path(__file__).resolve().parents[3] / "conf" / "embedded.yaml"
    code = ("from cursorsync.app.settings import load_config\n"
            "from cursorsync.app.session import build_session\n"
            f"spark = build_session(load_config({str(conf)!r}))\n"
            f"{body}spark.stop()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out


def test_a_session_from_the_config_starts_without_spark_chatter_on_stderr(
        tmp_path: Path) -> None:
    """Spark takes PySpark's gateway for a shell and says how to change the log level on
    stderr, unless our log4j2 file gives the gateway's logger a level (a fresh process:
    the JVM's log set-up happens once). A Python worker's native crash shows its stack."""
    out = _in_a_session(tmp_path, (
        "spark.range(3).count()\n"
        "import os, signal\n"
        "from pyspark.sql.functions import udf\n"
        "crash = udf(lambda x: os.kill(os.getpid(), signal.SIGSEGV) or x, 'long')\n"
        "try:\n"
        "    spark.range(1).select(crash('id')).collect()\n"
        "except Exception as err:\n"
        "    print('CRASH:', 'Fatal Python error' in str(err))\n"
    ))
    assert "Setting default log level" not in out.stderr
    assert "setLogLevel" not in out.stderr
    # A worker that dies of a native crash leaves its stack in the error.
    assert "CRASH: True" in out.stdout, out.stdout


def test_the_sessions_queries_write_their_checkpoints_without_forking_readlink(
        tmp_path: Path) -> None:
    """The session names Spark's FileSystem checkpoint manager (FileContext's forks
    ``readlink`` from the JVM on every rename): the class exists in the pinned Spark, and a
    query's offsets and commits are written and read back with it."""
    from cursorsync.app.session import CHECKPOINT_FILE_MANAGER

    out = _in_a_session(tmp_path, (
        "import os, time\n"
        "print('MANAGER:', spark.conf.get('spark.sql.streaming.checkpointFileManagerClass'))\n"
        "def run(seen):\n"
        "    q = (spark.readStream.format('rate').load().writeStream\n"
        "         .foreachBatch(lambda df, i: seen.append(i))\n"
        "         .option('checkpointLocation', 'ckpt').trigger(processingTime='0.2 seconds')\n"
        "         .start())\n"
        "    deadline = time.monotonic() + 120\n"
        "    while len(seen) < 3 and time.monotonic() < deadline and q.isActive:\n"
        "        time.sleep(0.1)\n"
        "    q.stop()\n"
        "    return seen\n"
        "first = run([])\n"
        "committed = max(int(f) for f in os.listdir('ckpt/commits') if f.isdigit())\n"
        "again = run([])\n"
        "print('FIRST:', first[:3], 'AGAIN_STARTS_AFTER:', again[0] == committed + 1)\n"
        "print('COMMITS:', len(os.listdir('ckpt/commits')) >= 6)\n"
    ))
    (manager,) = CHECKPOINT_FILE_MANAGER.values()
    assert f"MANAGER: {manager}" in out.stdout, out.stdout
    # A restarted query resumes after the last batch its checkpoint says was committed (a
    # batch stopped between its call and its commit runs again: at least once).
    assert "FIRST: [0, 1, 2] AGAIN_STARTS_AFTER: True" in out.stdout, out.stdout
    assert "COMMITS: True" in out.stdout, out.stdout


def test_a_failed_query_is_reported_by_our_error_not_sparks_traceback() -> None:
    from cursorsync.app.job import query_failure
    from cursorsync.errors import CursorSyncError

    # What StreamingQueryException says when read() raised one of ours (captured from
    # pyspark 4.2, trimmed): the worker's traceback, then Spark's own lines.
    spark_text = (
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most "
        "recent call last):\n"
        '  File "/x/cursorsync/sources/entries.py", line 582, in read_entries\n'
        "    raise EntriesReadError(\n"
        "cursorsync.mapping.entries_options.EntriesReadError: cluster B topic t range (0:1..0:3]: "
        "entry 0:3 is the last chunk of a chunked message\n"
        "\n"
        "=== Streaming Query ===\n"
        "Identifier: cursorsync-mapping [id = 1, runId = 2]\n"
    )
    err = query_failure("cursorsync-mapping", spark_text)
    assert isinstance(err, CursorSyncError)  # the CLI prints "error: ..." and exits 2
    assert str(err) == ("query cursorsync-mapping failed: cluster B topic t range "
                        "(0:1..0:3]: entry 0:3 is the last chunk of a chunked message "
                        "[EntriesReadError]")
    # Not one of ours: the first line of what Spark says.
    other = query_failure("cursorsync-sync", "java.lang.OutOfMemoryError: heap\n\tat x.y(z)")
    assert str(other) == "query cursorsync-sync failed: java.lang.OutOfMemoryError: heap"


class _Rows:
    """What foreachBatch hands the sink: a DataFrame, here only its Arrow table."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:  # pyspark's name
        return self.table


def _mapping_job(tmp_path: Path) -> tuple[Any, Any]:
    """A position-property job's config and its delta-rs tables (all created)."""
    from cursorsync.app.settings import parse_config

    config = parse_config({
        "clusters": {"source": {"name": "A", "service_url": "pulsar://h:6650",
                                "admin_url": "http://h:8080"},
                     "target": {"name": "B", "service_url": "pulsar://h:6651",
                                "admin_url": "http://h:8081"}},
        "topics": [{"topic": KEY.topic, "subscriptions": ["billing"]}],
        "evidence": {"strategies": ["position-property"]},
        "tables": {"path": str(tmp_path / "tables")},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")}})
    store = open_store("delta-rs", str(tmp_path / "tables"))
    store.ensure_all()
    return config, store


def _entries_on_ledger_9(entries: list[int]) -> _Rows:
    """B's entries 9:<e> (source 1:<e>) in the job's layout: a Spark row per Arrow record
    batch of entry rows."""
    from cursorsync.mapping.entries_rows import pack_batches

    n = len(entries)
    rows = pa.RecordBatch.from_pydict({
        "cluster": ["B"] * n, "topic": [KEY.topic] * n,
        "partition": pa.array([KEY.partition] * n, pa.int32()),
        "ledger": pa.array([9] * n, pa.int64()), "entry": pa.array(entries, pa.int64()),
        "batch_index": pa.array([-1] * n, pa.int32()),
        "batch_size": pa.array([1] * n, pa.int32()),
        "producer_name": pa.array([None] * n, pa.string()),
        "publish_time": pa.array([None] * n, pa.int64()),
        "source_position": pa.array([f"1:{e}" for e in entries], pa.string()),
        "entry_identity": pa.array([None] * n, pa.binary()),
        "first_chunk": pa.array([None] * n, pa.string())})
    return _Rows(pa.Table.from_batches(list(pack_batches(iter([rows]), "B"))))


def test_the_mapping_sink_claims_only_checked_holes_and_keeps_the_check_on_replay(
        tmp_path: Path) -> None:
    """9:1 is a marker, 9:2 a chunk (the check's answers): only 9:1 reaches the table, in
    the batch and again when the sink restarts from the checkpoint's builder state. A
    partition the sync found rows about deleted ledgers for gets a live row."""
    from cursorsync.app.metrics import Metrics
    from cursorsync.app.queries import builder_config
    from cursorsync.core.retention import LiveLedgers
    from cursorsync.mapping.sink import MappingSink

    asked: list[list[list[int]]] = []

    def check(candidates: dict[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        asked.append(candidates[KEY].rows.tolist())
        time.sleep(0.05)  # a check's time shows as its own part of the build
        return {KEY: Runs.of((9, 1, 1))} if asked[-1][0][:2] == [9, 1] else {}

    config, store = _mapping_job(tmp_path)
    batch = _entries_on_ledger_9
    metrics = Metrics()
    sink = MappingSink(builder_config(config), store, tmp_path / "state", metrics, hole_check=check)
    sink(batch([0, 3]), 0)
    assert asked == [[[9, 1, 2]]]
    rows = store.read("mappings")
    skippable = [(r["target_ledger"], r["target_entry"], r["count"]) for r in rows.to_pylist()
                 if r["kind"] == "skippable"]
    assert skippable == [(9, 1, 1)]
    sample = metrics.registry.get_sample_value
    assert sample("cursorsync_skipped_target_ids_total", {"outcome": "claimed"}) == 1
    assert sample("cursorsync_skipped_target_ids_total", {"outcome": "unclaimed"}) == 1
    for phase in ("prepare", "read", "build", "write", "state", "build:partitions",
                  "build:check", "build:release", "build:anchors"):
        assert sample("cursorsync_batch_phase_seconds_count",
                      {"query": "mapping", "phase": phase}) == 1, phase
    seconds = {phase: sample("cursorsync_batch_phase_seconds_sum",
                             {"query": "mapping", "phase": phase})
               for phase in ("build", "build:check")}
    assert 0.05 <= seconds["build:check"] <= seconds["build"]
    cpu = {phase: sample("cursorsync_batch_phase_cpu_seconds_total",
                         {"query": "mapping", "phase": phase})
           for phase in ("read", "build", "build:check", "build:partitions")}
    assert all(v is not None and v >= 0 for v in cpu.values()), cpu
    assert cpu["build:check"] <= cpu["build"] <= seconds["build"] + 0.01
    # A new sink (a restart) replays batch 1 from batch 0's saved state: the check still runs.
    live = LiveLedgers()
    again = MappingSink(builder_config(config), store, tmp_path / "state", None, hole_check=check,
                        live=live)
    again(batch([4, 6]), 1)
    assert asked[-1] == [[9, 5, 1]]
    # The sync found rows about ledgers before 1 and 9: the next batch writes a live row.
    live.saw(KEY, 1, 9)
    again(batch([7]), 2)
    assert [(r["source_ledger"], r["target_ledger"], r["count"], r["batch_id"])
            for r in store.read("mappings").to_pylist() if r["kind"] == "live"] == [(1, 9, 0, 2)]
    state = tmp_path / "state"
    assert sorted(p.name for p in state.iterdir()) == [
        f"builder-{n}.arrow" for n in range(3)]
    # A restart after an upgrade finds the state as version 1 wrote it, a JSON document.
    saved = json_parts(_version_1(read_state(state / "builder-2.arrow")))
    assert saved == state_parts(read_state(state / "builder-2.arrow"))
    (state / "builder-2.json").write_text(json.dumps(_version_1(read_state(
        state / "builder-2.arrow"))))
    (state / "builder-2.arrow").unlink()
    upgraded = MappingSink(builder_config(config), store, state, None, hole_check=check)
    upgraded._prepare(3)
    assert upgraded.builder._parts == saved
    # Old states go, whatever their format, a torn write's leftover included.
    (state / "builder-0.arrow.part").write_bytes(b"torn")
    (state / ".builder-1.arrow.x1y2.tmp").write_bytes(b"torn")
    upgraded(batch([8]), 3 + STATE_FILES_KEPT)
    assert [p.name for p in state.iterdir()] == [f"builder-{3 + STATE_FILES_KEPT}.arrow"]


def test_the_mapping_sink_writes_a_partitions_waiting_skipped_ids_when_they_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one id checked a batch, 9:4-5 wait behind 9:1-2: ``mapping_waits`` says 2, then
    0 once checked, and nothing while the count stays; a restarted sink takes the table's
    last word and writes nothing it already holds."""
    from cursorsync.app.queries import builder_config
    from cursorsync.app.status import subscription_status
    from cursorsync.core.cursor import AckPlan
    from cursorsync.core.records import SyncRecord
    from cursorsync.mapping import builder
    from cursorsync.mapping.sink import MappingSink
    from cursorsync.tables.mappings_table import WaitsStore
    from cursorsync.tables.rows import latest_waits, sync_progress_rows

    monkeypatch.setattr(builder, "HOLE_CHECKS_PER_BATCH", 1)
    config, store = _mapping_job(tmp_path)
    # The sync's reading of the table: partitions waiting, each batch's rows read once.
    seen = WaitsStore(store, "A", "B")
    assert seen.refresh() == {}

    def check(candidates: dict[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        return candidates  # every id checked is a marker

    def waits() -> list[tuple[int, int]]:
        return sorted((r["batch_id"], r["skipped_waiting"])
                      for r in store.read("mapping_waits").to_pylist())

    sink = MappingSink(builder_config(config), store, tmp_path / "state", None, hole_check=check)
    sink(_entries_on_ledger_9([0, 3, 6]), 0)
    assert sink.skipped_waiting == 2 and waits() == [(0, 2)]
    assert seen.refresh() == {KEY: 2} and seen.loaded_upto == 0
    assert WaitsStore(store, "B", "A").refresh() == {}  # another pair's
    again = MappingSink(builder_config(config), store, tmp_path / "state", None,
                        hole_check=check)
    again(_entries_on_ledger_9([7]), 1)  # the waiting run is checked: none waits
    assert waits() == [(0, 2), (1, 0)]
    assert seen.refresh() == {} and seen.loaded_upto == 1
    again(_entries_on_ledger_9([8]), 2)  # still none: no row
    assert waits() == [(0, 2), (1, 0)]
    assert latest_waits(store.read("mapping_waits")) == {KEY: 0}

    # status shows the partition's count beside each subscription synced on it
    plan = AckPlan(mark_delete=Position(9, 7), individually_deleted=RangeSet(),
                   to_ack=RangeSet(), previous_mark_delete=Position(0, -1),
                   unmapped_acked_entries=0, rewound_entries=0, partial_batches_unacked=0,
                   skippable_acked_entries=0, outcome="exact")
    now = datetime.now(UTC)
    store.append("sync_progress", sync_progress_rows(
        [SyncRecord(KEY, "billing", plan, acks_sent=1, dry_run=False, source_observed_at=now,
                    emitted_at=now)], source_cluster="A", target_cluster="B"),
        app_id="sync", batch_id=0)
    waiting = store.read("mapping_waits")
    waiting = waiting.filter(pc.equal(waiting.column("skipped_waiting"), 2))
    store.append("mapping_waits", waiting.drop_columns(
        ["schema_version", "topic_bucket", "batch_id"]), app_id="sink", batch_id=5)
    (row,) = subscription_status(store)
    assert row.subscription == "billing" and row.skipped_waiting == 2


def _version_1(table: pa.Table) -> dict[str, Any]:
    """The builder state as version 1 wrote it: one JSON document."""
    out = []
    for key, ps in state_parts(table).items():
        out.append({
            "topic": key.topic, "partition": key.partition,
            "last_target": None if ps.last_target is None else str(ps.last_target),
            "last_source": None if ps.last_source is None else str(ps.last_source),
            "watch_until": ps.watch_until,
            "target": {"ledger": ps.target.ledger, "entry": ps.target.entry,
                       "digest": [d.hex() for d in ps.target.digest]},
            "source": {"ledger": ps.source.ledger, "entry": ps.source.entry,
                       "digest": [d.hex() for d in ps.source.digest]},
            "unchecked": ps.unchecked.rows.tolist(), "probes": sorted(map(list, ps.probes))})
    return {"version": 1, "partitions": out}


def test_restart_backs_off_and_gives_up_on_what_an_operator_must_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import cursorsync.app.job as job_module
    from cursorsync.app.job import MAX_RESTARTS, QueryFailedError, restart

    started: list[dict[str, object]] = []
    monkeypatch.setattr(job_module, "start_job",
                        lambda config, **kw: started.append(kw) or "new job")

    class Old:
        spark = "session"
        stopped = False

        def stop(self) -> None:
            self.stopped = True

    waits: list[float] = []
    failing = QueryFailedError("query cursorsync-sync failed: table locked", "TableWriteError")
    for attempt in range(1, MAX_RESTARTS + 1):
        old = Old()
        again = restart(old, None, failing, attempt, sleep=waits.append)  # type: ignore[arg-type]
        assert again == "new job" and old.stopped
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0][:MAX_RESTARTS]
    assert all(kw["spark"] == "session" and kw["serve_metrics"] is False for kw in started)
    with pytest.raises(QueryFailedError, match="table locked"):
        restart(Old(), None, failing, MAX_RESTARTS + 1, sleep=waits.append)  # type: ignore[arg-type]
    # A cluster that does not answer is waited out, a minute apart, however long it takes.
    unavailable = QueryFailedError("query cursorsync-sync failed: cluster b: unreachable",
                                   "AdminUnavailableError")
    waits.clear()
    for attempt in (1, MAX_RESTARTS + 1, 1000, 10_000):
        assert restart(Old(), None, unavailable, attempt,  # type: ignore[arg-type]
                       sleep=waits.append) == "new job"
    assert waits == [2.0, 60.0, 60.0, 60.0]
    malformed = QueryFailedError("query cursorsync-sync failed: bad JSON",
                                 "MalformedAdminOutputError")
    with pytest.raises(QueryFailedError, match="bad JSON"):
        restart(Old(), None, malformed, MAX_RESTARTS + 1, sleep=waits.append)  # type: ignore[arg-type]
    auth = QueryFailedError("query cursorsync-sync failed: refused", "AdminAuthError")
    with pytest.raises(QueryFailedError, match="refused"):
        restart(Old(), None, auth, 1, sleep=waits.append)  # type: ignore[arg-type]


def _reference(rows: pa.Table) -> list[tuple[Any, ...]]:
    """Each row parsed on its own, as plainly as possible."""
    out = []
    for r in rows.to_pylist():
        lg = None if r["ledgers"] is None else sorted(
            (x["ledger_id"], x["entries"]) for x in r["ledgers"])
        at, checked = (t if t.tzinfo else t.replace(tzinfo=UTC)
                       for t in (r["observed_at"], r["checked_at"]))
        out.append((r["topic"], r["partition"], r["subscription"],
                    Position.parse(r["mark_delete"]),
                    str(RangeSet.parse(r["individually_deleted"])), lg, at, checked))
    return out


def _seen(obs: list[Any]) -> list[tuple[Any, ...]]:
    return [(o.key.topic, o.key.partition, o.subscription, o.state.mark_delete,
             str(o.state.individually_deleted),
             None if o.state.ledgers is None else list(zip(
                 o.state.ledgers.ids.tolist(), o.state.ledgers.entries.tolist(), strict=True)),
             o.observed_at, o.confirmed_at) for o in obs]


_cursor_rows = st.lists(st.fixed_dictionaries({
    "cluster": st.just("A"),
    "topic": st.sampled_from(["persistent://t/n/x", "persistent://t/n/y"]),
    "partition": st.integers(-1, 3), "subscription": st.sampled_from(["s", "u"]),
    "mark_delete": st.sampled_from(["5:3", "5:9", "6:-1"]),
    "individually_deleted": st.sampled_from(["[]", "[(5:4..5:6]]", "[(5:4..5:6], (5:8..5:9]]"]),
    "ledgers": st.one_of(st.none(), st.lists(st.fixed_dictionaries({
        "ledger_id": st.integers(5, 7), "entries": st.integers(0, 20)}), max_size=3,
        unique_by=lambda x: x["ledger_id"])),
    "observed_at": st.sampled_from([datetime(2026, 1, 1, 12, 0, 0),
                                    datetime(2026, 1, 1, 12, 0, 5)]),
    "messages_consumed_counter": st.just(9),
    "checked_at": st.sampled_from([datetime(2026, 1, 1, 12, 0, 5),
                                   datetime(2026, 1, 1, 12, 0, 9)]),
}), max_size=12).map(lambda rows: [{**r, "checked_at": max(r["observed_at"], r["checked_at"])}
                                   for r in rows])


_CURSOR_SCHEMA = pa.schema([
    ("cluster", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
    ("subscription", pa.string()), ("mark_delete", pa.string()),
    ("individually_deleted", pa.string()),
    ("ledgers", pa.list_(pa.struct([("ledger_id", pa.int64()), ("entries", pa.int64())]))),
    ("observed_at", pa.timestamp("us")), ("messages_consumed_counter", pa.int64()),
    ("checked_at", pa.timestamp("us"))])


@settings(max_examples=300, deadline=None)
@given(_cursor_rows, _cursor_rows, st.lists(st.booleans(), min_size=12, max_size=12),
       st.lists(st.booleans(), min_size=24, max_size=24))
def test_observations_of_batch_after_batch_are_each_row_parsed_alone(
        first: list[dict[str, Any]], second: list[dict[str, Any]], keep: list[bool],
        forget: list[bool]) -> None:
    """The sink's parser takes again what the last batch parsed: the same states as
    parsing every row on its own, whatever repeats within and across the batches, and
    whichever rows change, in place (a poll lists the partitions in the same order) or
    elsewhere, and whichever rows it is told to forget (kept by the idle store)."""
    parse = Observations()
    in_place = [a if k or i >= len(second) else second[i]
                for i, (a, k) in enumerate(zip(first, keep, strict=False))]
    for rows in (first, in_place, second + first, second + first, first, first[::-1],
                 first[1:]):
        table = pa.Table.from_pylist(rows, schema=_CURSOR_SCHEMA)
        assert _seen(parse(table)) == _reference(table)
        parse.forget(np.flatnonzero(forget[:len(rows)]))


def test_rows_the_parser_forgets_are_parsed_anew() -> None:
    rows = [{"cluster": "A", "topic": "persistent://t/n/x", "partition": p, "subscription": "s",
             "mark_delete": "5:3", "individually_deleted": "[(5:4..5:6]]",
             "ledgers": [{"ledger_id": 5, "entries": 9}], "observed_at": datetime(2026, 1, 1),
             "messages_consumed_counter": 9, "checked_at": datetime(2026, 1, 1)}
            for p in range(4)]
    table = pa.Table.from_pylist(rows, schema=_CURSOR_SCHEMA)
    parse = Observations()
    parse(table)
    parse.forget(np.array([0, 2]))
    assert _seen(parse(table)) == _reference(table) and parse.taken_again == 2
    parse.forget(np.arange(4))
    assert _seen(parse(table)) == _reference(table) and parse.taken_again == 0
