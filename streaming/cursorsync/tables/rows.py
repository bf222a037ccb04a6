"""Domain values <-> table rows, so the job never spells a column name itself.

Writers build an Arrow table per batch (``mapping_rows``, ``cursor_state_rows``,
``sync_progress_rows``) and hand it to :meth:`TableStore.append`, which adds
``schema_version``, ``topic_bucket`` and ``batch_id``. Readers turn rows back
into values (``topic_mappings``, ``cursor_states``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core import sorting
from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.packed import NO_ANCHORS, NO_RUNS
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import (
    BuiltinUpdate,
    HaltRecord,
    ObservedCursor,
    PartitionKey,
    SyncRecord,
)
from cursorsync.core.retention import live_part
from cursorsync.core.segments import (
    Runs,
    SegmentSet,
    TopicMapping,
    evidence_mask,
    evidence_names,
)
from cursorsync.tables.schema import TableName, load_schema

_DERIVED = ("schema_version", "topic_bucket", "batch_id")
#: Which side each run kind lives on (TopicMapping's docstring).
_RUN_SIDE = {"skippable": "target", "foreign": "target", "unreplicated": "source",
             "unpaired": "target"}


def row_schema(table: TableName) -> pa.Schema:
    """The columns the row helpers produce: the schema file's minus those the store derives."""
    return _arrow_schema(table)


def _arrow_schema(table: TableName) -> pa.Schema:
    """The schema file's columns minus the ones the store derives."""
    schema = load_schema(table).arrow()
    return pa.schema([f for f in schema if f.name not in _DERIVED])


# ---------------------------------------------------------------- mappings


def mapping_rows(
    key: PartitionKey,
    mapping: TopicMapping,
    *,
    source_cluster: str,
    target_cluster: str,
    written_at: datetime,
    live: tuple[int | None, int | None] | None = None,
) -> pa.Table:
    """Rows for one topic partition's mapping: segments, then each kind of run; and with
    ``live`` (the first live source and target ledgers), a ``live`` row, after which readers
    drop what names only ledgers before them (:mod:`cursorsync.core.retention`)."""
    return mappings_rows([(key, mapping, live)], source_cluster=source_cluster,
                         target_cluster=target_cluster, written_at=written_at)


#: The kinds of a mapping's rows, in the order each partition's rows are written.
_KINDS = ("segment", "anchor", *_RUN_SIDE, "live")
_SIDES = ("source_ledger", "source_entry", "target_ledger", "target_entry")


def mappings_rows(
    items: Iterable[tuple[PartitionKey, TopicMapping, tuple[int | None, int | None] | None]],
    *,
    source_cluster: str,
    target_cluster: str,
    written_at: datetime,
) -> pa.Table:
    """The rows of many topic partitions' mappings (each ``(key, mapping, live)`` as
    :func:`mapping_rows` takes them), partition after partition in the order given, each
    partition's rows in :func:`mapping_rows`' order. Each column is built once for all of
    them: a batch's mapping rows cost a pass over its partitions, not an Arrow table each."""
    schema = _arrow_schema("mappings")
    keys: list[PartitionKey] = []
    # Per kind: each partition's rows (columns: the kind's _SIDES, then count) and, for
    # segments, their evidence codes.
    blocks: dict[str, list[np.ndarray]] = {kind: [] for kind in _KINDS}
    owners: dict[str, list[int]] = {kind: [] for kind in _KINDS}
    codes: list[np.ndarray] = []
    for i, (key, mapping, live) in enumerate(items):
        keys.append(key)
        seg = mapping.segments.rows
        if len(seg):
            blocks["segment"].append(seg[:, :5])
            owners["segment"].append(i)
            codes.append(np.asarray(mapping.segments.evidence_codes))
        anchors = mapping.anchors.rows
        if len(anchors):
            blocks["anchor"].append(anchors[:, :4])
            owners["anchor"].append(i)
        for kind in _RUN_SIDE:
            r = getattr(mapping, kind).rows
            if len(r):
                blocks[kind].append(r[:, :3])
                owners[kind].append(i)
        if live is not None:
            blocks["live"].append(np.array([[-1 if live[0] is None else live[0],
                                             -1 if live[1] is None else live[1]]], object))
            owners["live"].append(i)
    parts: list[dict[str, Any]] = []
    for rank, kind in enumerate(_KINDS):
        if not blocks[kind]:
            continue
        rows = np.concatenate(blocks[kind])
        n = len(rows)
        owner = np.repeat(np.asarray(owners[kind], np.int64), [len(b) for b in blocks[kind]])
        # The sort key: each partition's rows together, its kinds in _KINDS order.
        part: dict[str, Any] = {"owner": owner, "key": owner * len(_KINDS) + rank,
                                "kind": np.full(n, kind, object)}
        none = np.zeros(n, bool)
        if kind == "segment":
            for j, name in enumerate(_SIDES):
                part[name] = (rows[:, j], ~none)
            part["count"] = rows[:, 4]
            # Named once per distinct evidence bit-set, as the readers decode them.
            distinct, each = np.unique(np.concatenate(codes), return_inverse=True)
            part["evidence"] = np.array([evidence_names(int(c)) for c in distinct],
                                        object)[each.reshape(-1)]
        elif kind == "anchor":
            for j, name in enumerate(_SIDES):
                part[name] = (rows[:, j], ~none)
            part["count"] = np.ones(n, np.int64)
            part["evidence"] = np.full(n, "snapshot", object)
        elif kind == "live":
            ledgers = rows.astype(np.int64)
            part["source_ledger"] = (ledgers[:, 0], ledgers[:, 0] >= 0)
            part["target_ledger"] = (ledgers[:, 1], ledgers[:, 1] >= 0)
            part["source_entry"] = part["target_entry"] = (np.zeros(n, np.int64), none)
            part["count"] = np.zeros(n, np.int64)
            part["evidence"] = np.full(n, None, object)
        else:
            side = _RUN_SIDE[kind]
            for name in _SIDES:
                on_side = name.startswith(side)
                part[name] = (rows[:, 1 if name.endswith("entry") else 0] if on_side
                              else np.zeros(n, np.int64), ~none if on_side else none)
            part["count"] = rows[:, 2]
            part["evidence"] = np.full(n, None, object)
        parts.append(part)
    if not parts:
        return schema.empty_table()
    # Stable: each kind's rows of a partition stay in the order the mapping keeps them.
    order = sorting.argsort(np.concatenate([p["key"] for p in parts]))

    def joined(name: str) -> np.ndarray:
        return np.concatenate([p[name] for p in parts])[order]

    owner = joined("owner")
    n = len(order)
    topics = np.array([k.topic for k in keys], object)
    partitions = np.array([k.partition for k in keys], np.int64)
    columns: dict[str, pa.Array] = {
        "topic": pa.array(topics[owner], pa.string()),
        "partition": pa.array(partitions[owner], pa.int32()),
        "source_cluster": pa.repeat(pa.scalar(source_cluster, pa.string()), n),
        "target_cluster": pa.repeat(pa.scalar(target_cluster, pa.string()), n),
        "kind": pa.array(joined("kind"), pa.string()),
        "count": pa.array(joined("count"), pa.int64()),
        "evidence": pa.array(joined("evidence"), pa.string()),
        "written_at": pa.repeat(pa.scalar(written_at, schema.field("written_at").type), n),
    }
    for name in _SIDES:
        values = np.concatenate([p[name][0] for p in parts])[order]
        valid = np.concatenate([p[name][1] for p in parts])[order]
        columns[name] = pa.array(values, pa.int64(), mask=~valid)
    return pa.table([columns[f.name] for f in schema], schema=schema)


def topic_mappings(rows: pa.Table) -> dict[PartitionKey, TopicMapping]:
    """Union every row of ``mappings`` per topic partition (rows from many batches overlap).

    Raises :class:`~cursorsync.errors.MappingConflictError` when two rows
    claim one entry differently.
    """
    out: dict[PartitionKey, TopicMapping] = {}
    if rows.num_rows == 0:
        return out
    # One sort and one conversion of every column to numpy; then each partition's rows are
    # one contiguous slice of plain arrays (Arrow calls per partition cost ~0.5 ms each).
    rows = rows.sort_by([("topic", "ascending"), ("partition", "ascending")])
    topics = _column(rows, "topic").dictionary_encode()
    topic_codes = topics.indices.to_numpy()
    topic_names = topics.dictionary.to_pylist()
    partitions = _column(rows, "partition").to_numpy()
    kinds = _column(rows, "kind").dictionary_encode()
    kind_codes = kinds.indices.to_numpy()
    code = {name: i for i, name in enumerate(kinds.dictionary.to_pylist())}
    ints = np.stack([pc.fill_null(_column(rows, n), 0).to_numpy() for n in _INT_COLUMNS],
                    axis=1).astype(np.int64)
    evidence = _column(rows, "evidence").dictionary_encode()
    masks = np.array([evidence_mask(e) for e in evidence.dictionary.to_pylist()] or [0],
                     np.int8)[pc.fill_null(evidence.indices, 0).to_numpy()]
    written = _column(rows, "written_at")
    at = pc.fill_null(written.cast(pa.int64()), np.iinfo(np.int64).min).to_numpy()
    per_second = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[written.type.unit]

    n = len(partitions)
    cut = np.flatnonzero((topic_codes[1:] != topic_codes[:-1])
                         | (partitions[1:] != partitions[:-1])) + 1
    starts, ends = np.concatenate(([0], cut)).tolist(), np.concatenate((cut, [n])).tolist()
    wanted = {kind: code.get(kind, -1) for kind in ("segment", "anchor", "live", *_RUN_SIDE)}
    for start, end in zip(starts, ends, strict=True):
        key = PartitionKey(topic_names[int(topic_codes[start])], int(partitions[start]))
        newest = int(at[start:end].max())
        out[key] = _one_mapping(kind_codes[start:end], ints[start:end], masks[start:end],
                                wanted, None if newest == np.iinfo(np.int64).min
                                else newest / per_second)
    return out


#: The integer columns of ``mappings``, in the order the readers stack them.
_INT_COLUMNS = ("source_ledger", "source_entry", "target_ledger", "target_entry", "count")
#: Their indices for each side's runs: (ledger, entry, count).
_SIDE_COLUMNS = {"source": [0, 1, 4], "target": [2, 3, 4]}


def _column(t: pa.Table, name: str) -> pa.Array:
    return t.column(name).combine_chunks()


def _one_mapping(kinds: np.ndarray, ints: np.ndarray, masks: np.ndarray,
                 code: dict[str, int], written_at: float | None) -> TopicMapping:
    """One partition's rows (their kind codes, integer columns and evidence bit-sets)."""
    seg = kinds == code["segment"]
    rows, ev = ints[seg], masks[seg]
    # Exact duplicates merge, continuations join, and the merged set is validated once
    # (overlaps that disagree raise MappingConflictError).
    segments = SegmentSet.collapsed(rows, ev) if len(rows) else SegmentSet()
    runs: dict[str, Runs] = {}
    for kind, side in _RUN_SIDE.items():
        arr = ints[kinds == code[kind]][:, _SIDE_COLUMNS[side]]
        runs[kind] = Runs().union(Runs(arr)) if len(arr) else NO_RUNS  # canonical runs
    anchors = ints[kinds == code["anchor"]][:, :4]
    mapping = TopicMapping(segments, runs["skippable"], runs["foreign"], runs["unreplicated"],
                           written_at=written_at, unpaired=runs["unpaired"],
                           anchors=Anchors(anchors) if len(anchors) else NO_ANCHORS)
    firsts = live_row_ledgers(ints[kinds == code["live"]])
    live = None if firsts is None else live_part(mapping, *firsts)
    return mapping if live is None else live


def live_row_ledgers(ints: np.ndarray) -> tuple[int | None, int | None] | None:
    """The first live (source, target) ledgers the ``live`` rows name (their integer
    columns, nulls as 0): the highest of each side, since ledgers are deleted oldest first
    and never come back; None without such rows, and None for a side none of them knows."""
    if not len(ints):
        return None
    source, target = int(ints[:, 0].max()), int(ints[:, 2].max())
    return source or None, target or None



# --------------------------------------------------------- builtin updates


def builtin_update_rows(updates: Iterable[BuiltinUpdate], *, source_cluster: str,
                        target_cluster: str, written_at: datetime) -> pa.Table:
    """One ``builtin_updates`` row per UPDATE marker read on the target."""
    return pa.Table.from_pylist([{
        "topic": u.key.topic, "partition": u.key.partition, "subscription": u.subscription,
        "source_cluster": source_cluster, "target_cluster": target_cluster,
        "target_ledger": u.target.ledger, "target_entry": u.target.entry,
        "marker_ledger": u.marker.ledger, "marker_entry": u.marker.entry,
        "written_at": written_at,
    } for u in updates], schema=_arrow_schema("builtin_updates"))


# ----------------------------------------------------------- mapping waits


def mapping_wait_rows(counts: Mapping[PartitionKey, int], *, source_cluster: str,
                      target_cluster: str, written_at: datetime) -> pa.Table:
    """One ``mapping_waits`` row per topic partition: its skipped target ids waiting."""
    return pa.Table.from_pylist([{
        "topic": k.topic, "partition": k.partition, "source_cluster": source_cluster,
        "target_cluster": target_cluster, "skipped_waiting": counts[k], "written_at": written_at,
    } for k in sorted(counts)], schema=_arrow_schema("mapping_waits"))


def latest_waits(rows: pa.Table) -> dict[PartitionKey, int]:
    """The newest ``mapping_waits`` count per topic partition (by batch id, then time)."""
    newest: dict[PartitionKey, tuple[int, datetime, int]] = {}
    for r in rows.to_pylist():
        key = PartitionKey(r["topic"], r["partition"])
        order = (r["batch_id"], r["written_at"])
        if key not in newest or order >= newest[key][:2]:
            newest[key] = (*order, r["skipped_waiting"])
    return {k: v[2] for k, v in newest.items()}


# ----------------------------------------------------------- cursor states


def cursor_state_rows(
    observed: Iterable[ObservedCursor], *, source_cluster: str, target_cluster: str
) -> pa.Table:
    """One ``cursor_states`` row per observation."""
    obs = list(observed)
    schema = _arrow_schema("cursor_states")
    n = len(obs)
    states = [o.state for o in obs]
    # Column by column, each nested list column from flat arrays: a batch writes a row per
    # cursor, 100,000 of them at scale.
    bounds = [s.individually_deleted.bounds for s in states]
    flat = np.concatenate(bounds) if n else np.empty((0, 4), np.int64)
    ranges = _nested([flat[:, i] for i in range(4)], [len(b) for b in bounds], None,
                     schema.field("individually_deleted_ranges").type)
    lists = [s.ledgers for s in states]
    ids = [lg.ids if lg is not None else _NONE for lg in lists]
    ledgers = _nested([np.concatenate(ids) if n else _NONE,
                       np.concatenate([lg.entries if lg is not None else _NONE
                                       for lg in lists]) if n else _NONE],
                      [len(i) for i in ids], [lg is None for lg in lists],
                      schema.field("ledgers").type)
    columns: dict[str, Any] = {
        "topic": [o.key.topic for o in obs], "partition": [o.key.partition for o in obs],
        "source_cluster": [source_cluster] * n, "target_cluster": [target_cluster] * n,
        "subscription": [o.subscription for o in obs],
        "mark_delete_ledger": [s.mark_delete.ledger for s in states],
        "mark_delete_entry": [s.mark_delete.entry for s in states],
        "individually_deleted": [str(s.individually_deleted) if len(b) else "[]"
                                 for s, b in zip(states, bounds, strict=True)],
        "individually_deleted_ranges": ranges, "ledgers": ledgers,
        "observed_at": [o.observed_at for o in obs],
    }
    return pa.table({f.name: columns[f.name] if isinstance(columns[f.name], pa.Array)
                      else pa.array(columns[f.name], f.type) for f in schema}, schema=schema)


_NONE = np.empty(0, np.int64)


def _nested(fields: list[np.ndarray], counts: list[int], null: list[bool] | None,
            type_: pa.ListType) -> pa.Array:
    """A list<struct> column: each struct field's values for all rows in one array, the
    rows' lengths, and which rows are null."""
    names = list(type_.value_type)
    offsets = pa.array(np.concatenate(([0], np.cumsum(counts, dtype=np.int64))), pa.int32())
    values = pa.StructArray.from_arrays([pa.array(v, f.type) for v, f in
                                         zip(fields, names, strict=True)], fields=names)
    mask = pa.array(null, pa.bool_()) if null is not None and any(null) else None
    return pa.ListArray.from_arrays(offsets, values, type=type_, mask=mask)


def cursor_states(rows: pa.Table) -> list[ObservedCursor]:
    """Observations back from ``cursor_states`` rows (ranges from the struct column)."""
    out = []
    for r in rows.to_pylist():
        bounds = np.array(
            [(x["lo_ledger"], x["lo_entry"], x["hi_ledger"], x["hi_entry"])
             for x in r["individually_deleted_ranges"]], np.int64).reshape(-1, 4)
        ledgers = (None if r["ledgers"] is None
                   else Ledgers.of((x["ledger_id"], x["entries"]) for x in r["ledgers"]))
        state = CursorState(Position(r["mark_delete_ledger"], r["mark_delete_entry"]),
                            RangeSet(bounds), ledgers)
        out.append(ObservedCursor(PartitionKey(r["topic"], r["partition"]),
                                  r["subscription"], state, r["observed_at"]))
    return out


# ------------------------------------------------------------ sync progress


def sync_progress_rows(
    records: Iterable[SyncRecord], *, source_cluster: str, target_cluster: str
) -> pa.Table:
    """One ``sync_progress`` row per record; ``lag_ms`` = emitted_at - source_observed_at."""
    recs = list(records)
    plans = [r.plan for r in recs]
    n = len(recs)
    # Column by column: a batch writes a row per cursor, 100,000 of them at scale.
    columns: dict[str, list[Any]] = {
        "topic": [r.key.topic for r in recs], "partition": [r.key.partition for r in recs],
        "subscription": [r.subscription for r in recs],
        "source_cluster": [source_cluster] * n, "target_cluster": [target_cluster] * n,
        "target_mark_delete_ledger": [p.mark_delete.ledger for p in plans],
        "target_mark_delete_entry": [p.mark_delete.entry for p in plans],
        "previous_target_mark_delete_ledger": [p.previous_mark_delete.ledger for p in plans],
        "previous_target_mark_delete_entry": [p.previous_mark_delete.entry for p in plans],
        "acked_ranges": [str(p.to_ack) if p.to_ack else "[]" for p in plans],
        "acks_sent": [r.acks_sent for r in recs],
        "unmapped_acked_entries": [p.unmapped_acked_entries for p in plans],
        "rewound_entries": [p.rewound_entries for p in plans],
        "partial_batches_unacked": [p.partial_batches_unacked for p in plans],
        "skippable_acked_entries": [p.skippable_acked_entries for p in plans],
        "outcome": [r.outcome for r in recs], "dry_run": [r.dry_run for r in recs],
        "source_observed_at": [r.source_observed_at for r in recs],
        "emitted_at": [r.emitted_at for r in recs],
        "lag_ms": [r.lag_ms for r in recs],
    }
    schema = _arrow_schema("sync_progress")
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema}, schema=schema)


# -------------------------------------------------------------------- halts


def halt_rows(records: Iterable[HaltRecord], *, source_cluster: str,
              target_cluster: str) -> pa.Table:
    """One ``halts`` row per record."""
    return pa.Table.from_pylist([{
        "topic": r.key.topic, "partition": r.key.partition, "subscription": r.subscription,
        "source_cluster": source_cluster, "target_cluster": target_cluster,
        "halted": r.halted, "reason": r.reason, "rewound_entries": r.rewound_entries,
        "at": r.at,
    } for r in records], schema=_arrow_schema("halts"))


def latest_halts(rows: pa.Table) -> dict[tuple[PartitionKey, str], HaltRecord]:
    """The newest ``halts`` row per (topic partition, subscription): its current state."""
    out: dict[tuple[PartitionKey, str], HaltRecord] = {}
    for r in sorted(rows.to_pylist(), key=lambda r: (r["at"], r["batch_id"])):
        key = PartitionKey(r["topic"], r["partition"])
        out[(key, r["subscription"])] = HaltRecord(key, r["subscription"], r["halted"],
                                                    r["reason"], r["rewound_entries"], r["at"])
    return out
