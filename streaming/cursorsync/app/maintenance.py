"""Table maintenance on a schedule: compaction, vacuum, and retention of the history tables.

Each sink maintains the tables it writes, between its own batches, so a
maintenance commit never races the writer of the same table: the mapping
sink compacts and vacuums ``mappings`` (kept whole: the sync needs every
segment), the sync sink also expires old ``cursor_states`` and
``sync_progress`` rows. Expiry keeps each (clusters, topic partition,
subscription)'s newest row however old it is (:meth:`TableStore.expire`):
the executors read a subscription's previous state from it.

A maintenance failure is logged and counted (``cursorsync_errors_total{stage="tables"}``)
and tried again one interval later; it never stops the sync, because
nothing it does is needed for the next batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cursorsync.app.metrics import Metrics
from cursorsync.app.settings import TablesConfig
from cursorsync.tables.schema import TableName
from cursorsync.tables.store import TableStore

log = logging.getLogger(__name__)

#: The rows of one subscription's history: the newest per key is never expired.
SUBSCRIPTION_KEY = ("source_cluster", "target_cluster", "topic", "partition", "subscription")
#: History tables, with the column their retention is measured on.
TIME_COLUMNS: dict[TableName, str] = {"cursor_states": "observed_at",
                                      "sync_progress": "emitted_at"}


class TableMaintenance:
    """Runs maintenance of ``tables`` when :meth:`run_if_due` finds an interval has passed.

    The first run comes one interval after start: a job that restarts often does not
    rewrite its tables at every start.
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

    def retention_s(self, table: TableName) -> float | None:
        """How long ``table``'s rows are kept; None for a table kept whole."""
        if table == "cursor_states":
            return self.config.cursor_states_retention_s
        if table == "sync_progress":
            return self.config.sync_progress_retention_s
        return None

    def run_if_due(self) -> bool:
        """Maintain every table if the interval has passed; True when it ran."""
        if self._clock() < self.next_at:
            return False
        self.next_at = self._clock() + self.config.maintenance_interval_s
        for table in self.tables:
            self.run(table)
        return True

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
                    before=self._now() - timedelta(seconds=keep_s), key_columns=SUBSCRIPTION_KEY)
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
        log.info("maintained table %s in %.1f s: %d rows expired, %d files vacuumed",
                 table, time.perf_counter() - t0, expired, len(removed))
