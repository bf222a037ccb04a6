"""The job's mappings as the sync step reads them: a version per topic partition, and the
mapping itself packed into bytes unless a cursor of the partition was planned lately.

A job of 100,000 partitions holds 100,000 mappings, and most of their cursors sit still.
An idle cursor only needs to know that its partition's mapping has not changed since its
plan, which the version says; the mapping's objects (arrays of a few hundred bytes each)
are built for the partitions whose cursors are planned, and dropped again when a batch
goes by without a plan needing them. Memory then grows with the moving partitions; an idle
one keeps its packed bytes.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterator, Mapping
from typing import Protocol, overload, runtime_checkable

import numpy as np

from cursorsync.core.anchors import Anchors
from cursorsync.core.mapping import Runs, SegmentSet, TopicMapping
from cursorsync.core.records import PartitionKey

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
        (:mod:`cursorsync.core.mapping_retention`), with a new version."""
        ...


class PackedMappings(Mapping[PartitionKey, TopicMapping]):
    """Every partition's mapping packed, with the ones read or written since the last batch
    began kept built as well (:meth:`next_batch` drops the others)."""

    def __init__(self) -> None:
        self._packed: dict[PartitionKey, bytes] = {}
        self._built: dict[PartitionKey, TopicMapping] = {}
        self._read: set[PartitionKey] = set()

    @classmethod
    def of(cls, mappings: Mapping[PartitionKey, TopicMapping]) -> PackedMappings:
        held = cls()
        for key, mapping in mappings.items():
            held.put(key, mapping)
        return held

    def put(self, key: PartitionKey, mapping: TopicMapping) -> None:
        """The partition's mapping is now ``mapping``, with a new version (kept built, as
        if read)."""
        self._packed[key] = pack_mapping(mapping, next(_VERSIONS))
        self._built[key] = mapping
        self._read.add(key)

    trim = put

    def merge(self, key: PartitionKey, mapping: TopicMapping) -> None:
        """Union ``mapping`` into the partition's (MappingConflictError when they disagree)."""
        built = self._built.get(key)
        if built is None:
            data = self._packed.get(key)
            built = None if data is None else unpack_mapping(data)
        self.put(key, mapping if built is None else built.union(mapping))

    def version(self, key: PartitionKey) -> int:
        data = self._packed.get(key)
        return NO_VERSION if data is None else packed_version(data)

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
            data = self._packed.get(key)
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

    @property
    def built(self) -> int:
        """How many mappings are kept built."""
        return len(self._built)

    def __getitem__(self, key: PartitionKey) -> TopicMapping:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        return key in self._packed

    def __iter__(self) -> Iterator[PartitionKey]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)


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
