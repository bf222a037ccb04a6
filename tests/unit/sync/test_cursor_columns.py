"""A poll's cursor rows against the last batch's, as columns (what lets the sync skip the
parse and the plan of an unchanged cursor): checked row by row against the plain rule that
a row is unchanged when its counterpart has equal values in every state column."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.sync.observed import CursorColumns

_LEDGERS = pa.list_(pa.struct([("ledger_id", pa.int64()), ("entries", pa.int64())]))
_STATE = ("mark_delete", "individually_deleted", "ledgers")

_keys = st.tuples(st.sampled_from(["persistent://t/n/a", "persistent://t/n/b"]),
                  st.integers(-1, 1), st.sampled_from(["s1", "s2"]))
_rows = st.fixed_dictionaries({
    "key": _keys,
    "mark_delete": st.one_of(st.none(), st.sampled_from(["5:1", "5:2"])),
    "individually_deleted": st.sampled_from(["[]", "[(5:3..5:4]]"]),
    "ledgers": st.one_of(st.none(), st.lists(st.tuples(st.integers(5, 7), st.integers(0, 2)),
                                             max_size=3)),
})


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table({
        "topic": pa.array([r["key"][0] for r in rows], pa.string()),
        "partition": pa.array([r["key"][1] for r in rows], pa.int32()),
        "subscription": pa.array([r["key"][2] for r in rows], pa.string()),
        "mark_delete": pa.array([r["mark_delete"] for r in rows], pa.string()),
        "individually_deleted": pa.array([r["individually_deleted"] for r in rows], pa.string()),
        "ledgers": pa.array([None if r["ledgers"] is None else [
            {"ledger_id": i, "entries": n} for i, n in r["ledgers"]] for r in rows], _LEDGERS),
    })


def _expected(now: list[dict[str, Any]], last: list[dict[str, Any]]) -> list[int]:
    """Per row of ``now``: its counterpart in ``last`` (the row at the same place when both
    list the same keys in order, else the first with its key) if every state value is
    equal and none is null (a missing ledger list equals only a missing one), else -1."""
    keys = [r["key"] for r in last]
    aligned = [r["key"] for r in now] == keys
    out = []
    for i, row in enumerate(now):
        j = i if aligned else (keys.index(row["key"]) if row["key"] in keys else -1)
        if j < 0 or row["mark_delete"] is None or last[j]["mark_delete"] is None:
            out.append(-1)
            continue
        out.append(j if all(row[c] == last[j][c] for c in _STATE) else -1)
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(_rows, max_size=8), st.data())
def test_matches_is_the_row_by_row_rule(last: list[dict[str, Any]], data: st.DataObject,
                                        ) -> None:
    # The next batch: mostly the same rows, some changed, some new, in any order.
    now = data.draw(st.lists(st.one_of(st.sampled_from(last), _rows) if last else _rows,
                             max_size=8))
    if data.draw(st.booleans()) and last:
        now = list(last)  # the common case: the same keys in the same order
        for i in data.draw(st.lists(st.integers(0, len(last) - 1), max_size=3)):
            now[i] = dict(now[i], ledgers=data.draw(_rows)["ledgers"])
    got = CursorColumns.of(_table(now)).matches(CursorColumns.of(_table(last)))
    assert got.tolist() == _expected(now, last)


def test_a_ledger_list_that_changes_alone_is_a_change() -> None:
    """A new ledger on a partition whose cursor does not move changes its row: the cursor
    state the step plans from includes the ledger list."""
    row = {"key": ("persistent://t/n/a", 0, "s1"), "mark_delete": "5:1",
           "individually_deleted": "[]", "ledgers": [(5, 2)]}
    last = CursorColumns.of(_table([row, dict(row, key=("persistent://t/n/a", 1, "s1"))]))
    same = CursorColumns.of(_table([row, dict(row, key=("persistent://t/n/a", 1, "s1"))]))
    grown = CursorColumns.of(_table([row, dict(row, key=("persistent://t/n/a", 1, "s1"),
                                               ledgers=[(5, 2), (6, 0)])]))
    moved = CursorColumns.of(_table([row, dict(row, key=("persistent://t/n/a", 1, "s1"),
                                               ledgers=[(5, 3)])]))
    assert same.matches(last).tolist() == [0, 1]
    assert grown.matches(last).tolist() == [0, -1]
    assert moved.matches(last).tolist() == [0, -1]
    assert np.array_equal(moved.take(np.array([1])).ids, [5])
