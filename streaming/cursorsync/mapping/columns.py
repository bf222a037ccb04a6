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
from cursorsync.mapping.pairs import Pairs

Mask = npt.NDArray[np.bool_]

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


@dataclass(frozen=True)
class SideRows:
    """One cluster's rows of a topic partition in a batch, by position, with the columns the
    builder reads as numpy arrays (sliced from the batch's, so a partition costs no Arrow
    compute call of its own)."""

    rows: pa.Table
    ledger: I64
    entry: I64
    #: Which rows carry a source-position stamp, an identity digest, a first-chunk id.
    stamped: Mask
    digested: Mask
    chunked: Mask
    #: Each row's producer stream and publish time (:func:`streams_and_times`).
    stream: I64
    publish: I64
    #: Each row's identity digest (None where it has none).
    digests: list[bytes | None]
    #: Each row's parsed source-position stamp (0 where it has none, or no stamp column).
    stamp_ledger: I64
    stamp_entry: I64

    @classmethod
    def whole(cls, rows: pa.Table) -> SideRows:
        """All of ``rows``, in their order."""
        stream, publish = streams_and_times(rows)
        return cls(rows, _int64(rows, "ledger"), _int64(rows, "entry"),
                   _valid(rows, "source_position"), _valid(rows, "entry_identity"),
                   _valid(rows, "first_chunk"), stream, publish,
                   rows.column("entry_identity").to_pylist(),
                   _int64_or_zeros(rows, "stamp_ledger"), _int64_or_zeros(rows, "stamp_entry"))

    def slice(self, start: int, stop: int) -> SideRows:
        """Rows ``start`` to ``stop`` (views, no copy)."""
        return SideRows(self.rows.slice(start, stop - start), self.ledger[start:stop],
                        self.entry[start:stop], self.stamped[start:stop],
                        self.digested[start:stop], self.chunked[start:stop],
                        self.stream[start:stop], self.publish[start:stop],
                        self.digests[start:stop], self.stamp_ledger[start:stop],
                        self.stamp_entry[start:stop])

    def stamp_pairs(self, mask: Mask) -> Pairs:
        """The rows ``mask`` picks (stamped ones), each paired with the source entry its
        source-position stamp names (parsed into ``stamp_ledger`` and ``stamp_entry``)."""
        return Pairs.of(self.stamp_ledger[mask], self.stamp_entry[mask],
                        self.ledger[mask], self.entry[mask], "position-property")

    def last(self) -> Position:
        """The last row's position (there is one)."""
        return Position(int(self.ledger[-1]), int(self.entry[-1]))

    def runs(self, mask: npt.NDArray[np.bool_]) -> Runs:
        """The positions of the rows ``mask`` picks, as runs."""
        return Runs.from_positions(self.ledger[mask], self.entry[mask])

    def __len__(self) -> int:
        return len(self.ledger)


def partition_sides(entries: pa.Table, target_cluster: str, source_cluster: str
                    ) -> list[tuple[PartitionKey, SideRows, SideRows]]:
    """Each topic partition of ``entries`` (one row per entry) with its target and source
    rows, by position: one sort and one conversion per column for the whole batch, then
    slices (rows of any other cluster are left out)."""
    if entries.num_rows == 0:
        return []
    t = entries.sort_by([(c, "ascending") for c in
                         ("topic", "partition", "cluster", "ledger", "entry")])
    n = t.num_rows
    whole = SideRows.whole(t)
    topic = t.column("topic").combine_chunks().dictionary_encode()
    topic_code = topic.indices.to_numpy(zero_copy_only=False)
    partition = _int64(t, "partition")
    cluster = t.column("cluster")
    side = np.full(n, 2, np.int8)  # 0: target, 1: source, 2: another cluster's
    side[np.asarray(pc.equal(cluster, source_cluster).to_numpy(zero_copy_only=False),
                    bool)] = 1
    side[np.asarray(pc.equal(cluster, target_cluster).to_numpy(zero_copy_only=False),
                    bool)] = 0
    new_partition = np.ones(n, bool)
    new_partition[1:] = (topic_code[1:] != topic_code[:-1]) | (partition[1:] != partition[:-1])
    new_run = new_partition.copy()
    new_run[1:] |= side[1:] != side[:-1]
    starts = np.flatnonzero(new_run)
    stops = np.append(starts[1:], n)
    names = topic.dictionary.to_pylist()
    empty = whole.slice(0, 0)
    out: list[tuple[PartitionKey, SideRows, SideRows]] = []
    sides: list[SideRows] = [empty, empty]
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        if new_partition[start]:
            if out:
                out[-1] = (out[-1][0], sides[0], sides[1])
            sides = [empty, empty]
            out.append((PartitionKey(names[topic_code[start]], int(partition[start])),
                        empty, empty))
        if side[start] < 2:
            sides[side[start]] = whole.slice(start, stop)
    out[-1] = (out[-1][0], sides[0], sides[1])
    return out


def _int64(t: pa.Table, name: str) -> I64:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), np.int64)


def _int64_or_zeros(t: pa.Table, name: str) -> I64:
    return _int64(t, name) if name in t.column_names else np.zeros(t.num_rows, np.int64)


def _valid(t: pa.Table, name: str) -> Mask:
    """Which rows have a value in column ``name`` (none where there is no such column)."""
    if name not in t.column_names:
        return np.zeros(t.num_rows, bool)
    return is_valid(t.column(name))


__all__ = ["ORDER_COLUMNS", "STAMP_PATTERN", "SideRows", "first_row_per_entry",
           "is_valid", "partition_sides", "stamp_positions", "streams_and_times"]
