"""Message-id bytes fuzzed: round trips, the client's own ids, and every malformed input
one error naming the byte."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.pulsar.msgid import batch_size_of, fields, first_chunk_of
from tests.support.fuzzing import FUZZ

# ------------------------------------------------------------------------ message-id bytes


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def message_id_fields(ledger: int, entry: int, partition: int, batch_index: int,
                      batch_size: int | None, first_chunk: tuple[int, int] | None,
                      ) -> list[bytes]:
    """MessageIdData's fields as the client writes them, one bytes chunk each."""
    out = [varint(1 << 3) + varint(ledger), varint(2 << 3) + varint(entry),
           varint(3 << 3) + varint(partition), varint(4 << 3) + varint(batch_index)]
    if batch_size is not None:
        out.append(varint(6 << 3) + varint(batch_size))
    if first_chunk is not None:
        nested = varint(1 << 3) + varint(first_chunk[0]) + varint(2 << 3) + varint(first_chunk[1])
        out.append(varint(7 << 3 | 2) + varint(len(nested)) + nested)
    return out


class FakeId:
    """What batch_size_of and first_chunk_of use of a client MessageId."""

    def __init__(self, data: bytes, batch_index: int = 0) -> None:
        self._data = data
        self._batch_index = batch_index

    def batch_index(self) -> int:
        return self._batch_index

    def serialize(self) -> bytes:
        return self._data


U63 = st.integers(0, 2**63 - 1)
message_ids = st.tuples(U63, U63, st.integers(-1, 2**31 - 1), st.integers(-1, 2**31 - 1),
                        st.none() | st.integers(0, 2**31 - 1),
                        st.none() | st.tuples(U63, U63))


@FUZZ
@given(message_ids)
def test_message_id_round_trip(mid: tuple[Any, ...]) -> None:
    ledger, entry, partition, batch_index, batch_size, first_chunk = mid
    data = b"".join(message_id_fields(*mid))
    got = list(fields(data))
    assert got[:4] == [(1, ledger), (2, entry), (3, partition % 2**64),
                       (4, batch_index % 2**64)]
    fake = FakeId(data, batch_index)
    expected_size = 1 if batch_index < 0 else (batch_size or None)
    assert batch_size_of(fake) == expected_size
    assert first_chunk_of(fake) == first_chunk


@FUZZ
@given(U63, U63, st.integers(-1, 2**31 - 1), st.integers(-1, 2**31 - 1))
def test_message_id_of_the_client_parses(ledger: int, entry: int, partition: int,
                                         batch_index: int) -> None:
    pulsar = pytest.importorskip("pulsar")
    data = bytes(pulsar.MessageId(partition, ledger, entry, batch_index).serialize())
    got = dict(fields(data))
    assert (got[1], got[2]) == (ledger, entry)
    assert first_chunk_of(FakeId(data)) is None


def check_msgid_error(err: ValueError, data: bytes) -> None:
    match = re.search(r"at byte (\d+)", str(err))
    assert match, str(err)
    assert 0 <= int(match.group(1)) <= len(data)


@FUZZ
@given(st.binary(max_size=64))
def test_message_id_random_bytes(data: bytes) -> None:
    try:
        parsed = list(fields(data))
    except ValueError as err:
        check_msgid_error(err, data)
    else:
        assert all(isinstance(v, int | bytes) for _, v in parsed)
    for batch_index in (-1, 0, 3):
        size = batch_size_of(FakeId(data, batch_index))
        assert size is None or (isinstance(size, int) and size > 0)
    chunk = first_chunk_of(FakeId(data))
    assert chunk is None or all(isinstance(x, int) for x in chunk)


@FUZZ
@given(message_ids, st.data())
def test_message_id_truncated_inside_a_field(mid: tuple[Any, ...], data: st.DataObject) -> None:
    chunks = message_id_fields(*mid)
    whole = b"".join(chunks)
    ends = {sum(len(c) for c in chunks[:i]) for i in range(len(chunks) + 1)}
    cut = data.draw(st.integers(1, len(whole) - 1).filter(lambda n: n not in ends), label="cut")
    with pytest.raises(ValueError) as info:
        list(fields(whole[:cut]))
    check_msgid_error(info.value, whole[:cut])


def test_message_id_malformed_examples_name_the_byte() -> None:
    for data, where in [(b"\x08\x96", "at byte 1"), (b"\x08\x01\x0b", "at byte 2"),
                        (b"\x08\x01\x12\x05ab", "at byte 2"), (b"\x09\x00", "at byte 0"),
                        (b"\x08" + b"\xff" * 11, "at byte 1")]:
        with pytest.raises(ValueError, match=where):
            list(fields(data))
