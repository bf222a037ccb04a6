"""Column helpers of the mapping builder: entry rows as Arrow columns to numpy, one pass each."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.core.alignment import NO_STREAM, NO_TIME, stream_of
from cursorsync.core.keys import I64
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs

#: Columns identity alignment orders by where rows have them: each entry's producer (its
#: stream) and publish time (what its memory's horizon compares).
ORDER_COLUMNS = ("producer_name", "publish_time")


def first_row_per_entry(rows: pa.Table, stamped_cluster: str | None = None) -> pa.Table:
    """One row per (cluster, topic, partition, ledger, entry): its lowest batch index.
    With ``stamped_cluster``, that cluster's rows' source-position stamps are parsed, all in
    one pass, into ``stamp_ledger`` and ``stamp_entry`` (0 in rows without one)."""
    cols = ["cluster", "topic", "partition", "ledger", "entry", "batch_index",
            "source_position", "entry_identity"]
    cols += [c for c in (*ORDER_COLUMNS, "first_chunk") if c in rows.column_names]
    t = rows.select(cols).sort_by([(c, "ascending") for c in cols[:6]])
    if t.num_rows:
        keys = [t.column(c).to_numpy(zero_copy_only=False) for c in cols[:5]]
        first = np.ones(t.num_rows, bool)
        same = np.ones(t.num_rows - 1, bool)
        for k in keys:
            same &= k[1:] == k[:-1]
        first[1:] = ~same
        t = t.filter(pa.array(first))
    if stamped_cluster is None:
        return t
    stamps = t.column("source_position")
    stamped = is_valid(stamps) & np.asarray(pc.equal(t.column("cluster"), stamped_cluster)
                                            .to_numpy(zero_copy_only=False), bool)
    ledger, entry = np.zeros(t.num_rows, np.int64), np.zeros(t.num_rows, np.int64)
    if stamped.any():
        ledger[stamped], entry[stamped] = stamp_positions(stamps.filter(pa.array(stamped)))
    return t.append_column("stamp_ledger", pa.array(ledger)).append_column(
        "stamp_entry", pa.array(entry))


def by_partition(entries: pa.Table) -> list[tuple[PartitionKey, pa.Table]]:
    """Each topic partition of ``entries`` with its rows, in their order (a stable sort and
    one slice each, not a filter of the whole table per partition)."""
    n = entries.num_rows
    if n == 0:
        return []
    entries = entries.sort_by([("topic", "ascending"), ("partition", "ascending")])
    topic, partition = entries.column("topic"), entries.column("partition")
    change = pc.or_(pc.not_equal(topic.slice(1), topic.slice(0, n - 1)),
                    pc.not_equal(partition.slice(1), partition.slice(0, n - 1)))
    starts = np.concatenate(([0], np.flatnonzero(
        pc.fill_null(change, True).to_numpy(zero_copy_only=False)) + 1))
    ends = np.append(starts[1:], n)
    at = pa.array(starts)
    return [(PartitionKey(t, int(p)), entries.slice(s, e - s)) for t, p, s, e in zip(
        topic.take(at).to_pylist(), partition.take(at).to_pylist(), starts.tolist(),
        ends.tolist(), strict=True)]


#: A stamp as the brokers write it; 18 digits at most, so it always fits an int64.
STAMP_PATTERN = r"^(?P<ledger>-?\d{1,18}):(?P<entry>-?\d{1,18})$"


def stamp_positions(stamps: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Source-position stamps (no nulls) -> ledger and entry arrays, in one pass over the
    column (the target's stamped entries, most of a batch). Any other spelling goes
    through :meth:`Position.parse`, which accepts what it accepts and names what not."""
    parts = pc.extract_regex(stamps, STAMP_PATTERN)
    out = [np.array(pc.fill_null(pc.cast(pc.struct_field(parts, f), pa.int64()), 0)
                    .to_numpy(), dtype=np.int64, copy=True) for f in ("ledger", "entry")]
    for i in np.flatnonzero(~is_valid(parts)).tolist():
        p = Position.parse(stamps[i].as_py())
        out[0][i], out[1][i] = p.ledger, p.entry
    return out[0], out[1]


def streams_and_times(t: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Each row's producer stream and publish time; NO_STREAM and NO_TIME where the rows
    do not say (no such column, or null)."""
    n = t.num_rows
    stream = np.full(n, NO_STREAM, np.int64)
    publish = np.full(n, NO_TIME, np.int64)
    if n and "producer_name" in t.column_names:
        names = t.column("producer_name").combine_chunks().dictionary_encode()
        keys = np.array([stream_of(v) for v in names.dictionary.to_pylist()] + [NO_STREAM],
                        np.int64)
        idx = pc.fill_null(names.indices, len(names.dictionary)).to_numpy(zero_copy_only=False)
        stream = keys[idx]
    if n and "publish_time" in t.column_names:
        publish = np.asarray(pc.fill_null(t.column("publish_time"), NO_TIME).to_numpy(
            zero_copy_only=False), np.int64)
    return stream, publish


def is_valid(column: pa.ChunkedArray) -> np.ndarray:
    """Which values are not null, as a numpy mask."""
    return np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)


def by_position(t: pa.Table) -> pa.Table:
    return t.sort_by([("ledger", "ascending"), ("entry", "ascending")])


@dataclass(frozen=True)
class SideRows:
    """One cluster's rows of a topic partition in a batch, by position, with their ledger and
    entry ids as numpy arrays."""

    rows: pa.Table
    ledger: I64
    entry: I64

    @classmethod
    def of(cls, entries: pa.Table, cluster: str) -> SideRows:
        """The rows of ``entries`` (one topic partition's) read from ``cluster``."""
        rows = by_position(entries.filter(pc.equal(entries.column("cluster"), cluster)))
        return cls(rows, rows.column("ledger").to_numpy(), rows.column("entry").to_numpy())

    def last(self) -> Position:
        """The last row's position (there is one)."""
        return Position(int(self.ledger[-1]), int(self.entry[-1]))

    def runs(self, mask: npt.NDArray[np.bool_]) -> Runs:
        """The positions of the rows ``mask`` picks, as runs."""
        return Runs.from_positions(self.ledger[mask], self.entry[mask])

    def __len__(self) -> int:
        return len(self.ledger)


__all__ = ["ORDER_COLUMNS", "STAMP_PATTERN", "SideRows", "by_partition", "by_position",
           "first_row_per_entry", "is_valid", "stamp_positions", "streams_and_times"]
