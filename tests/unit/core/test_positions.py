"""Pulsar's position and range-list text forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.positions import MessageId, Position, format_range_bounds, parse_range_bounds
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import PositionFormatError

ids = st.integers(-(2**63), 2**63 - 1)


def test_position_order_is_lexicographic_and_exact_for_64_bit_ids() -> None:
    big = Position(2**63 - 1, 2**63 - 1)
    assert Position(1, 2**62) < Position(2, -1) < Position(2, 0) < big
    assert Position.parse("9223372036854775807:-1") == Position(2**63 - 1, -1)
    assert str(Position(5, -1)) == "5:-1"
    with pytest.raises(ValueError):
        Position(2**63, 0)


def test_message_id_keeps_batch_index() -> None:
    m = MessageId(3, 4, 1, 7)
    assert m.position == Position(3, 4)
    assert str(m) == "3:4:1:7"


@pytest.mark.parametrize("text", [
    "[(0:0..0:1],(1:0..1:1]]",
    "[(0:0..0:1], (1:0..1:1]]",
    "[ (0:0..0:1] , (1:0..1:1] ]",
    "[(0:0‥0:1],(1:0‥1:1]]",
    "[(0:0 .. 0:1],(1:0..1:1]]",
])
def test_lenient_parse_strict_format(text: str) -> None:
    assert str(RangeSet.parse(text)) == "[(0:0..0:1],(1:0..1:1]]"


def test_empty_and_spanning_ranges() -> None:
    assert str(RangeSet.parse("[]")) == "[]"
    assert str(RangeSet.parse("[(1:9..2:3]]")) == "[(1:9..2:3]]"
    assert str(RangeSet.parse("[(5:-1..5:3]]")) == "[(5:-1..5:3]]"


@pytest.mark.parametrize(("text", "offset"), [
    ("[(1:5..1:6],(1:8-1:9]]", 16),
    ("(1:5..1:6]", 0),
    ("[(1:5..1:6)]", 10),
    ("[(1:5..1:6],]", 12),
    ("[(1:5..1:6]] trailing", 13),
    ("[(x:5..1:6]]", 2),
    ("[(1:5..1:6]", 11),
])
def test_malformed_text_names_the_offset(text: str, offset: int) -> None:
    with pytest.raises(PositionFormatError) as err:
        RangeSet.parse(text)
    assert err.value.offset == offset
    assert f"offset {offset}" in str(err.value)


def test_out_of_range_id_is_rejected() -> None:
    with pytest.raises(PositionFormatError):
        parse_range_bounds("[(1:0..99999999999999999999:1]]")


@given(st.lists(st.tuples(ids, ids, ids, ids), max_size=20))
def test_bounds_round_trip(rows: list[tuple[int, int, int, int]]) -> None:
    import numpy as np

    arr = np.array(rows, dtype=np.int64).reshape(-1, 4)
    text = format_range_bounds(arr)
    assert (parse_range_bounds(text) == arr).all()
    assert format_range_bounds(parse_range_bounds(text)) == text
