"""What a received message id says beyond its accessors.

The Python client exposes ledger, entry, partition and batch index, but not
the number of messages in a batched entry. A received batched id serialises
as MessageIdData, whose field 6 is ``batch_size``: the entries source needs
it to know a batch is complete.
A chunked message's id (the client delivers it at its last chunk) carries
its first chunk's id in field 7, ``first_chunk_message_id``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: A varint holds at most 64 bits: 10 bytes of 7.
_MAX_VARINT_BYTES = 10


def read_varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at byte ``i`` and the offset after it; ValueError naming the byte when
    ``buf`` ends inside it or it runs past 64 bits."""
    start = i
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ValueError(f"truncated varint at byte {start}")
        if i - start == _MAX_VARINT_BYTES:
            raise ValueError(f"varint at byte {start} is longer than {_MAX_VARINT_BYTES} bytes")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The top-level (field number, value) pairs of a protobuf message: an int for a
    varint, the bytes of a length-delimited field; fixed-size fields are skipped. Raises
    ValueError naming the byte on bytes that are not a protobuf message."""
    i = 0
    while i < len(buf):
        start = i
        key, i = read_varint(buf, i)
        field_no, wire = key >> 3, key & 7
        if field_no == 0:
            raise ValueError(f"field number 0 at byte {start}: not a protobuf field")
        if wire == 0:
            value, i = read_varint(buf, i)
            yield field_no, value
            continue
        if wire == 2:
            n, i = read_varint(buf, i)
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
        else:
            raise ValueError(
                f"field {field_no} at byte {start}: wire type {wire} is not supported")
        if i + n > len(buf):
            raise ValueError(f"field {field_no} at byte {start}: its {n} bytes run past the "
                             f"end of the {len(buf)}-byte message")
        if wire == 2:
            yield field_no, buf[i:i + n]
        i += n


def batch_size_of(message_id: Any) -> int | None:
    """Messages in the entry of ``message_id``: 1 if not batched, None if not known.

    The Python client has no accessor, but a received batched id serialises
    as MessageIdData with ``batch_size`` (field 6); we read it from there.
    """
    if message_id.batch_index() < 0:
        return 1
    try:
        for field_no, value in fields(bytes(message_id.serialize())):
            if field_no == 6 and isinstance(value, int):
                return value if value > 0 else None
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
        nested = next((v for f, v in fields(buf) if f == 7 and isinstance(v, bytes)), None)
        if nested is None:
            return None
        inner = {f: v for f, v in fields(nested) if isinstance(v, int)}
    except ValueError:
        return None
    if 1 not in inner or 2 not in inner:
        return None
    return inner[1], inner[2]
