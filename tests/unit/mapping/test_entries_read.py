"""read_entries against a scripted reader: re-deliveries, columns, the Arrow layout, the
tail check, the worker's clients and heap."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

import cursorsync.mapping.entries_read as entries_read
from cursorsync.core.identity import MessageIdentity, entry_digest, message_digest
from cursorsync.errors import ConfigError
from cursorsync.mapping.entries import PulsarEntriesDataSource
from cursorsync.mapping.entries_options import (
    EVIDENCE_COLUMNS,
    PACKED_SCHEMA,
    EntriesReadError,
    schema_of,
)
from cursorsync.mapping.entries_read import read_entries
from cursorsync.mapping.entries_rows import arrow_batches, pack_batches, unpack_batches
from cursorsync.mapping.entries_tasks import EntriesPartition
from tests.support.entries import LOCAL_NS, REPL, _Id, _Msg, _ScriptedClient


def _scripted(script: list[_Msg | None], end: str, **kw: Any) -> Any:
    kw.setdefault("read_timeout_ms", 100)
    return EntriesPartition(cluster="a", topic=f"{LOCAL_NS}/t", start="-1:-1", end=end,
                            client=_ScriptedClient(script),  # type: ignore[arg-type]
                            identity_fields=("payload",), identity=True, per_entry=False,
                            source_position_property=REPL, **kw)


def test_read_entries_yields_each_entry_once_whatever_the_broker_redelivers() -> None:
    b = [_Msg(_Id(1, 2, i, 3)) for i in range(3)]
    script = [
        _Msg(_Id(1, 0)), _Msg(_Id(1, 0)),            # an unbatched entry twice in a row
        _Msg(_Id(1, 1)),
        _Msg(_Id(1, 0)),                             # an earlier entry again, later
        b[0], b[1], b[0], b[2],                      # a batch index again inside its entry
        b[0], b[1], b[2],                            # the whole batch again
        _Msg(_Id(1, 3)), _Msg(_Id(1, 4)),            # past the end: not read
    ]
    rows = list(read_entries(_scripted(script, "1:3")))
    assert [(r[3], r[4], r[5], r[6]) for r in rows] == [
        (1, 0, -1, 1), (1, 1, -1, 1), (1, 2, 0, 3), (1, 2, 1, 3), (1, 2, 2, 3), (1, 3, -1, 1)]
    digests = [message_digest(MessageIdentity(producer_name="p", publish_time=1,
                                              payload=f"2/{i}".encode()), ("payload",))
               for i in range(3)]
    assert {r[15] for r in rows if r[4] == 2} == {entry_digest(digests)}


def test_read_entries_fails_on_an_entry_first_seen_out_of_order() -> None:
    """Dropping it like a re-delivery would leave a hole, which the builder acks as a marker."""
    script = [_Msg(_Id(1, 0)), _Msg(_Id(1, 2)), _Msg(_Id(1, 1)), _Msg(_Id(1, 3))]
    with pytest.raises(EntriesReadError, match="entry 1:1 arrived after 1:2, out of order"):
        list(read_entries(_scripted(script, "1:3")))


def test_read_columns_select_the_schema_and_the_arrow_batches() -> None:
    script = [_Msg(_Id(1, e), {REPL: f"9:{e}"} if e % 2 else {}) for e in range(5)]
    part = _scripted(script, "1:4", columns=EVIDENCE_COLUMNS)
    batches = list(arrow_batches(read_entries(part), part.columns, size=2))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert batches[0].schema.names == list(EVIDENCE_COLUMNS)
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["source_position"] for r in rows] == [None, "9:1", None, "9:3", None]
    # Stamped entries carry no digest: identity evidence is for the others only.
    assert [r["entry_identity"] is None for r in rows] == [False, True, False, True, False]
    # Producer and publish time come with the digest (identity alignment orders by them).
    assert [r["producer_name"] is None for r in rows] == [False, True, False, True, False]
    assert [r["publish_time"] is None for r in rows] == [False, True, False, True, False]
    ds = PulsarEntriesDataSource({"columns": "evidence"})
    assert ds.schema() == schema_of(EVIDENCE_COLUMNS)
    assert PulsarEntriesDataSource({}).schema().fieldNames()[-1] == "first_chunk"
    with pytest.raises(ConfigError, match="columns: nope is not a column"):
        PulsarEntriesDataSource({"columns": "ledger,nope"}).schema()


def test_layout_arrow_packs_record_batches_into_rows_and_unpacks_to_the_same_rows() -> None:
    script = [_Msg(_Id(1, e), {REPL: f"9:{e}"} if e % 2 else {}) for e in range(5)]
    plain = pa.Table.from_batches(list(arrow_batches(
        read_entries(_scripted(list(script), "1:4", columns=EVIDENCE_COLUMNS)),
        EVIDENCE_COLUMNS, size=2)))
    packed = pa.Table.from_batches(list(pack_batches(arrow_batches(
        read_entries(_scripted(list(script), "1:4", columns=EVIDENCE_COLUMNS)),
        EVIDENCE_COLUMNS, size=2), "a")))
    # One Spark row per record batch: what crosses the JVM is three rows, not five.
    assert packed.num_rows == 3
    assert packed.column("rows").to_pylist() == [2, 2, 1]
    assert set(packed.column("cluster").to_pylist()) == {"a"}
    assert unpack_batches(packed, EVIDENCE_COLUMNS).equals(plain)
    assert unpack_batches(packed.slice(0, 0), EVIDENCE_COLUMNS).num_rows == 0
    assert PulsarEntriesDataSource({"layout": "arrow"}).schema() == PACKED_SCHEMA
    with pytest.raises(ConfigError, match="option layout: 'packed' is not valid"):
        PulsarEntriesDataSource({"layout": "packed"}).schema()
    # A driver expecting other columns (another cursorsync version) says so.
    with pytest.raises(EntriesReadError, match="executors on another cursorsync version"):
        unpack_batches(packed, ("cluster", "ledger"))


def test_identity_scope_batched_digests_batches_only_and_the_source_side_drops_the_rest(
) -> None:
    def script() -> list[_Msg]:
        return [_Msg(_Id(1, 0), {REPL: "9:0"}), _Msg(_Id(1, 1)),
                _Msg(_Id(1, 2, 0, 2)), _Msg(_Id(1, 2, 1, 2)), _Msg(_Id(1, 3), {REPL: "9:3"})]

    target = list(read_entries(_scripted(script(), "1:3", identity_batched_only=True)))
    # Target side: every entry has a row (holes and foreign runs need them all); only the
    # batch has a digest, and the unstamped unbatched 1:1 none (it is foreign then).
    assert [(r[4], r[15] is not None) for r in target] == [
        (0, False), (1, False), (2, True), (2, True), (3, False)]
    source = list(read_entries(_scripted(script(), "1:3", identity_batched_only=True,
                                         identity_rows_only=True)))
    # Source side: rows only where identity evidence can use them, stamped or not.
    assert [(r[4], r[5]) for r in source] == [(2, 0), (2, 1)]
    assert {r[15] for r in source} == {target[2][15]}
    every = list(read_entries(_scripted(script(), "1:3", identity_rows_only=True)))
    assert [r[4] for r in every] == [0, 1, 2, 2, 3] and all(r[15] for r in every)


def test_worker_keeps_a_bounded_number_of_clients_least_recently_used_out() -> None:
    class Settings:
        def __init__(self, n: int) -> None:
            self.n, self.closed = n, False

        def connect(self) -> Settings:
            return self

        def close(self) -> None:
            self.closed = True

    saved = dict(entries_read._CLIENTS)
    entries_read._CLIENTS.clear()
    try:
        made = [Settings(i) for i in range(entries_read.CLIENTS_KEPT + 2)]
        for s in made[:entries_read.CLIENTS_KEPT]:
            assert entries_read._client(s) is s  # type: ignore[arg-type]
        entries_read._client(made[0])  # type: ignore[arg-type] - used again: now the newest
        entries_read._client(made[-2])  # type: ignore[arg-type]
        entries_read._client(made[-1])  # type: ignore[arg-type]
        assert [s.closed for s in made[:3]] == [False, True, True]
        assert len(entries_read._CLIENTS) == entries_read.CLIENTS_KEPT
    finally:
        entries_read._CLIENTS.clear()
        entries_read._CLIENTS.update(saved)


def test_the_tail_check_comes_after_each_silence_of_tail_check_ms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader silent short of its end asks the admin API what is left, tailCheckMs into
    each silence: a slow start, with checks of its own, does not delay the check at the
    end. Polls are counted, not timed: a scripted poll that times out returns at once."""
    checks: list[tuple[int, int]] = []

    def nothing_to_deliver(_part: Any, after: tuple[int, int], _end: Any) -> bool:
        checks.append(after)
        return after == (1, 1)  # what is left after 1:1 is markers only

    monkeypatch.setattr(entries_read, "_nothing_to_deliver", nothing_to_deliver)
    part = _scripted([None] * 5 + [_Msg(_Id(1, 0)), _Msg(_Id(1, 1))], "1:3",
                     read_timeout_ms=10_000, tail_check_ms=200)
    client = part.client
    assert [(r[3], r[4]) for r in read_entries(part)] == [(1, 0), (1, 1)]
    assert checks == [(-1, -1), (-1, -1), (1, 1)]
    assert client.timeouts == 5 + 2  # the last check two polls (200 ms) after 1:1


def test_the_tail_check_waits_while_a_batch_is_incomplete(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a batch of known size the rest of it is due: no lookup, the read times out."""
    monkeypatch.setattr(entries_read, "_nothing_to_deliver", lambda *_: pytest.fail("looked up"))
    part = _scripted([_Msg(_Id(1, 0, 0, 3)), _Msg(_Id(1, 0, 1, 3))], "1:1",
                     read_timeout_ms=500, tail_check_ms=100)
    with pytest.raises(EntriesReadError, match="partial range"):
        list(read_entries(part))


def test_a_worker_freezes_its_heap_at_its_first_two_tasks_only() -> None:
    """The first task loads modules of its own (pyspark imports pandas while it serializes
    the first batch), so the heap is frozen again at the second; never after, or each
    task's garbage cycles would be kept for ever. In a fresh process: the freeze is global."""
    code = (
        "import gc\n"
        "from cursorsync.mapping.entries_read import freeze_worker_heap\n"
        "counts, kept = [], []\n"
        "for i in range(4):\n"
        "    kept.append([[j] for j in range(1000)])  # what a task loads and keeps\n"
        "    freeze_worker_heap()\n"
        "    counts.append(gc.get_freeze_count())\n"
        "print(counts[0] > 0, counts[1] > counts[0] + 900, counts[2] == counts[1] == counts[3])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "True"]
