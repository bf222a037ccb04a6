"""A sync sink on a Delta table with a polled source cursor and a target in memory: what
the sink tests drive (the real SyncSink and SyncStep; no Spark, no brokers)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from cursorsync.app.queries import sync_sink_settings
from cursorsync.app.settings import Config, parse_config
from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import SafePlan
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.records import PartitionKey, RewindPolicy
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.pulsar.admin import TopicCreation
from cursorsync.pulsar.emitter import EmitResult
from cursorsync.sync.sink import SyncSink
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.tables import TableStore, open_store
from cursorsync.tables.rows import mapping_rows

KEY = PartitionKey("persistent://t/n/orders", 0)
T0 = datetime(2026, 11, 24, tzinfo=UTC)


class _Frame:
    """What the sink reads of a Spark DataFrame: toArrow()."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:
        return self.table


def polled(mark_delete: str, at: datetime, ledgers: tuple[tuple[int, int], ...] = ((5, 20),),
            individually_deleted: str = "[]") -> _Frame:
    """One pulsar-cursors row: the source cursor of `billing` on KEY."""
    return _Frame(pa.Table.from_pylist([{
        "topic": KEY.topic, "partition": KEY.partition, "subscription": "billing",
        "mark_delete": mark_delete, "individually_deleted": individually_deleted,
        "ledgers": [{"ledger_id": i, "entries": n} for i, n in ledgers], "observed_at": at}]))


class RecordingEmitter:
    def __init__(self) -> None:
        self.sent: list[SafePlan] = []

    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None) -> EmitResult:
        self.sent.append(safe)
        return EmitResult(safe.plan.to_ack.count_entries(ledgers), None, 1)


def sink_config(tmp_path: Path, **tables: object) -> Config:
    """Clusters A -> B, KEY's subscription ``billing``; ``tables``: more table options."""
    return parse_config({
        "clusters": {"source": {"name": "A", "service_url": "pulsar://h:6650",
                                "admin_url": "http://h:8080"},
                     "target": {"name": "B", "service_url": "pulsar://h:6651",
                                "admin_url": "http://h:8081"}},
        "topics": [{"topic": KEY.topic, "subscriptions": ["billing"]}],
        "tables": {"path": str(tmp_path / "tables"), **tables},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "emission": {"rewind_policy": "halt"}})


def new_sink(config: Config, store: TableStore, emitter: RecordingEmitter,
             target: list[CursorState],
             created_at: Callable[[str], TopicCreation] | None = None,
             rewind_policy: RewindPolicy = "halt") -> SyncSink:
    """A fresh sink and step, as after a restart; the target reports ``target[0]``."""
    step = SyncStep(StepSettings(rewind_policy=rewind_policy), emitter, lambda t, s: target[0],
                    source_created_at=created_at)
    return SyncSink(sync_sink_settings(config), store, step, None)




def store_with_mapping(config: Config) -> TableStore:
    """The tables, with KEY's source 5:0..5:19 mapped to target 7:0..7:19."""
    store = open_store("delta-rs", config.tables.path)
    store.ensure_all()
    store.append("mappings", mapping_rows(KEY, TopicMapping(SegmentSet.of(
        [Segment(5, 0, 7, 0, 20)])), source_cluster="A", target_cluster="B", written_at=T0),
        app_id="m", batch_id=0)
    return store
