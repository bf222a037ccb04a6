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
        m = _POSITION_RE.fullmatch(text.strip())
        if m is None:
            raise PositionFormatError(text, 0, "ledgerId:entryId")
        return cls(int(m.group(1)), int(m.group(2)))

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
_POSITION_RE = re.compile(rf"({_NUM})\s*:\s*({_NUM})")
_SEP = r"(?:\.\.|‥|…)"
_RANGE = rf"\(\s*{_NUM}\s*:\s*{_NUM}\s*{_SEP}\s*{_NUM}\s*:\s*{_NUM}\s*\]"
_RANGE_LIST_RE = re.compile(rf"\s*\[\s*(?:{_RANGE}(?:\s*,\s*{_RANGE})*)?\s*\]\s*")
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
    numbers = [int(tok) for tok in _INT_RE.findall(text)]
    if any(n < INT64_MIN or n > INT64_MAX for n in numbers):
        bad = next(n for n in numbers if n < INT64_MIN or n > INT64_MAX)
        raise PositionFormatError(text, text.find(str(bad)), "a 64-bit id")
    arr = np.array(numbers, dtype=np.int64)
    return arr.reshape(-1, 4)


def format_range_bounds(bounds: npt.NDArray[np.int64]) -> str:
    """Write ranges exactly as the broker's default range set does: no spaces."""
    rows = bounds.tolist()
    return "[" + ",".join(f"({a}:{b}..{c}:{d}]" for a, b, c, d in rows) + "]"


def _locate_error(text: str) -> tuple[int, str]:
    """Walk the grammar by hand to find the first offending offset (slow path, errors only)."""
    i = 0
    n = len(text)

    def skip_ws(j: int) -> int:
        while j < n and text[j].isspace():
            j += 1
        return j

    def expect(j: int, pattern: str, what: str) -> int:
        m = re.compile(pattern).match(text, j)
        if m is None:
            raise _Located(j, what)
        return m.end()

    try:
        i = skip_ws(i)
        i = expect(i, r"\[", "'['")
        i = skip_ws(i)
        if i < n and text[i] == "]":
            i = skip_ws(i + 1)
            if i != n:
                raise _Located(i, "end of text")
            return i, "end of text"
        first = True
        while True:
            i = skip_ws(i)
            if not first:
                if i < n and text[i] == "]":
                    i = skip_ws(i + 1)
                    if i != n:
                        raise _Located(i, "end of text")
                    break
                i = expect(i, r",", "',' or ']'")
                i = skip_ws(i)
            first = False
            i = expect(i, r"\(", "'('")
            i = skip_ws(i)
            i = expect(i, rf"{_NUM}\s*:\s*{_NUM}", "ledgerId:entryId")
            i = skip_ws(i)
            i = expect(i, _SEP, "'..'")
            i = skip_ws(i)
            i = expect(i, rf"{_NUM}\s*:\s*{_NUM}", "ledgerId:entryId")
            i = skip_ws(i)
            i = expect(i, r"\]", "']' closing the range")
    except _Located as loc:
        return loc.offset, loc.expected
    return min(i, n), "a range list"


class _Located(Exception):
    def __init__(self, offset: int, expected: str) -> None:
        self.offset = offset
        self.expected = expected
