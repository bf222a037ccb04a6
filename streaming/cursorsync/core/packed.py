"""The job's mappings as the sync step reads them: a version per topic partition, and the
mapping itself packed into bytes unless a cursor of the partition was planned lately.

A job of 100,000 partitions holds 100,000 mappings, and most of their cursors sit still.
An idle cursor only needs to know that its partition's mapping has not changed since its
plan, which the version says; the mapping's objects (arrays of a few hundred bytes each)
are built for the partitions whose cursors are planned, and dropped again when a batch
goes by without a plan needing them. An idle one keeps its packed bytes, in arrays sorted
by key that can live in a memory-mapped file (:class:`ArrayKeeper`): then the heap grows with
the moving partitions only.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol, overload, runtime_checkable

import numpy as np

from cursorsync.core import sorting
from cursorsync.core.anchors import Anchors
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs, SegmentSet, TopicMapping

#: Versions are unique in the process, whichever holder hands them out, so a version read
#: from one holder never equals one from another.
_VERSIONS = itertools.count(1)
#: The version of a partition no holder has a mapping for.
NO_VERSION = 0

#: A packed mapping's head: version, written_at (NaN: none), then the row counts of the
#: segments, the four kinds of runs and the anchors. The int64 arrays follow in that order,
#: then the segments' evidence bit-sets (int8).
_HEAD = struct.Struct("=qd6q")
_RUN_KINDS = ("skippable", "foreign", "unreplicated", "unpaired")

#: Shared by every mapping without runs of a kind, or without anchors: most of a large job's
#: mappings have none, and an empty array costs a hundred bytes.
NO_RUNS = Runs(np.empty((0, 3), np.int64))
NO_RUNS.rows.setflags(write=False)
NO_ANCHORS = Anchors()


def pack_mapping(mapping: TopicMapping, version: int = NO_VERSION) -> bytes:
    """A mapping (and the version it has in its holder) as bytes; :func:`unpack_mapping`
    inverts it."""
    segments = mapping.segments
    runs = [getattr(mapping, kind).rows for kind in _RUN_KINDS]
    anchors = mapping.anchors.rows
    written = math.nan if mapping.written_at is None else mapping.written_at
    head = _HEAD.pack(version, written, len(segments), *(len(r) for r in runs), len(anchors))
    return b"".join((head, segments.rows.tobytes(), *(r.tobytes() for r in runs),
                     anchors.tobytes(), segments.evidence_codes.tobytes()))


def packed_version(data: bytes) -> int:
    version: int = _HEAD.unpack_from(data)[0]
    return version


def unpack_mapping(data: bytes) -> TopicMapping:
    _, written, n_seg, *counts = _HEAD.unpack_from(data)
    n_runs, n_anchors = counts[:4], counts[4]
    ints = n_seg * 5 + 3 * sum(n_runs) + 4 * n_anchors
    a = np.frombuffer(data, np.int64, ints, _HEAD.size)
    segments = a[:n_seg * 5].reshape(-1, 5)
    at = n_seg * 5
    runs = []
    for n in n_runs:
        runs.append(Runs(a[at:at + 3 * n].reshape(-1, 3)) if n else NO_RUNS)
        at += 3 * n
    anchors = Anchors.canonical(a[at:].reshape(-1, 4)) if n_anchors else NO_ANCHORS
    evidence = np.frombuffer(data, np.int8, n_seg, _HEAD.size + 8 * ints)
    skippable, foreign, unreplicated, unpaired = runs
    return TopicMapping(SegmentSet(segments, evidence, validate=False) if n_seg
                        else SegmentSet(), skippable, foreign, unreplicated,
                        written_at=None if math.isnan(written) else written,
                        unpaired=unpaired, anchors=anchors)


@runtime_checkable
class Mappings(Protocol):
    """What the sync step reads mappings through."""

    def version(self, key: PartitionKey) -> int:
        """Changes whenever the partition's mapping does (NO_VERSION: none)."""
        ...

    def get(self, key: PartitionKey) -> TopicMapping | None: ...

    def trim(self, key: PartitionKey, live: TopicMapping) -> None:
        """The partition's mapping is now ``live``, its part the sync still needs
        (:mod:`cursorsync.core.retention`), with a new version."""
        ...


class ArrayKeeper(Protocol):
    """Where a holder keeps its settled arrays: an equal array, in memory or mapped from a
    file (:class:`cursorsync.tables.spill.Spill`)."""

    def array(self, values: np.ndarray) -> np.ndarray: ...


class InMemory:
    """Arrays stay on the heap."""

    def array(self, values: np.ndarray) -> np.ndarray:
        return values


#: Fresh mappings move into the settled arrays once they are this many, or this share of
#: the settled ones (whichever is more): a settle rewrites every partition's row.
SETTLE_MIN = 1024
SETTLE_SHARE = 16


class PackedMappings(Mapping[PartitionKey, TopicMapping]):
    """Every partition's mapping packed, with the ones read or written since the last batch
    began kept built as well (:meth:`next_batch` drops the others).

    The packed mappings are *settled*: four arrays sorted by key (the key's bytes, the
    version, the bytes of all mappings and where each begins), with no Python object per
    partition, kept where ``spill`` puts them (a memory-mapped file, so an idle partition
    costs the driver's heap nothing). Mappings written since the last settle are *fresh*,
    in a dict, until :meth:`settle` finds them many.
    """

    def __init__(self, spill: ArrayKeeper | None = None) -> None:
        self._spill = spill or InMemory()
        self._keys = np.empty(0, "S1")
        self._versions = np.empty(0, np.int64)
        self._data = np.empty(0, np.uint8)
        self._offsets = np.zeros(1, np.int64)
        self._fresh: dict[PartitionKey, bytes] = {}
        self._built: dict[PartitionKey, TopicMapping] = {}
        self._read: set[PartitionKey] = set()

    @classmethod
    def of(cls, mappings: Mapping[PartitionKey, TopicMapping],
           spill: ArrayKeeper | None = None) -> PackedMappings:
        held = cls(spill)
        for key, mapping in mappings.items():
            held.put(key, mapping)
        held.settle(always=True)
        return held

    def put(self, key: PartitionKey, mapping: TopicMapping) -> None:
        """The partition's mapping is now ``mapping``, with a new version (kept built, as
        if read)."""
        self._fresh[key] = pack_mapping(mapping, next(_VERSIONS))
        self._built[key] = mapping
        self._read.add(key)

    trim = put

    def merge(self, key: PartitionKey, mapping: TopicMapping) -> None:
        """Union ``mapping`` into the partition's (MappingConflictError when they disagree)."""
        built = self._built.get(key)
        if built is None:
            data = self._packed(key)
            built = None if data is None else unpack_mapping(data)
        self.put(key, mapping if built is None else built.union(mapping))

    def version(self, key: PartitionKey) -> int:
        data = self._fresh.get(key)
        if data is not None:
            return packed_version(data)
        slot = self._slot(key)
        return NO_VERSION if slot < 0 else int(self._versions[slot])

    def versions(self, keys: np.ndarray) -> np.ndarray:
        """The versions of many partitions at once, by their keys' bytes
        (:func:`key_bytes`, a numpy ``S`` array)."""
        out = _find(self._versions, self._keys, keys)
        if self._fresh:
            fresh = keys_bytes(self._fresh)
            order = sorting.argsort(fresh)
            found = _find(np.array([packed_version(d) for d in self._fresh.values()],
                                   np.int64)[order], fresh[order], keys)
            out = np.where(found != NO_VERSION, found, out)
        return out

    @overload  # type: ignore[override]
    def get(self, key: PartitionKey) -> TopicMapping | None: ...
    @overload
    def get(self, key: PartitionKey, default: TopicMapping) -> TopicMapping: ...

    def get(self, key: PartitionKey, default: TopicMapping | None = None,
            ) -> TopicMapping | None:
        """The partition's mapping, built (and kept built until a batch goes by without
        reading it)."""
        built = self._built.get(key)
        if built is None:
            data = self._packed(key)
            if data is None:
                return default
            built = self._built[key] = unpack_mapping(data)
        self._read.add(key)
        return built

    def next_batch(self) -> None:
        """A batch begins: mappings no one read or wrote in the last one are kept packed
        only."""
        if len(self._read) < len(self._built):
            # A new dict: one emptied by deletes keeps its size.
            self._built = {k: m for k, m in self._built.items() if k in self._read}
        self._read = set()
        self.settle()

    def settle(self, *, always: bool = False) -> None:
        """Moves the fresh mappings into the settled arrays when they are many (``always``:
        whenever there are any)."""
        if not self._fresh or (not always and len(self._fresh) < max(
                SETTLE_MIN, len(self._keys) // SETTLE_SHARE)):
            return
        fresh = keys_bytes(self._fresh)
        blobs = list(self._fresh.values())
        keys = np.concatenate([self._keys, fresh])
        versions = np.concatenate([self._versions, np.array(
            [packed_version(b) for b in blobs], np.int64)])
        data = np.concatenate([self._data, np.frombuffer(b"".join(blobs), np.uint8)])
        ends = self._offsets[-1] + np.cumsum([len(b) for b in blobs], dtype=np.int64)
        offsets = np.concatenate([self._offsets, ends])
        # A fresh mapping replaces its settled one; the fresh rows come last, so a stable
        # sort puts each key's fresh row after its settled one.
        order = sorting.argsort(keys)
        last = np.ones(len(order), bool)
        last[:-1] = keys[order[1:]] != keys[order[:-1]]
        rows = order[last]
        starts, lengths = offsets[rows], np.diff(offsets)[rows]
        spill = self._spill
        # All four first: a spill that fails leaves the holder as it was.
        settled = (spill.array(keys[rows]), spill.array(versions[rows]),
                   spill.array(_gather(data, starts, lengths)),
                   spill.array(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)))
        self._keys, self._versions, self._data, self._offsets = settled
        self._fresh = {}

    @property
    def built(self) -> int:
        """How many mappings are kept built."""
        return len(self._built)

    @property
    def settled_bytes(self) -> int:
        """Bytes of the settled arrays."""
        return sum(a.nbytes for a in self.settled_arrays())

    def settled_arrays(self) -> tuple[np.ndarray, ...]:
        """The settled arrays: keys, versions, packed bytes, where each mapping begins."""
        return self._keys, self._versions, self._data, self._offsets

    @property
    def fresh(self) -> int:
        """How many mappings are written since the last settle."""
        return len(self._fresh)

    def _slot(self, key: PartitionKey) -> int:
        """Where the partition's settled row is; -1 when it has none."""
        if not len(self._keys):
            return -1
        want = key_bytes(key)
        at = int(sorting.searchsorted(self._keys, want))
        return at if at < len(self._keys) and self._keys[at] == want else -1

    def _packed(self, key: PartitionKey) -> bytes | None:
        data = self._fresh.get(key)
        if data is not None:
            return data
        slot = self._slot(key)
        if slot < 0:
            return None
        # A copy: a built mapping must not hold a file the next settle replaces.
        return self._data[self._offsets[slot]:self._offsets[slot + 1]].tobytes()

    def __getitem__(self, key: PartitionKey) -> TopicMapping:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        return isinstance(key, PartitionKey) and (key in self._fresh or self._slot(key) >= 0)

    def __iter__(self) -> Iterator[PartitionKey]:
        for raw in self._keys.tolist():
            key = _partition_key(raw)
            if key not in self._fresh:
                yield key
        yield from self._fresh

    def __len__(self) -> int:
        if not self._fresh:
            return len(self._keys)
        fresh = keys_bytes(self._fresh)
        settled = _find(np.ones(len(self._keys), np.int64), self._keys, fresh)
        return len(self._keys) + int(np.count_nonzero(settled == NO_VERSION))


def key_bytes(key: PartitionKey) -> bytes:
    """A partition's key as the settled arrays sort it: topic, NUL, partition (a topic
    name holds no NUL, and the key never ends in one, which numpy would drop)."""
    return f"{key.topic}\0{key.partition}".encode()


def keys_bytes(keys: Iterable[PartitionKey]) -> np.ndarray:
    """Many partitions' :func:`key_bytes`, as the numpy ``S`` array :meth:`versions` takes."""
    return np.array([key_bytes(k) for k in keys], "S")


def _partition_key(raw: bytes) -> PartitionKey:
    topic, _, partition = raw.decode().rpartition("\0")
    return PartitionKey(topic, int(partition))


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The spans ``[start, start + length)`` of ``data``, one after another, copied a run
    of adjacent spans at a time (settled rows keep their order, so most are one run)."""
    if not len(starts):
        return data[:0]
    ends = starts + lengths
    cut = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    first = np.concatenate(([0], cut))
    last = np.concatenate((cut - 1, [len(starts) - 1]))
    return np.concatenate([data[s:e] for s, e in zip(starts[first].tolist(),
                                                      ends[last].tolist(), strict=True)])


def _find(values: np.ndarray, keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``values`` at each wanted key's place in the sorted ``keys``; NO_VERSION where it
    is not there."""
    out = np.full(len(wanted), NO_VERSION, np.int64)
    if not len(keys) or not len(wanted):
        return out
    at = np.minimum(sorting.searchsorted(keys, wanted), len(keys) - 1)
    hit = keys[at] == wanted
    out[hit] = values[at[hit]]
    return out




class HeldMappings:
    """Mappings handed over as objects (a dict per batch): a partition's version changes
    when its mapping object does."""

    def __init__(self) -> None:
        self._given: dict[PartitionKey, TopicMapping] = {}
        #: The given mapping, or its live part once trimmed.
        self._held: dict[PartitionKey, TopicMapping] = {}
        self._versions: dict[PartitionKey, int] = {}

    def adopt(self, given: Mapping[PartitionKey, TopicMapping]) -> HeldMappings:
        for key, mapping in given.items():
            if self._given.get(key) is not mapping:
                self._given[key] = self._held[key] = mapping
                self._versions[key] = next(_VERSIONS)
        for key in self._given.keys() - given.keys():
            del self._given[key], self._held[key], self._versions[key]
        return self

    def trim(self, key: PartitionKey, live: TopicMapping) -> None:
        self._held[key] = live
        self._versions[key] = next(_VERSIONS)

    def version(self, key: PartitionKey) -> int:
        return self._versions.get(key, NO_VERSION)

    def get(self, key: PartitionKey) -> TopicMapping | None:
        return self._held.get(key)
