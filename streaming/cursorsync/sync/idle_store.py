"""Idle cursors between sync batches, kept in columns rather than Python objects.

Most of a large job's cursors sit still: their last plan passed the guard, needed nothing
sent, and their source state, mapping and target are what they were
(:class:`cursorsync.sync.plans.IdleCursor`). The sink takes them out of the step after
each batch and keeps them here, as rows: the source row as ``pulsar-cursors`` gave it,
the target and the plan packed, the mapping version, the batches since the target was
last read, when the source was last observed. A row of the next poll that equals its
idle row, for a partition whose mapping version is the same and that has no markers
found nor a halt, is repeated in bulk: counted and timed for the metrics, never parsed,
planned or recorded one by one. The others (a changed source, a new mapping, a target
due for a read, rows due to be written again) go back to the step as objects, which
decides as it always does. An idle cursor then costs a few hundred bytes of columns,
mapped from a file when a :class:`~cursorsync.tables.spill.Spill` is given, so the driver's
heap holds none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.packed import PackedMappings, keys_bytes
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.sync.observed import CursorColumns, observations, poll_rows
from cursorsync.sync.plans import (
    IDLE_TARGET_READ_EVERY,
    IdleCursor,
    decode_plan,
    encode_plan,
    stable_hash,
)
from cursorsync.sync.step import SyncStep
from cursorsync.tables.spill import Spill

Key = tuple[PartitionKey, str]

#: The ``pulsar-cursors`` columns an idle row keeps: its key and its source state.
KEPT = ("topic", "partition", "subscription", "mark_delete", "individually_deleted",
        "ledgers")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@dataclass
class Split:
    """A poll's rows, split by :meth:`IdleStore.split`."""

    #: The rows for the parser and the step, in the poll's order.
    rest: pa.Table
    #: Rows repeated in bulk.
    repeated: int = 0
    #: Per subscription, the lags (seconds) of the rows repeated in bulk.
    lags: dict[str, list[float]] = field(default_factory=dict)
    #: Idle rows going back to the step whose source is the row of ``rest`` at the same
    #: place in ``rows``, and those whose source changed (or whose key is polled twice).
    same: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    changed: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


class IdleStore:
    """The idle cursors the step gave up, one row each, unique by key; in files ``spill``
    maps, or on the heap when it is None."""

    def __init__(self, spill: Spill | None = None) -> None:
        self._spill = spill
        empty = pa.array([], pa.binary())
        self._rows = poll_rows([]).select(KEPT).append_column("target", empty).append_column(
            "plan", empty)
        self._columns = CursorColumns.of(self._rows)
        self._version = np.empty(0, np.int64)
        self._unread = np.empty(0, np.int64)
        self._observed_us = np.empty(0, np.int64)
        #: Per row, a number drawn from its key: which batches write its rows again.
        self._spread = np.empty(0, np.int64)
        #: Rows handed back to the step by the last split, removed by the next keep.
        self._gone = np.empty(0, np.int64)

    def __len__(self) -> int:
        return int(self._rows.num_rows)

    @property
    def nbytes(self) -> int:
        """Bytes of the idle rows and their columns."""
        return int(self._rows.nbytes + self._columns.keys.nbytes + sum(a.nbytes for a in (
            self._columns.ends, self._columns.missing, self._version, self._unread,
            self._observed_us, self._spread)))

    def split(self, table: pa.Table, mappings: PackedMappings, step: SyncStep, *, bulk: bool,
              batch_id: int, rows_every: int, now: datetime | None = None) -> Split:
        """``table``'s rows repeated in bulk, and the others for the step, with the idle
        cursors among them handed back to it (by :meth:`restore`, once they are parsed).
        ``bulk`` False: nothing is repeated in bulk (the batch does not follow the last
        one, so every row is written). A row is written again every ``rows_every``
        batches, as :func:`cursorsync.sync.sink.history_due` chooses."""
        if len(self._gone):
            # The last batch's rows went back to the step, and no keep followed (the batch
            # failed): they are the step's now.
            self._append(pa.table({}), [], [])
        if not len(self) or not table.num_rows:
            return Split(table)
        cols = CursorColumns.of(table)
        at = cols.counterparts(self._columns)
        same = cols.rows_unchanged(self._columns, at)
        # A key polled twice in one batch goes to the step, which keeps the newest.
        keys = cols.keys.dictionary_encode()
        which = pc.fill_null(keys.indices, 0).to_numpy(zero_copy_only=False)
        unique = ((np.bincount(which, minlength=len(keys.dictionary))[which] == 1)
                  & keys.indices.is_valid().to_numpy(zero_copy_only=False))
        if bulk:
            repeat = self._repeatable(table, cols, at, mappings, step, batch_id, rows_every,
                                      same & unique)
        else:
            repeat = np.zeros(len(at), bool)
        bulk_rows = np.flatnonzero(repeat)
        back = np.flatnonzero(~repeat & (at >= 0))
        rest = table.filter(pa.array(~repeat))
        # Where each row not repeated lands in ``rest``.
        place = np.cumsum(~repeat) - 1
        same_back = back[same[back] & unique[back]]
        changed = np.unique(at[back[~(same[back] & unique[back])]])
        out = Split(rest, len(bulk_rows), same=at[same_back], rows=place[same_back],
                    changed=changed)
        slots = at[bulk_rows]
        self._unread[slots] += 1
        observed = _timestamps_micros(table.column("observed_at"))
        self._observed_us[slots] = observed[bulk_rows]
        # A row's lag counts from when its state was last confirmed, as a record's does.
        checked = (_timestamps_micros(table.column("checked_at"), observed)
                   if "checked_at" in table.column_names else observed)[bulk_rows]
        out.lags = _lags(table.column("subscription").take(bulk_rows), checked, now)
        step.kept.target_reads_skipped += len(bulk_rows)
        return out

    def _repeatable(self, table: pa.Table, cols: CursorColumns, at: np.ndarray,
                    mappings: PackedMappings, step: SyncStep, batch_id: int, rows_every: int,
                    candidates: np.ndarray) -> np.ndarray:
        """Per row, whether a ``candidates`` row (the same as its idle row, its key polled
        once) is repeated in bulk: the step need not see it, its target is not due for a
        read nor its rows to be written, and its partition's mapping version is the
        same."""
        repeat: np.ndarray = candidates & ~self._left_out(cols, step)
        slot = at[repeat]
        repeat[repeat] = ((self._unread[slot] + 1 < IDLE_TARGET_READ_EVERY)
                          & ((self._spread[slot] + batch_id) % rows_every != 0))
        rows = np.flatnonzero(repeat)
        repeat[rows] = self._version[at[rows]] == _versions(table.take(rows), mappings)
        return repeat

    def restore(self, split: Split, observed: Sequence[ObservedCursor], step: SyncStep,
                ) -> None:
        """The idle cursors ``split`` hands back, to the step: as their source, the state
        parsed from their row of ``split.rest`` (``observed``, in its order) when it is
        the same, else their own row parsed."""
        back: dict[Key, IdleCursor] = {}
        for slot, row in zip(split.same.tolist(), split.rows.tolist(), strict=True):
            obs = observed[row]
            back[obs.key, obs.subscription] = self._cursor(slot, obs)
        if len(split.changed):
            rows = self._rows.take(split.changed).append_column("observed_at", pa.array(
                self._observed_us[split.changed], pa.int64()).cast(pa.timestamp("us", "UTC")))
            kept = observations(rows)
            for slot, obs in zip(split.changed.tolist(), kept, strict=True):
                back[obs.key, obs.subscription] = self._cursor(slot, obs)
        step.adopt_idle(back)
        self._gone = np.concatenate([split.same, split.changed])

    def keep(self, step: SyncStep, rest: pa.Table, observed: Sequence[ObservedCursor],
             ) -> np.ndarray:
        """Takes the idle cursors the step can give up (its rows from ``rest`` when their
        source is the state parsed from it); the rows handed back by the last split go.
        Returns the rows of ``rest`` it took."""
        taken = step.release_idle()
        where = {(o.key, o.subscription): i for i, o in enumerate(observed)}
        polled: list[tuple[int, IdleCursor]] = []
        other: list[tuple[ObservedCursor, IdleCursor]] = []
        for k, idle in taken.items():
            i = where.get(k)
            if i is not None and observed[i].state is idle.source:
                polled.append((i, idle))
            else:  # its source is an older row's (its batch skipped it): written anew
                other.append((ObservedCursor(k[0], k[1], idle.source, idle.observed_at), idle))
        schema = self._rows.select(KEPT).schema
        fresh = pa.concat_tables([
            rest.select(KEPT).take(pa.array([i for i, _ in polled], pa.int64())).cast(schema),
            poll_rows([o for o, _ in other]).select(KEPT).cast(schema)])
        cursors = [c for _, c in polled] + [c for _, c in other]
        fresh = fresh.append_column("target", pa.array([c.target for c in cursors],
                                                       pa.binary()))
        fresh = fresh.append_column("plan", pa.array([encode_plan(c.plan) for c in cursors],
                                                     pa.binary()))
        keys = [*((observed[i].key, observed[i].subscription) for i, _ in polled),
                *((o.key, o.subscription) for o, _ in other)]
        self._append(fresh, cursors, keys)
        return np.array([i for i, _ in polled], np.int64)

    def _append(self, fresh: pa.Table, cursors: list[IdleCursor], keys: list[Key]) -> None:
        """The rows handed back by the last split go; ``fresh`` rows, for ``cursors``
        (with ``keys``), come."""
        if not len(self._gone) and not fresh.num_rows:
            return
        mask = np.ones(len(self), bool)
        mask[self._gone] = False
        rows = pa.concat_tables([self._rows.filter(pa.array(mask)), *(
            [fresh] if fresh.num_rows else [])]).combine_chunks()
        version = np.concatenate([self._version[mask], [c.version for c in cursors]])
        unread = np.concatenate([self._unread[mask], [c.unread for c in cursors]])
        observed = np.concatenate([self._observed_us[mask], [
            (c.observed_at - _EPOCH) // _US for c in cursors]])
        spread_ = np.concatenate([self._spread[mask], [stable_hash(k) for k in keys]])
        # Everything first, read-only but for the two a split moves on for the rows it
        # repeats: a spill that fails leaves the store as it was.
        arrays = (self._array(version.astype(np.int64)),
                  self._array(unread.astype(np.int64), writable=True),
                  self._array(observed.astype(np.int64), writable=True),
                  self._array(spread_.astype(np.int64)))
        if self._spill is None:
            columns = CursorColumns.of(rows)
        else:
            rows = self._spill.table(rows)
            cols = CursorColumns.of(rows)
            joined = self._spill.table(pa.table({"key": cols.keys})).column(0)
            columns = CursorColumns(
                cols.scalars, joined.chunk(0) if joined.num_chunks else cols.keys, cols.ids,
                cols.counts, self._spill.array(cols.ends), self._spill.array(cols.missing))
        self._version, self._unread, self._observed_us, self._spread = arrays
        self._rows, self._columns = rows, columns
        self._gone = np.empty(0, np.int64)

    def _array(self, values: np.ndarray, *, writable: bool = False) -> np.ndarray:
        return values if self._spill is None else self._spill.array(values, writable=writable)

    def _cursor(self, slot: int, obs: ObservedCursor) -> IdleCursor:
        return IdleCursor(obs.state, self._rows.column("target")[slot].as_py(),
                          _EPOCH + int(self._observed_us[slot]) * _US,
                          int(self._version[slot]), None,
                          decode_plan(self._rows.column("plan")[slot].as_py()),
                          int(self._unread[slot]))

    @staticmethod
    def _left_out(cols: CursorColumns, step: SyncStep) -> np.ndarray:
        """Per row, whether the step must see it whatever its state: its cursor is halted
        or its partly acked batches changed on the source, or its partition has markers
        found."""
        out = np.zeros(len(cols.missing), bool)
        for keys in (step.halted_keys, step.batches_moved):
            if keys:
                named = pa.array([f"{k.topic}\0{k.partition}\0{sub}" for k, sub in keys],
                                 pa.string())
                out |= pc.is_in(cols.keys, value_set=named).to_numpy(zero_copy_only=False)
        marked = step.lookups.cache.markers
        if marked:
            named = pa.array([f"{k.topic}\0{k.partition}" for k in marked], pa.string())
            partitions = pc.binary_join_element_wise(
                cols.scalars["topic"], pc.cast(cols.scalars["partition"], pa.string()), "\0")
            out |= pc.is_in(partitions, value_set=named).to_numpy(zero_copy_only=False)
        return out


def _versions(rows: pa.Table, mappings: PackedMappings) -> np.ndarray:
    """The mapping version of each row's partition."""
    return mappings.versions(keys_bytes(map(PartitionKey, rows.column("topic").to_pylist(),
                                            rows.column("partition").to_pylist())))


def _timestamps_micros(column: pa.ChunkedArray, fill: np.ndarray | None = None
                       ) -> np.ndarray:
    """A timestamp column as microseconds since the epoch (nulls as ``fill``)."""
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    unit = arr.type.unit
    out = arr.cast(pa.int64()).to_numpy(zero_copy_only=False)
    scale = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}[unit]
    out = out // 1_000 if unit == "ns" else out * scale
    if arr.null_count and fill is not None:
        out = np.where(arr.is_null().to_numpy(zero_copy_only=False), fill, out)
    return np.asarray(out, np.int64)


def _lags(subscriptions: pa.ChunkedArray, confirmed_us: np.ndarray,
          now: datetime | None) -> dict[str, list[float]]:
    """Per subscription, each row's lag as a record made now would give it."""
    if not len(confirmed_us):
        return {}
    at = ((now or datetime.now(UTC)) - _EPOCH) // _US
    lag = ((at - confirmed_us) / 1000).astype(np.int64) / 1000
    encoded = subscriptions.combine_chunks().dictionary_encode()
    which = encoded.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(which, kind="stable")
    bounds = np.cumsum(np.bincount(which, minlength=len(encoded.dictionary)))[:-1]
    return {name: part.tolist() for name, part in zip(
        encoded.dictionary.to_pylist(), np.split(lag[order], bounds), strict=True)}

