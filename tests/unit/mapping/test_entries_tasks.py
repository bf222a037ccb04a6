"""The pulsar-entries source's ranges and tasks: allocation, range sizes, packing into tasks."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import cursorsync.mapping.entries_tasks as entries_tasks
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.mapping.entries_tasks import (
    BEFORE_ALL,
    EntriesPartition,
    allocate,
    pack_ranges,
)
from tests.support.entries import LOCAL_NS, REPL


def test_allocate_is_fair_and_bounded() -> None:
    assert allocate({"a": 10, "b": 1, "c": None}, 9) == {"a": 4, "b": 1, "c": 4}
    assert allocate({"a": 2, "b": 2}, 100) == {"a": 2, "b": 2}
    assert allocate({"a": 5, "b": 5, "c": 5}, 2) == {"a": 1, "b": 1, "c": 0}
    assert sum(allocate({"a": None, "b": 0}, 7).values()) == 7


def test_a_range_across_ledgers_has_the_size_the_driver_counted() -> None:
    r = _range(0, "-1:-1", "7:99")
    assert r.entry_count() is None  # a restarted driver: how many is unknown
    assert dataclasses.replace(r, entries=100).entry_count() == 100
    assert _range(0, "7:9", "7:19").entry_count() == 10  # one ledger: ids are dense
    ledgers = Ledgers.of([(3, 10), (5, 0), (7, 60)])
    first_after = entries_tasks.first_entry_after
    assert first_after(ledgers, BEFORE_ALL) == Position(3, 0)
    assert first_after(ledgers, Position(3, 4)) == Position(3, 5)
    assert first_after(ledgers, Position(3, 9)) == Position(7, 0)  # past an empty ledger
    assert first_after(ledgers, Position(3, 99)) == Position(7, 0)  # past a closed ledger's end
    assert first_after(ledgers, Position(7, 59)) is None
    nth = entries_tasks.nth_entry_after
    assert nth(ledgers, BEFORE_ALL, 1) == Position(3, 0)
    assert nth(ledgers, Position(3, 4), 5) == Position(3, 9)
    assert nth(ledgers, Position(3, 4), 6) == Position(7, 0)  # across an empty ledger
    assert nth(ledgers, Position(3, 4), 65) == Position(7, 59)
    assert nth(ledgers, Position(3, 4), 66) is None


# -- ranges packed into tasks ---------------------------------------------------------


def _range(topic: int, start: str, end: str) -> Any:
    return EntriesPartition(cluster="a", topic=f"{LOCAL_NS}/t-partition-{topic}", start=start,
                            end=end, client=None,  # type: ignore[arg-type]
                            identity_fields=("payload",), identity=True, per_entry=True,
                            source_position_property=REPL, read_timeout_ms=100)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.one_of(st.none(), st.integers(1, 300)), max_size=40),
       per_task=st.integers(1, 400), ranges_per_task=st.integers(1, 8))
def test_ranges_are_packed_in_order_whole_and_within_the_bounds(
        sizes: list[int | None], per_task: int, ranges_per_task: int) -> None:
    # None: a range across ledgers the driver has no count for (restarted); odd ones span
    # ledgers with the driver's count.
    ranges = [_range(i, "1:9", "2:3") if n is None
              else dataclasses.replace(_range(i, "1:9", "2:3"), entries=n) if i % 2
              else _range(i, "1:9", f"1:{9 + n}") for i, n in enumerate(sizes)]
    tasks = pack_ranges(ranges, per_task, ranges_per_task)
    assert [r for t in tasks for r in t.ranges] == ranges  # every range once, in order
    for t in tasks:
        assert t.ranges
        if len(t.ranges) > 1:
            counts = [r.entry_count() for r in t.ranges]
            assert None not in counts and len(counts) <= ranges_per_task
            assert sum(counts) <= per_task  # type: ignore[arg-type]
    # Greedy: two neighbouring tasks could not have been one.
    for a, b in itertools.pairwise(tasks):
        counts = [r.entry_count() for r in a.ranges + b.ranges]
        assert (None in counts or sum(counts) > per_task  # type: ignore[arg-type]
                or len(counts) > ranges_per_task
                or any(c >= per_task for c in counts))  # type: ignore[operator]
