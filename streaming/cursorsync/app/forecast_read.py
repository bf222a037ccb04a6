"""The redelivery forecast's reading: the tables, then the source's cursors and the entries
in question from its admin API (:mod:`cursorsync.app.forecast` makes the figures)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cursorsync.app import forecast as figures
from cursorsync.app.forecast import (
    EntryFacts,
    PartitionForecast,
    Questions,
    Sources,
    partition_forecast,
    questions,
)
from cursorsync.app.status import StatusRow
from cursorsync.core.cursor import CursorState
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.admin import AdminClient
from cursorsync.pulsar.batch_acks import BatchAcks, fetch_every_batch
from cursorsync.pulsar.stats import TopicInternalStats
from cursorsync.pulsar.topics import TopicName
from cursorsync.tables import RowFilter, TableStore
from cursorsync.tables.mappings_table import load_mappings
from cursorsync.tables.rows import cursor_states

if TYPE_CHECKING:
    from cursorsync.app.settings import Config

log = logging.getLogger(__name__)


def last_states(store: TableStore, rows: Sequence[StatusRow]
                ) -> dict[tuple[PartitionKey, str], CursorState]:
    """Each row's source cursor as its newest ``cursor_states`` row recorded it."""
    out: dict[tuple[PartitionKey, str], tuple[Any, CursorState]] = {}
    if not rows or not store.exists("cursor_states"):
        return {}
    wanted = {(r.key, r.subscription) for r in rows}
    pair = rows[0]
    flt = RowFilter.of(topic=sorted({r.topic for r in rows}),
                       source_cluster=pair.source_cluster, target_cluster=pair.target_cluster)
    for seen in cursor_states(store.read("cursor_states", flt)):
        k = (seen.key, seen.subscription)
        if k in wanted and (k not in out or seen.observed_at >= out[k][0]):
            out[k] = (seen.observed_at, seen.state)
    return {k: v[1] for k, v in out.items()}


def _read_live(admin: AdminClient, topics: list[str]
               ) -> dict[str, TopicInternalStats | str]:
    """internalStats per partition, or why not (one partition failing spoils no other)."""
    def one(t: TopicName) -> TopicInternalStats | str:
        try:
            return admin.internal_stats(t)
        except CursorSyncError as err:
            return f"not read: {err}"

    return admin.map_concurrently(one, topics)


def _read_entries(source: AdminClient, wanted: Sequence[tuple[str, Position]],
                  ) -> dict[tuple[str, Position], EntryFacts]:
    def one(w: tuple[str, Position]) -> EntryFacts | None:
        try:
            raw = source.raw_entry(w[0], w[1].ledger, w[1].entry)
        except CursorSyncError as err:
            log.warning("forecast: entry %s of %s not read: %s", w[1], w[0], err)
            return None
        return None if raw is None else EntryFacts.of(raw)

    found = source.map_each(one, wanted)
    return {w: f for w, f in zip(wanted, found, strict=True) if f is not None}


def forecast(store: TableStore, rows: Sequence[StatusRow], *,
             source: AdminClient | None = None, target: AdminClient | None = None,
             not_read: str = "no broker access") -> list[PartitionForecast]:
    """The forecast of every status row. With ``source`` the source cursors are read now
    and the entries in question looked up (``target``: its ledgers, to leave out what it
    shows was never replicated); without, acks since the last sync are unknown."""
    if not rows:
        return []
    pair = rows[0]
    mappings, _ = load_mappings(store, source_cluster=pair.source_cluster,
                                target_cluster=pair.target_cluster,
                                topics={r.topic for r in rows})
    lasts = last_states(store, rows)
    topics = sorted({r.key.concrete_topic() for r in rows})
    live = {} if source is None else _read_live(source, topics)
    tlive = {} if source is None or target is None else _read_live(target, topics)
    srcs = []
    for r in rows:
        t = r.key.concrete_topic()
        s, ts = live.get(t, not_read), tlive.get(t)
        cur = None if isinstance(s, str) else s.subscriptions.get(r.subscription)
        reason = s if isinstance(s, str) else f"no subscription {r.subscription} on the source"
        srcs.append(Sources(lasts.get((r.key, r.subscription)), mappings.get(r.key),
                            None if cur is None else cur.state,
                            None if isinstance(s, str) else s.last_confirmed_entry, reason,
                            None if ts is None or isinstance(ts, str) else ts.ledgers))
    index_acks = None if source is None else batch_index_acks(source)
    if source is not None and index_acks:
        srcs = _with_batches(rows, srcs, source, target, tlive)
    qs = [questions(s, r) for r, s in zip(rows, srcs, strict=True)]
    facts: dict[tuple[str, Position], EntryFacts] = {}
    if source is not None and any(s.now is not None for s in srcs):
        facts = _read_entries(source, _wanted(rows, qs, srcs))
    return [partition_forecast(r, s, q, _facts_of(r, facts), index_acks=index_acks)
            for r, s, q in zip(rows, srcs, qs, strict=True)]


def _with_batches(rows: Sequence[StatusRow], srcs: list[Sources], source: AdminClient,
                  target: AdminClient | None, tlive: Mapping[str, TopicInternalStats | str],
                  ) -> list[Sources]:
    """The sources with the partly acked batches cursorsync's broker plugin reads on each
    cluster, and the target cursors' acked entries (a cursor left as it was where a read
    fails, or the plugin is absent: its figure stays a bound)."""
    keys = [(r.key.concrete_topic(), r.subscription) for r, s in zip(rows, srcs, strict=True)
            if s.now is not None]
    on_source = _read_batches(source, keys)
    if not any(b is not None for b in on_source.values()):
        return srcs
    wanted = [k for k, b in on_source.items() if b is not None and b.batches]
    on_target = {} if target is None else _read_batches(target, wanted)
    out = []
    for r, s in zip(rows, srcs, strict=True):
        k = (r.key.concrete_topic(), r.subscription)
        got = on_source.get(k)
        if got is None:
            out.append(s)
            continue
        held, ts = on_target.get(k), tlive.get(k[0])
        cur = None if ts is None or isinstance(ts, str) else ts.subscriptions.get(k[1])
        both = held is not None and cur is not None
        out.append(replace(
            s, source_batches=got.batches,
            target_batches=None if held is None or not both else {
                b.position: b for b in held.batches},
            target_acked=None if cur is None or not both else cur.state.acked()))
    return out


def _read_batches(admin: AdminClient, keys: Sequence[tuple[str, str]]
                  ) -> dict[tuple[str, str], BatchAcks | None]:
    """Each (topic partition, subscription)'s partly acked batches from the plugin of
    ``admin``'s cluster (None: not read whole; the first failure is logged)."""
    said: list[str] = []

    def one(k: tuple[str, str]) -> BatchAcks | None:
        try:
            got = fetch_every_batch(admin, k[0], k[1])
        except CursorSyncError as err:
            if not said:
                said.append(str(err))
                log.info("forecast: batch indexes not read (%s): partly acked batches stay "
                         "a bound", err)
            return None
        return None if got.truncated else got

    return dict(zip(keys, admin.map_each(one, keys), strict=True))


#: The broker setting that keeps a partially acked batch's acked messages (4.1's default).
BATCH_INDEX_ACKS = "acknowledgmentAtBatchIndexLevelEnabled"


def batch_index_acks(admin: AdminClient) -> bool | None:
    """Whether the cluster's brokers keep batch-index acks, from the runtime configuration
    of the broker ``admin`` reaches (None: not readable, e.g. without super-user rights;
    the brokers of one cluster share it, as Pulsar expects)."""
    try:
        conf = admin.get_json("/admin/v2/brokers/configuration/runtime",
                              "the brokers' runtime configuration")
    except CursorSyncError as err:
        log.info("%s not read (%s): the forecast does not say whether the source's brokers "
                 "keep batch-index acks", BATCH_INDEX_ACKS, err)
        return None
    value = conf.get(BATCH_INDEX_ACKS) if isinstance(conf, dict) else None
    return None if value is None else str(value).strip().lower() == "true"


def forecast_now(store: TableStore, rows: Sequence[StatusRow], config: Config
                 ) -> list[PartitionForecast]:
    """:func:`forecast` with the configured clusters' admin APIs (two attempts a request):
    an unreachable source leaves the live figures unknown, with the error as the reason."""
    from cursorsync.app.connect import admin_config

    try:
        clients = [AdminClient(replace(admin_config(c), attempts=2))
                   for c in (config.source, config.target)]
    except CursorSyncError as err:  # no usable admin URL: what the tables say
        return forecast(store, rows, not_read=f"source not read: {err}")
    try:
        return forecast(store, rows, source=clients[0], target=clients[1])
    finally:
        for c in clients:
            c.close()


def _facts_of(row: StatusRow, facts: Mapping[tuple[str, Position], EntryFacts]
              ) -> dict[Position, EntryFacts]:
    t = row.key.concrete_topic()
    return {p: f for (topic, p), f in facts.items() if topic == t}


def _wanted(rows: Sequence[StatusRow], qs: Sequence[Questions], srcs: Sequence[Sources],
            ) -> list[tuple[str, Position]]:
    """Entries to read, each once, within :data:`figures.FORECAST_LOOKUPS`: acked ones first
    (every partition), then unacked ones."""
    seen: dict[tuple[str, Position], None] = {}
    for phase in ("acked", "unacked"):
        for r, q, s in zip(rows, qs, srcs, strict=True):
            if s.now is None:
                continue
            t = r.key.concrete_topic()
            parts = (q.unmapped, q.since) if phase == "acked" else (q.unacked,)
            for which in parts:
                listed = q.listed(which) or []
                if len(seen) + len(listed) > figures.FORECAST_LOOKUPS:
                    continue  # a question is read whole or not at all
                seen.update(((t, p), None) for p in listed)
    return list(seen)


__all__ = ["forecast", "forecast_now", "last_states"]
