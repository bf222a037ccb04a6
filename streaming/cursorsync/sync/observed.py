"""What the sync step reads of the source cursors: observed by ``pulsar-cursors``, and
their last states before a batch from ``cursor_states``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet, spans
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.tables.rows import cursor_states
from cursorsync.tables.store import RowFilter, TableStore

K = TypeVar("K")
T = TypeVar("T")
V = TypeVar("V")


def observations(table: pa.Table) -> list[ObservedCursor]:
    """``pulsar-cursors`` rows -> observed cursor states (each value parsed anew)."""
    return Observations()(table)


class Observations:
    """``pulsar-cursors`` rows -> observed cursor states, for a sink that reads one batch
    after another.

    Most partitions repeat their row batch after batch (only the times move): a row whose
    key and state columns equal those of a row of the last batch takes that row's parsed
    state again, found by comparing the columns whole, not row by row (a poll lists its
    partitions in the same order, which makes it cheapest). Other rows take again the
    positions, ranges and ledger lists the last batch parsed, or parse them (they are
    values: nothing changes them in place)."""

    def __init__(self) -> None:
        self._positions: dict[str, Position] = {}
        self._ranges: dict[str, RangeSet] = {}
        self._ledgers: dict[bytes, Ledgers] = {}
        #: The last batch's key and state columns, and what its rows parsed to.
        self._columns: CursorColumns | None = None
        self._keys: list[PartitionKey] = []
        self._states: list[CursorState] = []
        #: Rows of the last call that took the parsed state of a last batch's row again.
        self.taken_again = 0

    def __call__(self, table: pa.Table) -> list[ObservedCursor]:
        observed = _times(table.column("observed_at"))
        checked: Sequence[datetime | None] = (
            _times(table.column("checked_at")) if "checked_at" in table.column_names
            else [None] * table.num_rows)
        columns = CursorColumns.of(table)
        match = (columns.matches(self._columns) if self._columns is not None
                 else np.full(table.num_rows, -1, np.int64))
        subs = _strings(columns.scalars["subscription"])
        # Only the rows that changed are read further.
        fresh = pa.array(np.flatnonzero(match < 0))
        picked = {name: columns.scalars[name].take(fresh).to_pylist()
                  for name in ("partition", "mark_delete", "individually_deleted")}
        picked["topic"] = _strings(columns.scalars["topic"].take(fresh))
        ids, counts, ends, missing = columns.ledger_lists()
        pairs = np.stack([ids, counts], axis=1)
        positions: dict[str, Position] = {}
        ranges: dict[str, RangeSet] = {}
        ledgers: dict[bytes, Ledgers] = {}
        keys: list[PartitionKey] = []
        states: list[CursorState] = []
        out = []
        n = 0  # the changed rows parsed so far
        for i, (j, sub) in enumerate(zip(match.tolist(), subs, strict=True)):
            if j >= 0:
                key, state = self._keys[j], self._states[j]
            else:
                md, idm = picked["mark_delete"][n], picked["individually_deleted"][n]
                key = PartitionKey(picked["topic"][n], picked["partition"][n])
                row = pairs[ends[i]:ends[i + 1]]
                n += 1
                state = CursorState(
                    _cached(md, md, positions, self._positions, Position.parse),
                    _cached(idm, idm, ranges, self._ranges, RangeSet.parse),
                    None if missing[i] else _cached(row.tobytes(), row, ledgers, self._ledgers,
                                                    _ledger_list))
            keys.append(key)
            states.append(state)
            at = observed[i]
            out.append(ObservedCursor(key, sub, state, at,
                                      None if checked[i] == at else checked[i]))
        # What this batch saw, for the next: the caches hold the values this batch parsed.
        self._positions, self._ranges, self._ledgers = positions, ranges, ledgers
        self._columns, self._keys, self._states = columns, keys, states
        self.taken_again = len(match) - len(fresh)
        return out


    def forget(self, rows: np.ndarray) -> None:
        """The last call's ``rows`` are not taken again by the next (their cursors are kept
        elsewhere, :class:`cursorsync.sync.idle_store.IdleStore`): what the parser keeps
        then grows with the rows that stay with the step only."""
        if self._columns is None or not len(rows):
            return
        keep = np.ones(len(self._states), bool)
        keep[rows] = False
        self._columns = self._columns.take(np.flatnonzero(keep))
        self._keys = [k for k, kept in zip(self._keys, keep.tolist(), strict=True) if kept]
        self._states = [s for s, kept in zip(self._states, keep.tolist(), strict=True) if kept]
        # The caches keep the values a kept state holds.
        used = {id(v) for s in self._states for v in (s.mark_delete,
                                                       s.individually_deleted, s.ledgers)}
        self._positions = {t: v for t, v in self._positions.items() if id(v) in used}
        self._ranges = {t: v for t, v in self._ranges.items() if id(v) in used}
        self._ledgers = {t: v for t, v in self._ledgers.items() if id(v) in used}


#: ``pulsar-cursors``' ledger list type.
_LEDGER_LIST = pa.list_(pa.struct([("ledger_id", pa.int64()), ("entries", pa.int64())]))
_TIME = pa.timestamp("us", tz="UTC")


def poll_rows(observed: Sequence[ObservedCursor], cluster: str = "") -> pa.Table:
    """Observations as ``pulsar-cursors`` rows, the values written as the source writes
    them (what :class:`Observations` reads back)."""
    return pa.table({
        "cluster": pa.array([cluster] * len(observed), pa.string()),
        "topic": pa.array([o.key.topic for o in observed], pa.string()),
        "partition": pa.array([o.key.partition for o in observed], pa.int32()),
        "subscription": pa.array([o.subscription for o in observed], pa.string()),
        "mark_delete": pa.array([str(o.state.mark_delete) for o in observed], pa.string()),
        "individually_deleted": pa.array([str(o.state.individually_deleted)
                                          for o in observed], pa.string()),
        "ledgers": pa.array([None if o.state.ledgers is None else [
            {"ledger_id": i, "entries": n} for i, n in zip(
                o.state.ledgers.ids.tolist(), o.state.ledgers.entries.tolist(), strict=True)]
            for o in observed], _LEDGER_LIST),
        "observed_at": pa.array([o.observed_at for o in observed], _TIME),
        "messages_consumed_counter": pa.array([0] * len(observed), pa.int64()),
        "checked_at": pa.array([o.confirmed_at for o in observed], _TIME),
    })


def _strings(column: pa.Array) -> list[str]:
    """A string column as Python strings, one object per distinct value: the partitions
    of a topic, and the cursors of a subscription, share it while they are kept."""
    if column.null_count:
        return column.to_pylist()  # type: ignore[no-any-return]
    names, which = _each_once(column)
    return [names[w] for w in which]


def _cached(key: K, text: T, seen: dict[K, V], last: dict[K, V], parse: Callable[[T], V],
            ) -> V:
    """``text`` parsed, found by ``key``: as this batch parsed it already, or the last
    batch did, or anew."""
    found = seen.get(key)
    if found is None:
        found = last.get(key)
        seen[key] = found = parse(text) if found is None else found
    return found


def _ledger_list(pairs: np.ndarray) -> Ledgers:
    """A row's (ledger id, entries) pairs as a ledger list."""
    return Ledgers.of(pairs.tolist())


class LedgerLists(NamedTuple):
    """A batch's ledger lists, flat: every row's ledger ids and entry counts, where each
    row's begin (with the end after the last), which rows have no list."""

    ids: np.ndarray
    counts: np.ndarray
    ends: list[int]
    missing: list[bool]


class CursorColumns:
    """A batch's key and state columns, to compare with the next batch's."""

    def __init__(self, scalars: dict[str, pa.Array], keys: pa.Array, ids: np.ndarray,
                 counts: np.ndarray, ends: np.ndarray, missing: np.ndarray) -> None:
        self.scalars, self.keys, self.ids, self.counts = scalars, keys, ids, counts
        self.ends, self.missing = ends, missing

    @classmethod
    def of(cls, table: pa.Table) -> CursorColumns:
        scalars = {name: _one_chunk(table.column(name)) for name in _STATE_COLUMNS}
        # Only to find a row's counterpart: every column is compared after.
        keys = pc.binary_join_element_wise(
            scalars["topic"], pc.cast(scalars["partition"], pa.string()),
            scalars["subscription"], "\0")
        lists = _one_chunk(table.column("ledgers"))
        flat = lists.flatten()
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        # Views of the Arrow columns where they are int64 without nulls, as a poll's are.
        return cls(scalars, keys,
                   np.asarray(flat.field("ledger_id").to_numpy(zero_copy_only=False), np.int64),
                   np.asarray(flat.field("entries").to_numpy(zero_copy_only=False), np.int64),
                   np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
                   lists.is_null().to_numpy(zero_copy_only=False))

    def take(self, rows: np.ndarray) -> CursorColumns:
        """These rows' columns, in this order."""
        at = pa.array(rows, pa.int64())
        lengths = np.diff(self.ends)[rows]
        flat = spans(self.ends[:-1][rows], lengths)
        return CursorColumns({n: a.take(at) for n, a in self.scalars.items()},
                             self.keys.take(at), self.ids[flat], self.counts[flat],
                             np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
                             self.missing[rows])

    def ledger_lists(self) -> LedgerLists:
        """Every row's ledger list, flat."""
        return LedgerLists(self.ids, self.counts, self.ends.tolist(), self.missing.tolist())

    def counterparts(self, last: CursorColumns) -> np.ndarray:
        """Per row, the row of ``last`` with the same key: the one at the same place when
        both list the same keys in the same order, else the first; -1 when there is none."""
        n = len(self.missing)
        if n == 0 or len(last.missing) == 0:
            return np.full(n, -1, np.int64)
        if len(last.missing) == n and self.keys.equals(last.keys):
            return np.arange(n, dtype=np.int64)
        found = pc.index_in(self.keys, value_set=last.keys)
        return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)

    def rows_unchanged(self, last: CursorColumns, at: np.ndarray) -> np.ndarray:
        """Per row, whether its counterpart ``at`` in ``last`` (-1: none) has the same key
        and state. A null key or state value counts as changed; two rows without a ledger
        list are the same."""
        n = len(self.missing)
        rows = np.flatnonzero(at >= 0)
        there = at[rows]
        ordered = len(rows) == n == len(last.missing) and bool((there == rows).all())
        same = np.ones(len(rows), bool)
        for name, now in self.scalars.items():
            before = last.scalars[name]
            if not ordered:
                now, before = now.take(pa.array(rows)), before.take(pa.array(there))
            same &= pc.fill_null(pc.equal(now, before), False).to_numpy(zero_copy_only=False)
        lengths, last_lengths = np.diff(self.ends)[rows], np.diff(last.ends)[there]
        same &= (lengths == last_lengths) & (self.missing[rows] == last.missing[there])
        kept = np.flatnonzero(same)
        width = lengths[kept]
        if width.sum():
            # Each such row's pairs against its counterpart's, all at once.
            row_of = np.repeat(np.arange(len(kept)), width)
            here = spans(self.ends[rows[kept]], width)
            back = spans(last.ends[there[kept]], width)
            differs = (self.ids[here] != last.ids[back]) | (self.counts[here] != last.counts[back])
            same[kept[np.unique(row_of[differs])]] = False
        out = np.zeros(n, bool)
        out[rows[same]] = True
        return out

    def matches(self, last: CursorColumns) -> np.ndarray:
        """Per row, the row of ``last`` (the previous batch) with the same key and state
        (:meth:`counterparts`, :meth:`rows_unchanged`); -1 when there is none."""
        at = self.counterparts(last)
        return np.where(self.rows_unchanged(last, at), at, -1)


#: The columns a row's key and cursor state come from, but the ledger lists.
_STATE_COLUMNS = ("topic", "partition", "subscription", "mark_delete", "individually_deleted")


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _times(column: pa.ChunkedArray) -> list[datetime]:
    """A timestamp column (never null: the source stamps every row) as UTC datetimes; a
    poll's rows share a few times, each converted once."""
    distinct, which = _each_once(_one_chunk(column))
    when = [t if t.tzinfo is not None else t.replace(tzinfo=UTC) for t in distinct]
    return [when[w] for w in which]


def _each_once(column: pa.Array) -> tuple[list[Any], list[int]]:
    """A column's distinct values as Python values, each made once, and per row the index
    of its value."""
    encoded = column.dictionary_encode()
    return (encoded.dictionary.to_pylist(),
            encoded.indices.to_numpy(zero_copy_only=False).tolist())


#: Every poll observes every cursor, so a cursor's last state is nearly always in the last
#: few batches: those are read first, and the whole history only for a cursor not in them.
RECENT_BATCHES = 50


def previous_states(store: TableStore, obs: list[ObservedCursor], batch_id: int, *,
                    source_cluster: str, target_cluster: str,
                    ) -> dict[tuple[PartitionKey, str], ObservedCursor]:
    """The last observation of each observed (partition, subscription) before this batch,
    from ``cursor_states``: what a rewind is measured against after a restart. Reads the
    last :data:`RECENT_BATCHES` batches, and all of a topic's rows only when one of its
    cursors is not in them, so the cost does not grow with the table."""
    prev: dict[tuple[PartitionKey, str], ObservedCursor] = {}
    if batch_id == 0 or not store.exists("cursor_states"):
        return {}
    for topic in sorted({o.key.topic for o in obs}):
        wanted = {(o.key, o.subscription) for o in obs if o.key.topic == topic}
        for since in (max(0, batch_id - RECENT_BATCHES), None):
            rows = store.read("cursor_states", RowFilter.of(
                topic=topic, source_cluster=source_cluster, target_cluster=target_cluster,
                min_batch_id=since, max_batch_id=batch_id - 1))
            for seen in cursor_states(rows):
                k = (seen.key, seen.subscription)
                if k not in prev or seen.observed_at >= prev[k].observed_at:
                    prev[k] = seen
            if since == 0 or wanted <= prev.keys():
                break
    return prev
