"""Read-only queries over the Delta tables: where each subscription stands.

Nothing here needs Spark or a broker: open the tables with the delta-rs store
(``open_store("delta-rs", path)``; it reads tables delta-spark wrote, too)
and ask.

* :func:`subscription_status`: per (topic, partition, subscription) the
  latest ``sync_progress`` row (what was emitted on the target) beside the
  latest ``cursor_states`` row (what the source cursor looked like) and the
  partition's mapping coverage; :func:`subscription_summaries` aggregates them
  per subscription.
* :func:`cursorsync.app.lookup.lookup`: one source position -> its target position.

Each result renders as an aligned plain-text table or as JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import TopicMapping
from cursorsync.errors import ConfigError, CursorSyncError
from cursorsync.pulsar.topics import TopicName
from cursorsync.tables import TABLES, RowFilter, TableStore
from cursorsync.tables.mappings_table import load_mappings
from cursorsync.tables.rows import latest_waits

#: The outcome status shows for a subscription the job only planned for: nothing acked.
DRY_RUN = "dry-run"


class TablesNotFoundError(CursorSyncError):
    """None of the tables a query needs exists under the store's root."""


# ------------------------------------------------------------------ topics


def partition_key(topic: str, partition: int | None = None) -> PartitionKey:
    """A topic name as the tables key it: base topic without ``-partition-i``, and the index.

    Accepts ``persistent://t/ns/x``, ``t/ns/x``, a short ``x`` (public/default)
    and ``...x-partition-3``. ``partition`` may name the index instead of the
    suffix; giving both with different indexes is an error.
    """
    name = TopicName.parse(topic)
    suffix = name.partition
    if partition is not None and suffix >= 0 and partition != suffix:
        raise ConfigError(
            f"topic {topic!r} names partition {suffix} but partition {partition} was given"
        )
    if partition is not None and partition < -1:
        raise ConfigError(f"partition {partition} is not valid: use -1 (not partitioned) or >= 0")
    index = suffix if suffix >= 0 else (-1 if partition is None else partition)
    return PartitionKey(str(name.base), index)


# ------------------------------------------------------------------ status


@dataclass(frozen=True)
class StatusRow:
    """Where one subscription on one topic partition stands; None where nothing is recorded."""

    topic: str
    partition: int
    subscription: str
    source_cluster: str
    target_cluster: str
    # latest cursor_states row: the source cursor
    source_mark_delete: Position | None = None
    source_ranges: int | None = None
    observed_at: datetime | None = None
    # latest sync_progress row: what was emitted on the target
    target_mark_delete: Position | None = None
    #: What the sync did: the plan's outcome (``exact``, ``partial``, ...), or ``dry-run``
    #: when the job acked nothing (the plan's outcome is then ``planned_outcome``).
    outcome: str | None = None
    planned_outcome: str | None = None
    unmapped_acked_entries: int | None = None
    rewound_entries: int | None = None
    lag_ms: int | None = None
    emitted_at: datetime | None = None
    #: When the source state the last plan was made from was last known current
    #: (``sync_progress.source_observed_at``).
    planned_from: datetime | None = None
    dry_run: bool | None = None
    # newest builtin_updates row: where Pulsar's own replicated subscription moved it on b
    builtin_mark_delete: Position | None = None
    # mappings: coverage of the topic partition
    segments: int = 0
    mapped_entries: int = 0
    last_mapped_source: Position | None = None
    # newest mapping_waits row: skipped target ids the mapping has not classified yet
    skipped_waiting: int | None = None

    @property
    def key(self) -> PartitionKey:
        return PartitionKey(self.topic, self.partition)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: positions as ``L:E``, times as ISO 8601 UTC."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "partition_topic": self.key.concrete_topic(),
            "subscription": self.subscription,
            "source_cluster": self.source_cluster,
            "target_cluster": self.target_cluster,
            "source_mark_delete": pos_text(self.source_mark_delete),
            "source_individually_deleted_ranges": self.source_ranges,
            "observed_at": iso_time(self.observed_at),
            "target_mark_delete": pos_text(self.target_mark_delete),
            "builtin_mark_delete": pos_text(self.builtin_mark_delete),
            "outcome": self.outcome,
            "planned_outcome": self.planned_outcome,
            "unmapped_acked_entries": self.unmapped_acked_entries,
            "rewound_entries": self.rewound_entries,
            "lag_ms": self.lag_ms,
            "emitted_at": iso_time(self.emitted_at),
            "dry_run": self.dry_run,
            "segments": self.segments,
            "mapped_entries": self.mapped_entries,
            "last_mapped_source": pos_text(self.last_mapped_source),
            "skipped_waiting": self.skipped_waiting,
        }


@dataclass(frozen=True)
class SubscriptionSummary:
    """One subscription over all its topic partitions."""

    subscription: str
    partitions: int
    #: Partitions with a cursor state but no sync recorded yet.
    never_synced: int
    unmapped_acked_entries: int
    rewound_entries: int
    max_lag_ms: int | None
    #: The oldest "latest sync" over the partitions: how stale the worst one is.
    oldest_sync: datetime | None
    dry_run: bool
    #: Skipped target ids the mapping has yet to classify on the subscription's partitions.
    skipped_waiting: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "subscription": self.subscription,
            "partitions": self.partitions,
            "never_synced": self.never_synced,
            "unmapped_acked_entries": self.unmapped_acked_entries,
            "rewound_entries": self.rewound_entries,
            "max_lag_ms": self.max_lag_ms,
            "oldest_sync": iso_time(self.oldest_sync),
            "dry_run": self.dry_run,
            "skipped_waiting": self.skipped_waiting,
        }


_KEY = ("topic", "partition", "subscription")


def subscription_status(
    store: TableStore,
    *,
    topic: str | None = None,
    subscription: str | None = None,
    source_cluster: str | None = None,
    target_cluster: str | None = None,
) -> list[StatusRow]:
    """The latest state of every recorded (topic, partition, subscription), sorted by that key.

    ``topic`` may be a partitioned topic (all its partitions) or one
    ``-partition-i``; the cluster names restrict to one replication pair
    (tables shared by several pairs keep them apart). Raises
    :class:`TablesNotFoundError` when neither ``sync_progress`` nor
    ``cursor_states`` exists under the store's root.
    """
    if not (store.exists("sync_progress") or store.exists("cursor_states")):
        raise TablesNotFoundError(
            f"no cursorsync tables under {store.root} (expected "
            f"{', '.join(TABLES)}); check tables.path, or let `cursorsync run` write a batch first"
        )
    flt = _filter(topic, subscription, source_cluster, target_cluster)
    progress, cursors = _latest_rows(store, flt)
    keys = sorted(set(progress) | set(cursors))
    builtin = _builtin_positions(store, flt)
    mapping_filter = _filter(topic, None, source_cluster, target_cluster)
    coverage = _coverage(store, mapping_filter, {PartitionKey(t, p) for t, p, _ in keys})
    waits = latest_waits(store.read("mapping_waits", mapping_filter))  # empty: no table
    return [replace(_status_row(k, progress.get(k), cursors.get(k), builtin.get(k),
                                coverage.get(PartitionKey(k[0], k[1]), (0, 0, None))),
                    skipped_waiting=waits.get(PartitionKey(k[0], k[1]))) for k in keys]


def _latest_rows(store: TableStore, flt: Any) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Each (topic, partition, subscription)'s newest ``sync_progress`` and
    ``cursor_states`` rows."""
    progress = _latest(store.read("sync_progress", flt, columns=[
        *_KEY, "source_cluster", "target_cluster", "target_mark_delete_ledger",
        "target_mark_delete_entry", "outcome", "unmapped_acked_entries", "rewound_entries",
        "lag_ms", "emitted_at", "source_observed_at", "dry_run", "batch_id"]), "emitted_at")
    cursors_t = store.read("cursor_states", flt, columns=[
        *_KEY, "source_cluster", "target_cluster", "mark_delete_ledger", "mark_delete_entry",
        "individually_deleted_ranges", "observed_at", "batch_id"])
    cursors_t = cursors_t.append_column(
        "ranges", pc.list_value_length(cursors_t.column("individually_deleted_ranges"))
    ).drop_columns(["individually_deleted_ranges"])
    return progress, _latest(cursors_t, "observed_at")


def _status_row(k: tuple[str, int, str], p: dict[str, Any] | None, c: dict[str, Any] | None,
                builtin: Position | None,
                coverage: tuple[int, int, Position | None]) -> StatusRow:
    """One key's row from its newest progress and cursor rows (either may be missing)."""
    clusters = p if p is not None else c
    assert clusters is not None
    segs, mapped, last = coverage
    return StatusRow(
        topic=k[0], partition=k[1], subscription=k[2],
        source_cluster=clusters["source_cluster"], target_cluster=clusters["target_cluster"],
        source_mark_delete=None if c is None else Position(
            c["mark_delete_ledger"], c["mark_delete_entry"]),
        source_ranges=None if c is None else c["ranges"],
        observed_at=None if c is None else c["observed_at"],
        target_mark_delete=None if p is None else Position(
            p["target_mark_delete_ledger"], p["target_mark_delete_entry"]),
        outcome=None if p is None else DRY_RUN if p["dry_run"] else p["outcome"],
        planned_outcome=None if p is None else p["outcome"],
        unmapped_acked_entries=None if p is None else p["unmapped_acked_entries"],
        rewound_entries=None if p is None else p["rewound_entries"],
        lag_ms=None if p is None else p["lag_ms"],
        emitted_at=None if p is None else p["emitted_at"],
        planned_from=None if p is None else p["source_observed_at"],
        dry_run=None if p is None else p["dry_run"],
        builtin_mark_delete=builtin,
        segments=segs, mapped_entries=mapped, last_mapped_source=last,
    )


def _builtin_positions(store: TableStore, flt: RowFilter) -> dict[tuple[str, int, str], Position]:
    """Per (topic, partition, subscription), where the newest UPDATE marker read on the target
    moves it (Pulsar's own replicated subscriptions); empty without the table."""
    if not store.exists("builtin_updates"):
        return {}
    rows = store.read("builtin_updates", flt, columns=[
        *_KEY, "target_ledger", "target_entry", "marker_ledger", "marker_entry"]).to_pylist()
    newest: dict[tuple[str, int, str], tuple[Position, Position]] = {}
    for r in rows:
        k = (r["topic"], r["partition"], r["subscription"])
        marker = Position(r["marker_ledger"], r["marker_entry"])
        if k not in newest or marker > newest[k][0]:
            newest[k] = (marker, Position(r["target_ledger"], r["target_entry"]))
    return {k: v[1] for k, v in newest.items()}


def subscription_summaries(rows: Iterable[StatusRow]) -> list[SubscriptionSummary]:
    """Aggregate per subscription: sum of unmapped, max lag, oldest last sync."""
    groups: dict[str, list[StatusRow]] = {}
    for r in rows:
        groups.setdefault(r.subscription, []).append(r)
    out = []
    for sub in sorted(groups):
        g = groups[sub]
        lags = [r.lag_ms for r in g if r.lag_ms is not None]
        syncs = [r.emitted_at for r in g if r.emitted_at is not None]
        out.append(SubscriptionSummary(
            subscription=sub,
            partitions=len(g),
            never_synced=sum(1 for r in g if r.emitted_at is None),
            unmapped_acked_entries=sum(r.unmapped_acked_entries or 0 for r in g),
            rewound_entries=sum(r.rewound_entries or 0 for r in g),
            max_lag_ms=max(lags) if lags else None,
            oldest_sync=min(syncs) if syncs else None,
            dry_run=any(r.dry_run for r in g),
            skipped_waiting=sum(r.skipped_waiting or 0 for r in g),
        ))
    return out


def _filter(
    topic: str | None, subscription: str | None, source: str | None, target: str | None
) -> RowFilter:
    key = partition_key(topic) if topic is not None else None
    partition = None
    if key is not None and key.partition >= 0:
        partition = key.partition
    return RowFilter.of(
        topic=None if key is None else key.topic, partition=partition,
        subscription=subscription, source_cluster=source, target_cluster=target,
    )


def _latest(table: pa.Table, time_column: str) -> dict[tuple[str, int, str], dict[str, Any]]:
    """The last row per (topic, partition, subscription) by (time, batch_id)."""
    if table.num_rows == 0:
        return {}
    order = [(c, "ascending") for c in (*_KEY, time_column, "batch_id")]
    t = table.sort_by(order)
    t = t.append_column("__row", pa.array(np.arange(t.num_rows, dtype=np.int64)))
    last = t.group_by(list(_KEY), use_threads=False).aggregate([("__row", "max")])
    picked = t.take(last.column("__row_max")).drop_columns(["__row"])
    return {(r["topic"], r["partition"], r["subscription"]): r for r in picked.to_pylist()}


def _coverage(
    store: TableStore, flt: RowFilter, keys: set[PartitionKey]
) -> dict[PartitionKey, tuple[int, int, Position | None]]:
    """(segments, mapped entries, last mapped source position) per wanted partition."""
    if not keys:
        return {}
    mappings, _ = load_mappings(store, source_cluster=flt.source_cluster,
                                target_cluster=flt.target_cluster,
                                topics={k.topic for k in keys})
    return {k: _coverage_of(m) for k, m in mappings.items() if k in keys}


def _coverage_of(mapping: TopicMapping) -> tuple[int, int, Position | None]:
    segs = mapping.segments
    if len(segs) == 0:
        return 0, 0, None
    last = segs.rows[-1]
    return len(segs), segs.entry_count(), Position(int(last[0]), int(last[1] + last[4] - 1))


# ------------------------------------------------------------------ rendering


def pos_text(p: Position | None) -> str | None:
    return None if p is None else str(p)


def iso_time(t: datetime | None, *, seconds: bool = False) -> str | None:
    """ISO 8601 in UTC with a Z, or None."""
    if t is None:
        return None
    text = t.isoformat(timespec="seconds" if seconds else "auto")
    return text.replace("+00:00", "Z")


__all__ = [
    "StatusRow",
    "SubscriptionSummary",
    "TablesNotFoundError",
    "iso_time",
    "partition_key",
    "pos_text",
    "subscription_status",
    "subscription_summaries",
]
