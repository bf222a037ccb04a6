"""What a received message id says beyond its accessors.

The Python client exposes ledger, entry, partition and batch index, but not
the number of messages in a batched entry. A received batched id serialises
as MessageIdData, whose field 6 is ``batch_size``: the entries source, the
emitter and the sandbox replicator all need it to know a batch is complete.
A chunked message's id (the client delivers it at its last chunk) carries
its first chunk's id in field 7, ``first_chunk_message_id``.
"""

from __future__ import annotations

from typing import Any


def read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def batch_size_of(message_id: Any) -> int | None:
    """Messages in the entry of ``message_id``: 1 if not batched, None if not known.

    The Python client has no accessor, but a received batched id serialises
    as MessageIdData with ``batch_size`` (field 6); we read it from there.
    """
    if message_id.batch_index() < 0:
        return 1
    buf = bytes(message_id.serialize())
    i = 0
    try:
        while i < len(buf):
            key, i = read_varint(buf, i)
            field_no, wire = key >> 3, key & 7
            if wire == 0:
                value, i = read_varint(buf, i)
                if field_no == 6:
                    return value if value > 0 else None
            elif wire == 2:
                n, i = read_varint(buf, i)
                i += n
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            else:
                return None
    except ValueError:
        return None
    return None


#: MessageIdData field 7 (first_chunk_message_id), length-delimited: its key byte.
_FIRST_CHUNK_KEY = (7 << 3) | 2


def first_chunk_of(message_id: Any) -> tuple[int, int] | None:
    """(ledger, entry) of the first chunk when ``message_id`` is a chunked message's,
    None for any other message. Cheap for the usual case: an id whose serialised bytes
    lack field 7's key byte cannot carry it, and only the others are parsed."""
    buf = bytes(message_id.serialize())
    if _FIRST_CHUNK_KEY not in buf:
        return None
    try:
        nested = _field_bytes(buf, 7)
        if nested is None:
            return None
        ledger = entry = None
        i = 0
        while i < len(nested):
            key, i = read_varint(nested, i)
            if key & 7 != 0:
                return None  # not the MessageIdData we know
            value, i = read_varint(nested, i)
            if key >> 3 == 1:
                ledger = value
            elif key >> 3 == 2:
                entry = value
    except ValueError:
        return None
    return None if ledger is None or entry is None else (ledger, entry)


def _field_bytes(buf: bytes, wanted: int) -> bytes | None:
    """The value of length-delimited field ``wanted`` at the top level of ``buf``."""
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        field_no, wire = key >> 3, key & 7
        if wire == 0:
            _, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            if field_no == wanted:
                return buf[i:i + n]
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return None
    return None
