"""``pulsar-entries``' rows: what each message or entry becomes (ids, fields, digests), and
those rows as Arrow record batches, packed one per Spark row for ``layout=arrow``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from cursorsync.core.identity import Digester, entry_digest
from cursorsync.mapping.entries_options import (
    ARROW_BATCH_ROWS,
    COLUMNS,
    PACKED_SCHEMA,
    EntriesReadError,
    Row,
    schema_of,
)
from cursorsync.mapping.entries_tasks import EntriesPartition

#: Columns that need a message's own fields beyond its id and properties.
MESSAGE_FIELD_COLUMNS = frozenset({"producer_name", "publish_time", "event_time",
                                    "partition_key", "ordering_key", "identity", "payload_size"})


#: A message's replicated fields, in Digester argument order: producer name, sequence id
#: (the Python client has no accessor), publish time, event time, partition key,
#: ordering key, properties, payload.
_Fields = tuple[str, None, int, int | None, str | None, bytes | None, dict[str, str], bytes]


def _fields_of(msg: Any, props: dict[str, str]) -> _Fields:
    ordering_key = msg.ordering_key() or None
    return (msg.producer_name(), None, msg.publish_timestamp(), msg.event_timestamp() or None,
            msg.partition_key() or None,
            ordering_key.encode("utf-8") if isinstance(ordering_key, str) else ordering_key,
            props, msg.data())


#: A message picked for a row: its id, its fields (None where nothing needs them), its
#: properties and its digest.
_Picked = tuple[Any, _Fields | None, dict[str, str], bytes | None]


def row_values(part: EntriesPartition, where: tuple[str, int], entry: Entry,
               wide: bool, digester: Digester) -> list[Row]:
    """Rows of one entry's messages (all of them, in batch order, or the first with
    rowsPer=entry). ``where`` is the topic's (base name, partition index), worked out once
    per read; ``wide`` says the selected columns need each message's own fields."""
    picked = _picked_messages(part, entry, wide, digester)
    if picked is None:
        return []
    rows, entry_identity = picked
    prop = part.source_position_property
    size = len(entry.messages)
    ledger, entry_id = entry.pos
    first = None if entry.first_chunk is None else "{}:{}".format(*entry.first_chunk)
    out: list[Row] = []
    for mid, fields, props, identity in rows:
        if fields is None:
            out.append((part.cluster, where[0], where[1], ledger, entry_id, mid.batch_index(),
                        size, None, None, None, props, None, None,
                        props.get(prop), identity, entry_identity,
                        None, first))
            continue
        producer, _, publish, event, partition_key, ordering_key, _, payload = fields
        out.append((
            part.cluster, where[0], where[1], ledger, entry_id,
            mid.batch_index(), size, producer, publish, event, props, partition_key,
            None if ordering_key is None else ordering_key.decode(),
            props.get(prop), identity, entry_identity, len(payload), first,
        ))
    return out


def _picked_messages(part: EntriesPartition, entry: Entry, wide: bool, digester: Digester,
                     ) -> tuple[list[_Picked], bytes | None] | None:
    """The messages of ``entry`` that get a row, and the entry's digest; None when the
    entry gets no row at all.

    A digest is only used to align entries without the source-position property, and
    it is the most expensive part of a row, so it is computed only where usable; the
    other fields are only extracted where a selected column or the digest needs them.
    """
    prop = part.source_position_property
    # A chunked message has no identity of its own here (its entry is its last chunk):
    # its chunks map by their stamps, the last one by the message's (which is the last
    # chunk's), the others as skipped ids (cursorsync.mapping.hole_check). It gets a row
    # on the source too: a copy of the target's there names its original and its span.
    chunked = entry.first_chunk is not None
    in_scope = (part.identity and not chunked
                and (entry.batched or not part.identity_batched_only))
    if part.identity_rows_only and not in_scope and not chunked:
        return None  # an entry identity evidence will not use: no row at all
    per_entry = part.per_entry
    identities: list[bytes | None] = []
    rows: list[_Picked] = []
    for i, msg in enumerate(entry.messages):
        props = msg.properties()  # a new dict per call
        # On the target, a stamped entry is mapped by its stamp; on the source side
        # (identity_rows_only) a stamp from a third cluster means nothing here.
        digest_it = in_scope and (part.identity_rows_only or not part.position_evidence
                                  or prop not in props)
        row_wanted = i == 0 or not per_entry
        fields = _fields_of(msg, props) if digest_it or (row_wanted and wide) else None
        identity = digester(*fields) if digest_it and fields is not None else None
        identities.append(identity)
        if row_wanted:
            rows.append((entry.ids[i], fields, props, identity))
        if not in_scope and per_entry:
            break  # one row, no entry digest: the other messages add nothing
    entry_identity = (entry_digest(identities)  # type: ignore[arg-type]  # no None: checked
                      if in_scope and None not in identities else None)
    if part.identity_rows_only and entry_identity is None and not chunked:
        return None
    return rows, entry_identity


class Entry:
    """The messages of one entry read so far, each batch index once (a plain class: one is
    made per entry read)."""

    __slots__ = ("_seen", "batched", "first_chunk", "ids", "messages", "pos", "size")

    def __init__(self, pos: tuple[int, int], size: int | None, mid: Any, msg: Any,
                 index: int, first_chunk: tuple[int, int] | None = None) -> None:
        self.pos = pos
        self.size = size
        self.batched = index >= 0
        #: A chunked message's first chunk (this entry is its last): no identity digest.
        self.first_chunk = first_chunk
        self.ids = [mid]
        self.messages = [msg]
        self._seen = {index}

    def add(self, mid: Any, msg: Any) -> None:
        index = mid.batch_index()
        if index in self._seen:
            return  # re-delivered within the entry
        self._seen.add(index)
        self.ids.append(mid)
        self.messages.append(msg)

    @property
    def complete(self) -> bool:
        return self.size is not None and len(self.messages) >= self.size


def arrow_batches(rows: Iterator[Row], columns: Sequence[str],
                  size: int = ARROW_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Rows -> Arrow record batches of the selected columns.

    Spark converts tuples a read() yields cell by cell in Python (a converter
    call per column per row); a record batch it passes through as it is.
    """
    schema = to_arrow_schema(schema_of(columns), timezone="UTC")
    picks = [COLUMNS.index(c) for c in schema.names]
    while True:
        chunk = list(itertools.islice(rows, size))
        if not chunk:
            return
        cols = list(zip(*chunk, strict=True))
        yield pa.RecordBatch.from_arrays(
            [pa.array(cols[i], type=f.type) for i, f in zip(picks, schema, strict=True)],
            schema=schema)


def pack_batches(batches: Iterator[pa.RecordBatch], cluster: str) -> Iterator[pa.RecordBatch]:
    """Each record batch packed into one row holding its Arrow IPC stream
    (``layout=arrow``); :func:`unpack_batches` turns them back.

    The stream is written into one buffer and handed on without a copy.
    """
    schema = to_arrow_schema(PACKED_SCHEMA, timezone="UTC")
    for batch in batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        blob = sink.getvalue()
        offsets = pa.array([0, blob.size], pa.int32()).buffers()[1]
        yield pa.RecordBatch.from_arrays(
            [pa.array([cluster]), pa.array([batch.num_rows], pa.int64()),
             pa.Array.from_buffers(pa.binary(), 1, [None, offsets, blob])], schema=schema)


def unpack_batches(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The record batches :func:`pack_batches` packed into the rows of a ``layout=arrow``
    batch (``PACKED_SCHEMA`` rows), as one table of the selected columns; EntriesReadError
    if a row holds other columns (executors running another cursorsync version than the
    driver)."""
    schema = to_arrow_schema(schema_of(columns), timezone="UTC")
    parts = [pa.ipc.open_stream(blob.as_buffer()).read_all()
             for chunk in table.column("arrow").chunks for blob in chunk]
    for part in parts:
        if not part.schema.equals(schema):
            raise EntriesReadError(
                f"pulsar-entries layout=arrow: a row holds columns {part.schema.names}, "
                f"expected {schema.names}; are the executors on another cursorsync version "
                f"than the driver?")
    return pa.concat_tables(parts) if parts else schema.empty_table()
