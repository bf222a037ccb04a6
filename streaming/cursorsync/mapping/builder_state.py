"""The mapping builder's state per topic partition, kept with each batch under the
checkpoint (a replayed batch starts from the state its first run started from).

The state is an Arrow IPC file of one row per partition: a job with many partitions writes
it every batch, so it is built column by column, and read back the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cursorsync.core.alignment import NO_STREAM, NO_TIME, Memory, Waiting
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.files import replace_file

#: Written in the file's schema metadata; version 2 (no streams, publish times or memory of
#: given-up digests) still loads, any other version is not read.
STATE_VERSION = 3
#: No skipped ids waiting: shared by every partition's state, so it must never be written to.
_NO_RUNS = Runs(np.empty((0, 3), np.int64))
_NO_RUNS.rows.setflags(write=False)
#: No digest given up: shared likewise (a Memory is replaced, never changed).
_NO_MEMORY = Memory()


@dataclass(slots=True, eq=False)
class Pending:
    """Entries waiting for an identity match, oldest first. Most partitions have none:
    they share the empty tuples, and nothing changes a list in place."""

    ledger: Sequence[int] = ()
    entry: Sequence[int] = ()
    digest: Sequence[bytes] = ()
    #: Each entry's producer stream (:func:`cursorsync.core.alignment.stream_of`) and
    #: publish time; NO_STREAM and NO_TIME where not known.
    stream: Sequence[int] = ()
    publish: Sequence[int] = ()

    def extend(self, ledger: np.ndarray, entry: np.ndarray, digest: list[bytes],
               stream: np.ndarray | None = None, publish: np.ndarray | None = None) -> None:
        n = len(ledger)
        old_stream, old_publish = self._stream(), self._publish()
        self.ledger = [*self.ledger, *ledger.tolist()]
        self.entry = [*self.entry, *entry.tolist()]
        self.digest = [*self.digest, *digest]
        self.stream = [*old_stream, *(stream.tolist() if stream is not None
                                      else [NO_STREAM] * n)]
        self.publish = [*old_publish, *(publish.tolist() if publish is not None
                                        else [NO_TIME] * n)]

    def keep(self, mask: np.ndarray) -> None:
        idx = np.flatnonzero(mask).tolist()
        stream, publish = self._stream(), self._publish()
        self.ledger = [self.ledger[i] for i in idx]
        self.entry = [self.entry[i] for i in idx]
        self.digest = [self.digest[i] for i in idx]
        self.stream = [stream[i] for i in idx]
        self.publish = [publish[i] for i in idx]

    def waiting(self) -> Waiting:
        return Waiting.of(self.ledger, self.entry, self.digest, self._stream(), self._publish())

    def _stream(self) -> Sequence[int]:
        """The streams, NO_STREAM for entries a version 2 state kept without one."""
        return self.stream if len(self.stream) == len(self.ledger) else [NO_STREAM] * len(self)

    def _publish(self) -> Sequence[int]:
        return (self.publish if len(self.publish) == len(self.ledger)
                else [NO_TIME] * len(self))

    def __len__(self) -> int:
        return len(self.ledger)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pending) and all(
            list(a) == list(b) for a, b in zip(
                (self.ledger, self.entry, self.digest, self._stream(), self._publish()),
                (other.ledger, other.entry, other.digest, other._stream(), other._publish()),
                strict=True))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pending:
        return cls(d["ledger"], d["entry"], [bytes.fromhex(x) for x in d["digest"]])


@dataclass(slots=True)
class PartitionState:
    last_target: Position | None = None
    target: Pending = field(default_factory=Pending)
    source: Pending = field(default_factory=Pending)
    #: The last source id accounted for (returned by the reader, or a marker past it).
    last_source: Position | None = None
    #: Until when (epoch seconds) the source's tail is looked past for markers.
    watch_until: float = 0.0
    #: Skipped target ids not checked yet (HOLE_CHECKS_PER_BATCH): first in the next batch.
    unchecked: Runs = _NO_RUNS
    #: Starts (ledger, entry) of the candidate runs that probe past a ledger's last returned
    #: entry (:data:`cursorsync.mapping.skipped_ids.LEDGER_END_PROBE` ids each): a probe whose
    #: ids are all markers goes on with the next ones.
    probes: frozenset[tuple[int, int]] = frozenset()
    #: Digests given up by identity alignment, and its horizon (:mod:`cursorsync.core.alignment`).
    memory: Memory = _NO_MEMORY

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartitionState:
        """A partition's state as version 1 wrote it."""
        rows = d.get("unchecked") or []
        return cls(_position(d.get("last_target")),
                   Pending.from_json(d["target"]), Pending.from_json(d["source"]),
                   _position(d.get("last_source")), float(d.get("watch_until", 0.0)),
                   Runs(np.array(rows, np.int64).reshape(-1, 3)),
                   frozenset((int(lg), int(e)) for lg, e in d.get("probes") or []))


def _position(text: str | None) -> Position | None:
    return None if text is None else Position.parse(text)


_POSITION = pa.list_(pa.int64(), 2)
_IDS = pa.list_(pa.int64())
STATE_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()),
    ("last_target", _POSITION), ("last_source", _POSITION), ("watch_until", pa.float64()),
    ("target_ledger", _IDS), ("target_entry", _IDS), ("target_digest", pa.list_(pa.binary())),
    ("source_ledger", _IDS), ("source_entry", _IDS), ("source_digest", pa.list_(pa.binary())),
    ("unchecked", _IDS),  # (ledger, first entry, count) rows, flat
    ("probes", _IDS),  # (ledger, entry) pairs, flat
    ("target_stream", _IDS), ("target_publish", _IDS),
    ("source_stream", _IDS), ("source_publish", _IDS),
    # The alignment memory: per stream its watermark and the digests that left at it.
    ("memory_stream", _IDS), ("memory_mark", _IDS),
    ("memory_digests", pa.list_(pa.list_(pa.binary()))),
    ("horizon", pa.int64()), ("untimed", pa.list_(pa.binary())), ("blind", pa.bool_()),
], metadata={"version": str(STATE_VERSION)})


def state_table(parts: Mapping[PartitionKey, PartitionState]) -> pa.Table:
    """Every partition's state, one row each."""
    keys, states = list(parts), list(parts.values())

    def pos(p: Position | None) -> list[int] | None:
        return None if p is None else [p.ledger, p.entry]

    return pa.table([
        [k.topic for k in keys], [k.partition for k in keys],
        [pos(st.last_target) for st in states], [pos(st.last_source) for st in states],
        [st.watch_until for st in states],
        [st.target.ledger for st in states], [st.target.entry for st in states],
        [st.target.digest for st in states],
        [st.source.ledger for st in states], [st.source.entry for st in states],
        [st.source.digest for st in states],
        [st.unchecked.rows.ravel().tolist() for st in states],
        [[x for p in sorted(st.probes) for x in p] for st in states],
        [st.target._stream() for st in states], [st.target._publish() for st in states],
        [st.source._stream() for st in states], [st.source._publish() for st in states],
        [list(st.memory.streams) for st in states],
        [[m[0] for m in st.memory.streams.values()] for st in states],
        [[sorted(m[1]) for m in st.memory.streams.values()] for st in states],
        [st.memory.horizon for st in states],
        [sorted(st.memory.untimed) for st in states], [st.memory.blind for st in states],
    ], schema=STATE_SCHEMA)


def state_parts(table: pa.Table) -> dict[PartitionKey, PartitionState]:
    """The states :func:`state_table` wrote."""
    version = (table.schema.metadata or {}).get(b"version", b"").decode()
    if version not in ("2", str(STATE_VERSION)):
        raise ValueError(f"builder state version {version or None!r} is not "
                         f"{STATE_VERSION}; delete the checkpoint's builder-state to rebuild")
    c = {name: table.column(name).to_pylist() for name in table.column_names}
    n = table.num_rows
    none: list[Any] = [None] * n

    def pos(pair: list[int] | None) -> Position | None:
        return None if pair is None else Position(*pair)

    out = {}
    for i, (topic, partition) in enumerate(zip(c["topic"], c["partition"], strict=True)):
        unchecked, probes = c["unchecked"][i], c["probes"][i]
        memory = _memory(c, i) if version == str(STATE_VERSION) else _NO_MEMORY
        out[PartitionKey(topic, partition)] = PartitionState(
            pos(c["last_target"][i]),
            Pending(c["target_ledger"][i], c["target_entry"][i], c["target_digest"][i],
                    c.get("target_stream", none)[i] or (), c.get("target_publish", none)[i] or ()),
            Pending(c["source_ledger"][i], c["source_entry"][i], c["source_digest"][i],
                    c.get("source_stream", none)[i] or (), c.get("source_publish", none)[i] or ()),
            pos(c["last_source"][i]), c["watch_until"][i],
            Runs(np.array(unchecked, np.int64).reshape(-1, 3)) if unchecked else _NO_RUNS,
            frozenset(zip(probes[::2], probes[1::2], strict=True)), memory)
    return out


def _memory(c: dict[str, list[Any]], i: int) -> Memory:
    streams, untimed = c["memory_stream"][i], c["untimed"][i]
    if not streams and not untimed and c["horizon"][i] is None and not c["blind"][i]:
        return _NO_MEMORY
    marks = zip(c["memory_mark"][i], c["memory_digests"][i], strict=True)
    return Memory({k: (p, frozenset(ds)) for k, (p, ds) in zip(streams, marks, strict=True)},
                  c["horizon"][i], frozenset(untimed), bool(c["blind"][i]))


def json_parts(doc: dict[str, Any]) -> dict[PartitionKey, PartitionState]:
    """The states in a version 1 document (a JSON document per batch)."""
    if doc.get("version") != 1:
        raise ValueError(f"builder state version {doc.get('version')!r} is not 1; "
                         "delete the checkpoint's builder-state to rebuild")
    return {PartitionKey(p["topic"], p["partition"]): PartitionState.from_json(p)
            for p in doc["partitions"]}


def write_state(path: Path, state: pa.Table) -> None:
    """A :func:`state_table` to ``path``, whole or not at all (written beside it, then
    renamed)."""
    def write(tmp: Path) -> None:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, state.schema) as writer:
            writer.write_table(state)

    replace_file(path, write)


def read_state(path: Path) -> pa.Table:
    """What :func:`write_state` wrote; a file it cannot read is an error naming it."""
    try:
        with pa.OSFile(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"builder state {path} cannot be read ({err}); delete it, and the "
                         "batch after it starts without a state (identity matching restarts "
                         "with an empty window)") from err
