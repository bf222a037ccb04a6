"""What a received message id says beyond its accessors.

The Python client exposes ledger, entry, partition and batch index, but not
the number of messages in a batched entry. A received batched id serialises
as MessageIdData, whose field 6 is ``batch_size``: the entries source, the
emitter and the sandbox replicator all need it to know a batch is complete.
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
