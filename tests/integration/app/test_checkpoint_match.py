"""A checkpoint lost, replaced or restored older while the tables are kept: the start
binds a new checkpoint to the tables, or refuses one that does not go with them, and a
recorded halt holds either way. Run with the real sync sink on Delta tables, a query
checkpoint laid out as Spark lays it out (offsets logged before a batch, committed after),
and the job's own start for a refusal."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from cursorsync.app.checkpoint_match import (
    BINDING_FILE,
    QUERIES,
    CheckpointMismatchError,
    Rebased,
    bind,
    bind_checkpoints,
)
from cursorsync.app.settings import Config
from cursorsync.app.spark_checkpoint import read_checkpoint
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.mapping.sink import MAPPING_APP
from cursorsync.sync.halts import read_halts, resume
from cursorsync.sync.sink import SYNC_APP
from cursorsync.tables import TableStore, open_store
from cursorsync.tables.rows import mapping_rows, row_schema
from tests.support.sink_world import KEY, T0, RecordingEmitter, new_sink, polled, sink_config

CLUSTERS: dict[str, Any] = {"source_cluster": "A", "target_cluster": "B"}
HALTED = {(KEY, "billing")}


class SparkQuery:
    """A query's checkpoint kept as Spark keeps it: ``metadata`` when the query starts,
    ``offsets/N`` before batch N runs, ``commits/N`` after its sink returned; a batch
    logged and not committed runs again with its id."""

    def __init__(self, location: Path) -> None:
        self.location = location

    def start(self, query_id: str | None = None) -> None:
        self.location.mkdir(parents=True, exist_ok=True)
        meta = self.location / "metadata"
        if query_id is not None or not meta.exists():
            meta.write_text(json.dumps({"id": query_id or str(uuid.uuid4())}) + "\n")

    def next_batch(self) -> int:
        ck = read_checkpoint(str(self.location))
        if ck.last_offset is not None and ck.last_offset != ck.last_commit:
            return ck.last_offset
        return 0 if ck.last_commit is None else ck.last_commit + 1

    def run(self, sink: Any, frame: Any, *, commit: bool = True) -> int:
        n = self.next_batch()
        _spark_file(self.location / "offsets", n,
                    f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":0}}\n{{"seq":{n + 1}}}')
        sink(frame, n)
        if commit:
            _spark_file(self.location / "commits", n, 'v1\n{"nextBatchWatermarkMs":0}')
        return n


def _spark_file(directory: Path, n: int, text: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(n)).write_text(text + "\n")
    (directory / f".{n}.crc").write_bytes(b"crc")  # Hadoop's checksum beside it: no batch


class World:
    """One job's config, tables, target cursor and emitter; :meth:`start` is a job start."""

    def __init__(self, tmp_path: Path, store: TableStore | None = None) -> None:
        self.config: Config = sink_config(tmp_path)
        self.store = store or open_store("delta-rs", self.config.tables.path)
        self.store.ensure_all()
        self.store.append("mappings", mapping_rows(KEY, TopicMapping(SegmentSet.of(
            [Segment(5, 0, 7, 0, 20)])), written_at=T0, **CLUSTERS), app_id="m", batch_id=0)
        self.ckpt = Path(self.config.spark.checkpoint_dir)
        self.sync = SparkQuery(self.ckpt / "sync")
        self.target = [CursorState(Position(7, -1), ledgers=Ledgers.of([(7, 20)]))]
        self.emitter = RecordingEmitter()
        self.t = 0

    def start(self) -> Rebased:
        """What start_job does with the sync query: bind, then Spark starts the query."""
        bases = bind_checkpoints(self.store, {"mapping": str(self.ckpt / "mapping"),
                                              "sync": str(self.ckpt / "sync")},
                                 builder_state=str(self.ckpt / "builder-state"))
        self.sync.start()
        return Rebased(new_sink(self.config, self.store, self.emitter, self.target),
                       bases["sync"])

    def poll(self, sink: Rebased, mark_delete: str, *, commit: bool = True) -> int:
        """One sync batch polling the source at ``mark_delete``; the batch id in the tables."""
        self.t += 1
        return self.sync.run(sink, polled(mark_delete, T0 + timedelta(seconds=self.t)),
                             commit=commit) + sink.base

    def target_at(self, entry: int) -> None:
        self.target[0] = CursorState(Position(7, entry), ledgers=Ledgers.of([(7, 20)]))

    def outcomes(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for r in self.store.read("sync_progress").to_pylist():
            out.setdefault(r["batch_id"], []).append(r["outcome"])
        return out

    def newest(self) -> tuple[int, str]:
        """The batch id and outcome of the newest status row."""
        r = max(self.store.read("sync_progress").to_pylist(), key=lambda r: r["emitted_at"])
        return r["batch_id"], r["outcome"]

    def first_life(self) -> None:
        """Batches 0-3 sync to 7:9; in batch 4 a rewind on the source halts the sync, and
        batch 5 stays halted."""
        sink = self.start()
        for batch, entry in enumerate((3, 5, 7, 9)):
            assert self.poll(sink, f"5:{entry}") == batch
            self.target_at(entry)
        assert self.poll(sink, "5:4") == 4
        assert self.poll(sink, "5:12") == 5
        assert self.outcomes() == {**{b: ["exact"] for b in range(4)},
                                   4: ["halted"], 5: ["halted"]}
        assert read_halts(self.store, **CLUSTERS) == HALTED and len(self.emitter.sent) == 4


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture(params=["delta-rs", pytest.param("delta-spark", marks=[
    pytest.mark.spark, pytest.mark.shares("delta_spark_session")])])
def any_world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    """A world on each backend (delta-spark in a local session with the Delta jars)."""
    if request.param == "delta-spark":
        spark = request.getfixturevalue("delta_spark_session")
        return World(tmp_path, open_store("delta-spark", str(tmp_path / "tables"), spark=spark))
    return World(tmp_path)


# ------------------------------------------------------------------ carry on


def test_a_new_job_binds_at_batch_zero_as_before(world: World) -> None:
    sink = world.start()
    assert sink.base == 0
    assert world.poll(sink, "5:3") == 0 and world.outcomes() == {0: ["exact"]}
    binding = json.loads((world.ckpt / "sync" / BINDING_FILE).read_text())
    assert binding["base"] == 0 and binding["tables"] == world.store.root


def test_a_restart_on_the_same_checkpoint_goes_on_and_the_halt_holds(world: World) -> None:
    world.first_life()
    sink = world.start()
    assert sink.base == 0
    assert world.poll(sink, "5:13") == 6
    assert world.outcomes()[6] == ["halted"] and len(world.emitter.sent) == 4
    assert read_halts(world.store, **CLUSTERS) == HALTED


def test_a_new_checkpoint_on_kept_tables_numbers_on_and_halts_hold(any_world: World) -> None:
    _new_checkpoint_on_kept_tables(any_world, "deleted")


@pytest.mark.parametrize("lost", ["emptied", "started-only"])
def test_an_empty_checkpoint_is_a_new_one(world: World, lost: str) -> None:
    _new_checkpoint_on_kept_tables(world, lost)


def _new_checkpoint_on_kept_tables(world: World, lost: str) -> None:
    world.first_life()
    shutil.rmtree(world.ckpt)
    if lost == "emptied":  # directories and nothing in them
        for d in ("offsets", "commits"):
            (world.ckpt / "sync" / d).mkdir(parents=True)
    elif lost == "started-only":  # a query started and stopped before its first batch
        SparkQuery(world.ckpt / "sync").start()
    sink = world.start()
    # Spark's batch 0: its status row lands (as the tables' batch 6), the recorded halt holds.
    world.poll(sink, "5:13")
    assert world.newest() == (6, "halted") and len(world.emitter.sent) == 4
    assert read_halts(world.store, **CLUSTERS) == HALTED
    # Resumed, it syncs; a rewind under the new checkpoint halts again, and the halt lasts.
    resume(world.store, topic=KEY.topic, subscription="billing", **CLUSTERS)
    world.poll(sink, "5:14")
    assert world.newest() == (7, "exact") and len(world.emitter.sent) == 5
    world.target_at(14)
    world.poll(sink, "5:6")
    assert world.newest() == (8, "halted")
    assert read_halts(world.store, **CLUSTERS) == HALTED
    world.poll(sink, "5:16")
    assert world.newest() == (9, "halted") and len(world.emitter.sent) == 5
    assert sink.base == 6 and sorted(world.outcomes()) == list(range(10))


def test_a_rewind_while_the_checkpoint_was_lost_is_seen(world: World) -> None:
    """The previous source state comes from the tables' older batches."""
    sink = world.start()
    world.poll(sink, "5:9")
    world.target_at(9)
    world.poll(sink, "5:10")
    shutil.rmtree(world.ckpt)
    sink = world.start()
    world.poll(sink, "5:2")
    assert world.newest() == (2, "halted")
    assert read_halts(world.store, **CLUSTERS) == HALTED


def test_a_batch_replayed_under_a_new_checkpoint_writes_once(world: World) -> None:
    world.first_life()
    shutil.rmtree(world.ckpt)
    sink = world.start()
    assert world.poll(sink, "5:13", commit=False) == 6  # its sink wrote, Spark did not commit
    sink = world.start()
    assert world.poll(sink, "5:13") == 6  # Spark runs batch 0 again: the tables' batch 6
    assert world.outcomes()[6] == ["halted"]  # once
    assert world.poll(sink, "5:14") == 7


def test_a_checkpoint_from_before_bindings_is_bound_when_it_agrees(world: World) -> None:
    world.first_life()
    (world.ckpt / "sync" / BINDING_FILE).unlink()
    sink = world.start()
    assert sink.base == 0 and (world.ckpt / "sync" / BINDING_FILE).exists()
    assert world.poll(sink, "5:13") == 6 and world.outcomes()[6] == ["halted"]


def test_a_new_mapping_checkpoint_numbers_on_and_drops_a_gone_checkpoints_states(
        world: World) -> None:
    empty = row_schema("mappings").empty_table()
    for batch in range(5):
        world.store.append("mappings", empty, app_id=MAPPING_APP, batch_id=batch)
    states = world.ckpt / "builder-state"
    states.mkdir(parents=True)
    for batch in (3, 4):
        (states / f"builder-{batch}.arrow").write_bytes(b"of the gone checkpoint")
    bases = bind_checkpoints(world.store, {"mapping": str(world.ckpt / "mapping")},
                             builder_state=str(states))
    assert bases == {"mapping": 5} and list(states.iterdir()) == []
    # Bound now: the next start keeps the base.
    assert bind(world.store, QUERIES["mapping"], str(world.ckpt / "mapping")) == 5


# ------------------------------------------------------------------ refuse


def _refused(world: World, match: str) -> str:
    with pytest.raises(CheckpointMismatchError, match=match) as err:
        world.start()
    message = str(err.value)
    assert "\n" not in message
    # Refused before anything was written: the halt holds.
    assert read_halts(world.store, **CLUSTERS) == HALTED
    return message


def test_a_checkpoint_of_other_tables_is_refused(world: World, tmp_path: Path) -> None:
    world.first_life()
    other = World(tmp_path / "other")
    other_sink = other.start()
    for mark in ("5:1", "5:2", "5:3", "5:4", "5:5"):
        other.poll(other_sink, mark)
    shutil.rmtree(world.ckpt / "sync")
    shutil.copytree(other.ckpt / "sync", world.ckpt / "sync")
    message = _refused(world, "was not made with these tables")
    assert str(world.ckpt / "sync") in message and world.store.uri("sync_progress") in message
    assert "batch 0" in message and "last batch of cursorsync-sync: 5" in message
    # Moved aside, as the line says: a new checkpoint binds and the halt holds.
    world.ckpt.rename(tmp_path / "ckpt-aside")
    sink = world.start()
    assert world.poll(sink, "5:13") == 6 and world.outcomes()[6] == ["halted"]


def test_a_checkpoint_without_binding_whose_batches_disagree_is_refused(world: World) -> None:
    world.first_life()
    shutil.rmtree(world.ckpt)
    query = SparkQuery(world.ckpt / "sync")  # someone else's, of one batch
    query.start()
    query.run(lambda df, n: None, None)
    _refused(world, r"is older than the tables: its last batch is 0 \(batch 0 in the "
                    r"tables\), but table sync_progress at .* holds batch 5 of cursorsync-sync")


def test_a_checkpoint_with_another_spark_query_is_refused(world: World) -> None:
    world.first_life()
    world.start()  # the second start records the query id Spark gave the checkpoint
    assert json.loads((world.ckpt / "sync" / BINDING_FILE).read_text())["spark_query_id"]
    world.sync.start(query_id=str(uuid.uuid4()))
    _refused(world, "was replaced: it holds Spark query")


def test_an_older_checkpoint_is_refused(any_world: World, tmp_path: Path) -> None:
    world = any_world
    world.first_life()
    backup = tmp_path / "ckpt-backup"
    shutil.copytree(world.ckpt, backup)
    sink = world.start()
    world.poll(sink, "5:13")
    world.poll(sink, "5:14")
    shutil.rmtree(world.ckpt)
    shutil.copytree(backup, world.ckpt)
    message = _refused(world, r"is older than the tables: its last batch is 5 \(batch 5 in the "
                              r"tables\), but table sync_progress at .* holds batch 7")
    assert str(world.ckpt / "sync") in message and "move" in message


def test_tables_older_than_the_checkpoint_are_refused(world: World, tmp_path: Path) -> None:
    world.first_life()
    backup = tmp_path / "tables-backup"
    shutil.copytree(world.config.tables.path, backup)
    sink = world.start()
    world.poll(sink, "5:13")
    shutil.rmtree(world.config.tables.path)
    shutil.copytree(backup, world.config.tables.path)
    _refused(world, r"table sync_progress at .* is older than checkpoint .*: the checkpoint "
                    r"completed batch 6 \(batch 6 in the tables\), and the table's last batch "
                    r"of cursorsync-sync is 5")


class _Session:
    """What start_job asks of a SparkSession before its queries (delta-rs tables)."""

    class _Conf:
        def set(self, key: str, value: str) -> None:
            pass

    class _Sources:
        def register(self, source: type) -> None:
            pass

    conf = _Conf()
    dataSource = _Sources()


def test_the_job_start_refuses_an_older_checkpoint_before_its_queries(
        world: World, tmp_path: Path) -> None:
    from cursorsync.app.job import start_job

    world.first_life()
    backup = tmp_path / "ckpt-backup"
    shutil.copytree(world.ckpt, backup)
    sink = world.start()
    world.poll(sink, "5:13")
    shutil.rmtree(world.ckpt)
    shutil.copytree(backup, world.ckpt)
    shutil.rmtree(world.ckpt / "mapping")  # new: it would be bound, were the sync's not refused
    with pytest.raises(CheckpointMismatchError, match=str(world.ckpt / "sync")):
        start_job(world.config, spark=_Session(), serve_metrics=False)
    assert read_halts(world.store, **CLUSTERS) == HALTED
    # Nothing written by the refused start.
    assert world.store.last_batch(SYNC_APP) == 6
    assert not (world.ckpt / "mapping").exists()


# ------------------------------------------------------------------ the job on the test bed


def _until(what: str, check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.5)


@pytest.mark.integration
@pytest.mark.spark
def test_the_job_on_a_lost_checkpoint_keeps_its_halt_and_refuses_the_old_one_back(
        testbed: Any, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    """A halted job stopped, its checkpoint lost: the job starts on a new one, its status
    rows go on past the tables' batch ids and the halt holds; the lost checkpoint put back
    is older than the tables and the start refuses it."""
    from cursorsync.app.job import start_job
    from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, load_config, parse_config
    from cursorsync.pulsar.topics import TopicName
    from cursorsync_devtools.demo import demo_config
    from tests.support.job_on_bed import (
        SUB,
        consumer_on_a,
        last_data_entry,
        mark_delete,
        send_and_ack,
        shared_topic,
    )

    topic = shared_topic(testbed, topic_name("ckpt"))
    consumer = consumer_on_a(testbed, topic)
    send_and_ack(testbed, topic, consumer, 20)
    testbed.wait_replicated([topic])
    data = load_config(EMBEDDED_CONFIG_PATH).model_dump(mode="json", by_alias=True)
    data["emission"]["rewind_policy"] = "halt"
    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB],
                         base=parse_config(data))
    store = open_store("delta-rs", config.tables.path)
    clusters = {"source_cluster": "a", "target_cluster": "b"}

    def newest() -> tuple[int, str] | None:
        rows = [r for r in store.read("sync_progress").to_pylist() if r["topic"] == topic]
        r = max(rows, key=lambda r: r["emitted_at"]) if rows else None
        return None if r is None else (r["batch_id"], r["outcome"])

    job = start_job(config)
    spark = job.spark
    try:
        last = last_data_entry(testbed, topic)
        _until("b's cursor follows a's", lambda: mark_delete(testbed, "b", topic, SUB) >= last)
        acked = mark_delete(testbed, "a", topic, SUB)
        testbed.admin_call("a", "POST", TopicName.parse(topic).admin_path(
            f"subscription/{SUB}/resetcursor"),
            json={"ledgerId": acked.ledger, "entryId": acked.entry - 15, "partitionIndex": -1})
        _until("the sync halts", lambda: (newest() or (0, ""))[1] == "halted")
        job.wait_batches(5, timeout_s=60)  # the tables' batch ids run well ahead of 0
    finally:
        job.stop()
    synced = mark_delete(testbed, "b", topic, SUB)
    before = store.last_batch(SYNC_APP)
    assert before is not None and len(read_halts(store, **clusters)) == 1
    ckpt = Path(config.spark.checkpoint_dir)
    lost = tmp_path / "checkpoint-lost"
    ckpt.rename(lost)

    job = start_job(config, spark=spark)
    try:
        sync_query = job.queries[1]
        _until("the new checkpoint's first sync batch",
               lambda: sync_query.lastProgress is not None)
        # Its status row landed, past the tables' last batch, and says the halt holds.
        assert newest()[0] > before  # type: ignore[index]
        assert newest()[1] == "halted"  # type: ignore[index]
        send_and_ack(testbed, topic, consumer, 5)
        testbed.wait_replicated([topic])
        job.wait_batches(3, timeout_s=60)
        assert newest()[1] == "halted"  # type: ignore[index]
        assert len(read_halts(store, **clusters)) == 1
        assert mark_delete(testbed, "b", topic, SUB) == synced
    finally:
        job.stop()

    shutil.rmtree(ckpt)
    lost.rename(ckpt)
    with pytest.raises(CheckpointMismatchError, match=r"is older than the tables"):
        start_job(config, spark=spark)
    assert len(read_halts(store, **clusters)) == 1
