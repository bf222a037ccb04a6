"""Positions in a managed ledger, and Pulsar's text forms of them.

A position is (ledger id, entry id), ordered lexicographically. Both are Java
longs on the broker, so int64 holds them exactly. Entry id -1 is a real
position: "before the first entry of that ledger" (a fresh cursor's
markDeletePosition is ``L:-1``).

Admin stats write a range list as ``[(0:0..0:1],(1:0..1:1]]``. We accept what
other writers and the docs show as well (``, `` separators, spaces, the ``‥``
character) and always write the broker's form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cursorsync.errors import PositionFormatError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """A ledger:entry position; ordered like the broker orders them."""

    ledger: int
    entry: int

    def __post_init__(self) -> None:
        if not (INT64_MIN <= self.ledger <= INT64_MAX and INT64_MIN <= self.entry <= INT64_MAX):
            raise ValueError(f"position {self.ledger}:{self.entry} does not fit in 64-bit ids")

    @classmethod
    def parse(cls, text: str) -> Position:
        """Parse ``L:E`` (entry may be -1)."""
        m = _POSITION_RE.fullmatch(text)
        if m is None:
            raise PositionFormatError(text, *_locate_position_error(text))
        try:
            return cls(int(m.group(1)), int(m.group(2)))
        except ValueError:
            bad = next(g for g in (1, 2) if not _fits(m.group(g)))
            raise PositionFormatError(text, m.start(bad), "a 64-bit id") from None

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}"


#: Below every real position; used as the open lower end of "everything up to M".
MIN_POSITION = Position(-1, -1)


@dataclass(frozen=True, order=True, slots=True)
class MessageId:
    """A message inside an entry: what a client sees (partition and batch index)."""

    ledger: int
    entry: int
    partition: int = -1
    batch_index: int = -1

    @property
    def position(self) -> Position:
        return Position(self.ledger, self.entry)

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}:{self.partition}:{self.batch_index}"


_NUM = r"-?\d+"
_POSITION_RE = re.compile(rf"\s*({_NUM})\s*:\s*({_NUM})\s*")
_SEP = r"(?:\.\.|‥|…)"
_RANGE = rf"\(\s*{_NUM}\s*:\s*{_NUM}\s*{_SEP}\s*{_NUM}\s*:\s*{_NUM}\s*\]"
_RANGE_LIST_RE = re.compile(rf"\s*\[\s*(?:{_RANGE}(?:\s*,\s*{_RANGE})*\s*)?\]\s*")
_INT_RE = re.compile(_NUM)


def parse_range_bounds(text: str) -> npt.NDArray[np.int64]:
    """Parse an individuallyDeletedMessages string into an (n, 4) int64 array.

    Columns are lower ledger, lower entry, upper ledger, upper entry of each
    open-closed range, in the order written. Linear in the text length; this is
    on the path of every cursor poll, with up to millions of ranges.
    """
    if _RANGE_LIST_RE.fullmatch(text) is None:
        offset, expected = _locate_error(text)
        raise PositionFormatError(text, offset, expected)
    tokens = _INT_RE.findall(text)
    try:
        arr = np.fromiter(map(int, tokens), dtype=np.int64, count=len(tokens))
    except (ValueError, OverflowError):
        bad = next(m for m in _INT_RE.finditer(text) if not _fits(m.group()))
        raise PositionFormatError(text, bad.start(), "a 64-bit id") from None
    return arr.reshape(-1, 4)


def format_range_bounds(bounds: npt.NDArray[np.int64]) -> str:
    """Write ranges exactly as the broker's default range set does: no spaces."""
    rows = bounds.tolist()
    return "[" + ",".join(f"({a}:{b}..{c}:{d}]" for a, b, c, d in rows) + "]"


def _fits(token: str) -> bool:
    """Whether an integer token is a 64-bit id (``int`` refuses thousands of digits)."""
    try:
        return INT64_MIN <= int(token) <= INT64_MAX
    except ValueError:
        return False


def _skip_ws(text: str, j: int) -> int:
    while j < len(text) and text[j].isspace():
        j += 1
    return j


def _expect(text: str, j: int, pattern: str, what: str) -> int:
    m = re.compile(pattern).match(text, j)
    if m is None:
        raise _Located(j, what)
    return m.end()


def _locate_position_error(text: str) -> tuple[int, str]:
    """Walk ``L:E`` by hand to find the first offending offset (slow path, errors only)."""
    try:
        i = _expect(text, _skip_ws(text, 0), _NUM, "a ledger id")
        i = _expect(text, _skip_ws(text, i), ":", "':'")
        i = _expect(text, _skip_ws(text, i), _NUM, "an entry id")
        i = _skip_ws(text, i)
        if i != len(text):
            raise _Located(i, "end of text")
    except _Located as loc:
        return loc.offset, loc.expected
    return 0, "ledgerId:entryId"


def _locate_error(text: str) -> tuple[int, str]:
    """Walk the grammar by hand to find the first offending offset (slow path, errors only)."""
    n = len(text)
    try:
        i = _skip_ws(text, 0)
        i = _expect(text, i, r"\[", "'['")
        i = _skip_ws(text, i)
        if i < n and text[i] == "]":
            i = _skip_ws(text, i + 1)
            if i != n:
                raise _Located(i, "end of text")
            return i, "end of text"
        first = True
        while True:
            i = _skip_ws(text, i)
            if not first:
                if i < n and text[i] == "]":
                    i = _skip_ws(text, i + 1)
                    if i != n:
                        raise _Located(i, "end of text")
                    break
                i = _expect(text, i, r",", "',' or ']'")
                i = _skip_ws(text, i)
            first = False
            i = _expect(text, i, r"\(", "'('")
            i = _skip_ws(text, i)
            i = _expect(text, i, rf"{_NUM}\s*:\s*{_NUM}", "ledgerId:entryId")
            i = _skip_ws(text, i)
            i = _expect(text, i, _SEP, "'..'")
            i = _skip_ws(text, i)
            i = _expect(text, i, rf"{_NUM}\s*:\s*{_NUM}", "ledgerId:entryId")
            i = _skip_ws(text, i)
            i = _expect(text, i, r"\]", "']' closing the range")
    except _Located as loc:
        return loc.offset, loc.expected
    return min(i, n), "a range list"


class _Located(Exception):
    def __init__(self, offset: int, expected: str) -> None:
        self.offset = offset
        self.expected = expected
