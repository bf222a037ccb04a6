"""The delta-rs store's own behaviour: app transactions recorded, not enforced; racing writers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cursorsync.tables.delta_rs import DeltaRsStore
from tests.support.table_rows import TOPICS, _rows_of, make_mappings

# ------------------------------------------------------- delta-rs specifics


def test_delta_rs_records_but_does_not_enforce_app_transactions(tmp_path: Path) -> None:
    """Pin the delta-rs behaviour the store works around (see delta_rs.py)."""
    uri = str(tmp_path / "raw")
    data = pa.table({"x": pa.array([1, 2], pa.int64())})

    def write(version: int) -> None:
        write_deltalake(uri, data, mode="append", commit_properties=CommitProperties(
            app_transactions=[Transaction("app", version)]))

    write(5)
    assert DeltaTable(uri).transaction_version("app") == 5
    write(5)  # a replay: accepted, rows duplicated
    write(3)  # an older version: accepted, and the recorded version goes backwards
    dt = DeltaTable(uri)
    assert dt.to_pyarrow_table().num_rows == 6
    assert dt.transaction_version("app") == 3


def _race_on_open(monkeypatch: pytest.MonkeyPatch, a: DeltaRsStore,
                  other_write: Callable[[], bool]) -> list[bool]:
    """Make ``other_write`` commit right after ``a`` opens its snapshot, once; returns the
    list its result lands in."""
    original = a._open
    raced: list[bool] = []

    def open_then_race(table):  # type: ignore[no-untyped-def]
        snapshot = original(table)
        if not raced:
            raced.append(other_write())
        return snapshot

    monkeypatch.setattr(a, "_open", open_then_race)
    return raced


def test_delta_rs_racing_writers_of_one_batch_land_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both see batch 7 unwritten; the loser's commit conflicts and it reports False."""
    root = str(tmp_path / "tables")
    a, b = DeltaRsStore(root), DeltaRsStore(root)
    rows = make_mappings(TOPICS[:1])
    a.append("mappings", rows, app_id="m", batch_id=6)
    raced = _race_on_open(monkeypatch, a,
                          lambda: b.append("mappings", rows, app_id="m", batch_id=7))
    assert a.append("mappings", rows, app_id="m", batch_id=7) is False
    assert raced == [True]
    assert _rows_of(b, "mappings") == 2 * rows.num_rows
    assert b.last_batch("m") == 7


def test_delta_rs_racing_writers_of_different_apps_both_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "tables")
    a, b = DeltaRsStore(root), DeltaRsStore(root)
    rows = make_mappings(TOPICS[:1])
    a.append("mappings", rows, app_id="x", batch_id=0)
    raced = _race_on_open(monkeypatch, a,
                          lambda: b.append("mappings", rows, app_id="y", batch_id=0))
    assert a.append("mappings", rows, app_id="x", batch_id=1) is True
    assert raced == [True]
    assert _rows_of(b, "mappings") == 3 * rows.num_rows


# ------------------------------------------------------- handles kept open


def test_delta_rs_keeps_a_table_open_and_sees_other_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opens a local table once per thread and brings it up to date after: another
    store's commits are seen by its reads and by its idempotency check."""
    import cursorsync.tables.delta_rs as delta_rs

    root = str(tmp_path / "tables")
    a, b = DeltaRsStore(root), DeltaRsStore(root)
    rows = make_mappings(TOPICS[:1])
    a.append("mappings", rows, app_id="m", batch_id=0)
    opened: list[str] = []

    class Counting(DeltaTable):
        def __init__(self, uri: str, **kwargs: object) -> None:
            opened.append(uri)
            super().__init__(uri, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(delta_rs, "DeltaTable", Counting)
    assert _rows_of(a, "mappings") == rows.num_rows
    b.append("mappings", rows, app_id="m", batch_id=1)
    assert _rows_of(a, "mappings") == 2 * rows.num_rows
    assert a.append("mappings", rows, app_id="m", batch_id=1) is False  # b wrote it
    assert a.append("mappings", rows, app_id="m", batch_id=2) is True
    assert _rows_of(a, "mappings") == 3 * rows.num_rows
    assert a.last_batch("m", table="mappings") == 2
    assert opened.count(a.uri("mappings")) == 1, opened  # b's first open only; a's is kept


def test_delta_rs_opens_a_table_anew_once_deleted_and_made_again(tmp_path: Path) -> None:
    """A kept handle of a table deleted under it is not trusted: delta-rs would keep the old
    state (and commit on top of it)."""
    import shutil

    root = str(tmp_path / "tables")
    a, b = DeltaRsStore(root), DeltaRsStore(root)
    rows = make_mappings(TOPICS[:2])
    for batch in range(3):
        a.append("mappings", rows, app_id="m", batch_id=batch)
    assert _rows_of(a, "mappings") == 3 * rows.num_rows
    shutil.rmtree(a.uri("mappings"))
    one = make_mappings(TOPICS[:1])
    b.append("mappings", one, app_id="m", batch_id=0)
    b.append("mappings", one, app_id="m", batch_id=1)
    b.append("mappings", one, app_id="m", batch_id=2)
    b.append("mappings", one, app_id="m", batch_id=3)
    assert _rows_of(a, "mappings") == 4 * one.num_rows
    assert a.append("mappings", rows, app_id="m", batch_id=3) is False
    assert a.append("mappings", rows, app_id="m", batch_id=4) is True
    assert _rows_of(b, "mappings") == 4 * one.num_rows + rows.num_rows
