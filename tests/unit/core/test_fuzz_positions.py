"""Positions and ranges parsed from fuzzed text: round trips, and every error located and
naming what is wrong."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.positions import (
    Position,
    format_range_bounds,
    parse_range_bounds,
)
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import PositionFormatError
from tests.support.fuzzing import FUZZ

INT64 = st.integers(-(2**63), 2**63 - 1)
OUT_OF_INT64 = st.one_of(st.integers(max_value=-(2**63) - 1), st.integers(min_value=2**63))
WS = st.sampled_from(["", " ", "  ", "\t", "\n"])


# ------------------------------------------------------------------------ positions, ranges


def check_position_error(err: PositionFormatError, text: str) -> None:
    """The error names an offset inside the text, what was expected there, and the text."""
    assert 0 <= err.offset <= len(text), (err.offset, text)
    assert err.expected and err.expected != "a range list"
    message = str(err)
    assert f"offset {err.offset}" in message
    assert err.expected in message
    assert repr(text[err.offset:err.offset + 12]) in message


@FUZZ
@given(INT64, INT64, WS, WS, WS, WS)
def test_position_round_trip(ledger: int, entry: int, a: str, b: str, c: str, d: str) -> None:
    p = Position(ledger, entry)
    assert Position.parse(str(p)) == p
    assert Position.parse(f"{a}{ledger}{b}:{c}{entry}{d}") == p


@FUZZ
@given(st.one_of(st.text(max_size=40), st.text(alphabet="0123456789-: x\t", max_size=30)))
def test_position_random_text(text: str) -> None:
    try:
        p = Position.parse(text)
    except PositionFormatError as err:
        check_position_error(err, text)
    else:
        assert Position.parse(str(p)) == p


@FUZZ
@given(INT64, INT64, st.data())
def test_position_single_change_is_located_at_or_before_it(ledger: int, entry: int,
                                                            data: st.DataObject) -> None:
    text = str(Position(ledger, entry))
    k = data.draw(st.integers(0, len(text)), label="k")
    bad = data.draw(st.sampled_from(["x", ".", ",", "(", "]", ":", "-", ""]), label="bad")
    mutated = text[:k] + bad + text[k + 1:]
    try:
        Position.parse(mutated)
    except PositionFormatError as err:
        check_position_error(err, mutated)
        assert err.offset <= max(k, len(mutated))


@FUZZ
@given(OUT_OF_INT64, INT64, st.booleans())
def test_position_out_of_int64_names_the_id(big: int, other: int, ledger_side: bool) -> None:
    text = f"{big}:{other}" if ledger_side else f"{other}:{big}"
    with pytest.raises(PositionFormatError) as info:
        Position.parse(text)
    check_position_error(info.value, text)
    assert info.value.offset == text.index(str(big), 0 if ledger_side else len(str(other)))
    assert "64-bit" in info.value.expected


def test_position_with_thousands_of_digits_is_a_format_error() -> None:
    text = "1:" + "9" * 5000
    with pytest.raises(PositionFormatError) as info:
        Position.parse(text)
    assert info.value.offset == 2
    with pytest.raises(PositionFormatError) as info:
        parse_range_bounds(f"[(1:1..1:2],(1:{'9' * 5000}..2:1]]")
    assert info.value.offset == 15


rows_strategy = st.lists(st.tuples(INT64, INT64, INT64, INT64), max_size=12)


@st.composite
def spelled_ranges(draw: st.DrawFn) -> tuple[np.ndarray, str]:
    """Bounds and one of the spellings the parser accepts for them."""
    rows = draw(rows_strategy)
    parts = []
    for a, b, c, d in rows:
        sep = draw(st.sampled_from(["..", "‥", "…"]))
        w = [draw(WS) for _ in range(8)]
        parts.append(f"({w[0]}{a}{w[1]}:{w[2]}{b}{w[3]}{sep}{w[4]}{c}:{w[5]}{d}{w[6]}]")
    comma = draw(st.sampled_from([",", ", ", " , "]))
    text = draw(WS) + "[" + draw(WS) + comma.join(parts) + draw(WS) + "]" + draw(WS)
    return np.array(rows, dtype=np.int64).reshape(-1, 4), text


@FUZZ
@given(spelled_ranges())
def test_range_bounds_round_trip(spelled: tuple[np.ndarray, str]) -> None:
    bounds, text = spelled
    parsed = parse_range_bounds(text)
    assert parsed.dtype == np.int64 and parsed.shape == bounds.shape
    assert (parsed == bounds).all()
    canonical = format_range_bounds(parsed)
    assert (parse_range_bounds(canonical) == bounds).all()


RANGE_ALPHABET = "[]():.,-‥ 0123456789"


@FUZZ
@given(st.one_of(st.text(max_size=60), st.text(alphabet=RANGE_ALPHABET, max_size=60)))
def test_range_random_text(text: str) -> None:
    try:
        bounds = parse_range_bounds(text)
    except PositionFormatError as err:
        check_position_error(err, text)
    else:
        assert (parse_range_bounds(format_range_bounds(bounds)) == bounds).all()


@FUZZ
@given(rows_strategy.filter(bool), st.data())
def test_range_truncated_or_changed_text_is_located(rows: list[tuple[int, ...]],
                                                    data: st.DataObject) -> None:
    text = format_range_bounds(np.array(rows, dtype=np.int64))
    k = data.draw(st.integers(0, len(text) - 1), label="k")
    bad = data.draw(st.sampled_from(["", "x", "(", ")", "]", "[", ",", ";", ":", "."]),
                    label="bad")
    truncate = data.draw(st.booleans(), label="truncate")
    mutated = text[:k] if truncate else text[:k] + bad + text[k + 1:]
    try:
        parse_range_bounds(mutated)
    except PositionFormatError as err:
        check_position_error(err, mutated)
        assert not truncate or err.offset <= len(mutated)
    else:
        assert not truncate


@FUZZ
@given(rows_strategy.filter(bool), OUT_OF_INT64, st.data())
def test_range_out_of_int64_names_the_id(rows: list[tuple[int, ...]], big: int,
                                         data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(rows) - 1), label="row")
    j = data.draw(st.integers(0, 3), label="column")
    cells = [list(map(str, r)) for r in rows]
    cells[i][j] = str(big)
    text = "[" + ",".join(f"({a}:{b}..{c}:{d}]" for a, b, c, d in cells) + "]"
    with pytest.raises(PositionFormatError) as info:
        parse_range_bounds(text)
    check_position_error(info.value, text)
    assert text[info.value.offset:].startswith(str(big))


@FUZZ
@given(st.one_of(st.text(max_size=60), st.text(alphabet=RANGE_ALPHABET, max_size=60)))
def test_rangeset_parse_raises_only_value_errors(text: str) -> None:
    """What callers of RangeSet.parse catch (stats.parse_cursor): ValueError, mostly the
    PositionFormatError subclass."""
    try:
        RangeSet.parse(text)
    except PositionFormatError as err:
        check_position_error(err, text)
    except ValueError as err:
        assert re.search(r"-?\d+", str(err))
