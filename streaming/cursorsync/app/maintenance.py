"""Table maintenance on a schedule: compaction, vacuum, and retention of the history tables.

Each sink maintains the tables it writes, between its own batches, so a
maintenance commit never races the writer of the same table: the mapping
sink merges the ``mappings`` rows into their union, without what the ``live``
rows say names deleted ledgers only (:func:`cursorsync.tables.mappings_table.merge_rows`),
compacts and vacuums it, the sync sink also expires old ``cursor_states`` and
``sync_progress`` rows. Expiry keeps each (clusters, topic partition,
subscription)'s newest row however old it is (:meth:`TableStore.expire`):
the executors read a subscription's previous state from it.

A maintenance failure is logged and counted (``cursorsync_errors_total{stage="tables"}``)
and tried again one interval later; it never stops the sync, because
nothing it does is needed for the next batch.

Between two runs, each batch appends a small file to each table it writes (at a 0.5 s
trigger, 7,200 an hour). Every ``compact_every_batches`` batches the tables are compacted
(nothing else), so appends, checkpoints and reads keep working over a bounded number of
files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cursorsync.app.metrics import Metrics
from cursorsync.app.settings import TablesConfig
from cursorsync.tables.mappings_table import merge_rows
from cursorsync.tables.schema import TableName
from cursorsync.tables.store import TableStore

log = logging.getLogger(__name__)

#: The rows of one subscription's history: the newest per key is never expired.
SUBSCRIPTION_KEY = ("source_cluster", "target_cluster", "topic", "partition", "subscription")
#: History tables, with the column their retention is measured on.
TIME_COLUMNS: dict[TableName, str] = {"cursor_states": "observed_at",
                                      "sync_progress": "emitted_at",
                                      "builtin_updates": "written_at",
                                      "mapping_waits": "written_at"}
#: The rows of one partition's waits: the newest per partition is never expired.
PARTITION_KEY = ("source_cluster", "target_cluster", "topic", "partition")


class TableMaintenance:
    """Runs maintenance of ``tables`` when :meth:`run_if_due` finds an interval has passed.

    The first run comes one interval after start: a job that restarts often does not
    rewrite its tables at every start. In between, every ``compact_every_batches`` calls
    (one per batch) compact the tables.
    """

    def __init__(self, store: TableStore, tables: tuple[TableName, ...], config: TablesConfig,
                 metrics: Metrics | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.store = store
        self.tables = tables
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._now = now
        self.next_at = clock() + config.maintenance_interval_s
        self.batches = 0  # since the last compaction

    def retention_s(self, table: TableName) -> float | None:
        """How long ``table``'s rows are kept; None for a table kept whole."""
        if table in ("cursor_states", "builtin_updates", "mapping_waits"):
            return self.config.cursor_states_retention_s
        if table == "sync_progress":
            return self.config.sync_progress_retention_s
        return None

    def run_if_due(self) -> bool:
        """Called after each batch: maintain every table if the interval has passed, else
        compact them if ``compact_every_batches`` batches have passed; True when either
        ran."""
        self.batches += 1
        if self._clock() >= self.next_at:
            self.next_at = self._clock() + self.config.maintenance_interval_s
            self.batches = 0
            for table in self.tables:
                self.run(table)
            return True
        every = self.config.compact_every_batches
        if not every or self.batches < every:
            return False
        self.batches = 0
        for table in self.tables:
            self.compact(table)
        return True

    def compact(self, table: TableName) -> None:
        """Compact ``table`` alone; a failure is logged and counted."""
        t0 = time.perf_counter()
        try:
            if not self.store.exists(table):
                return
            if table == "mappings":
                merge_rows(self.store, before=self._now())
            stats = self.store.compact(table)
        except Exception as err:
            log.warning("compaction of table %s failed (tried again in %d batches): %s",
                        table, self.config.compact_every_batches, err)
            if self.metrics:
                self.metrics.record_error("tables")
            return
        counts = stats.get("metrics", stats)  # delta-spark nests them, delta-rs does not
        log.info("compacted table %s in %.1f s: %s files into %s", table,
                 time.perf_counter() - t0, counts.get("numFilesRemoved", "?"),
                 counts.get("numFilesAdded", "?"))

    def run(self, table: TableName) -> None:
        """Expire (history tables), compact and vacuum ``table``; failures are logged."""
        t0 = time.perf_counter()
        try:
            if not self.store.exists(table):
                return
            expired = 0
            keep_s = self.retention_s(table)
            if keep_s is not None:
                expired = self.store.expire(
                    table, time_column=TIME_COLUMNS[table],
                    before=self._now() - timedelta(seconds=keep_s),
                    key_columns=PARTITION_KEY if table == "mapping_waits" else SUBSCRIPTION_KEY)
            if table == "mappings":
                expired = merge_rows(self.store, before=self._now())
            self.store.compact(table)
            removed = self.store.vacuum(table, dry_run=False)
        except Exception as err:
            log.warning("maintenance of table %s failed (tried again in %.0f s): %s",
                        table, self.config.maintenance_interval_s, err)
            if self.metrics:
                self.metrics.record_error("tables")
            return
        if self.metrics:
            self.metrics.record_maintenance(table, expired)
        log.info("maintained table %s in %.1f s: %d rows expired or merged, %d files vacuumed",
                 table, time.perf_counter() - t0, expired, len(removed))
