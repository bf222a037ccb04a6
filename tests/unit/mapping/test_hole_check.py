"""Skipped target ids checked against the admin API: only markers are ever claimed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import pairwise
from types import SimpleNamespace
from urllib.parse import urlencode, urlsplit

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cursorsync.mapping.builder as builder_module
from cursorsync.core.identity import REPL_SOURCE_POSITION_PROPERTY
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.builder import BuilderSettings, MappingBuilder
from cursorsync.mapping.hole_check import (
    AdminHoleCheck,
    RunFindings,
    read_run,
    stamped_chunk,
)
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.cursor_digests import CURSORS_PATH
from cursorsync.pulsar.raw_entry import RawEntry
from cursorsync.pulsar.topics import TopicName
from tests.support.admin_stub import Reply, StubAdmin, plugin_listing, stats_doc

MARKER = RawEntry(marker_type=10)
CHUNK = RawEntry(chunk_id=0, num_chunks=2)
MESSAGE = RawEntry()


def stamped(source: str, cluster: str = "A", chunk_id: int = 0) -> RawEntry:
    """A chunk replicated from ``cluster`` whose stamp names ``source``."""
    return RawEntry(chunk_id=chunk_id, num_chunks=3, replicated_from=cluster,
                    properties={REPL_SOURCE_POSITION_PROPERTY: source, "key": "big"})


def test_a_run_is_read_up_to_its_first_id_neither_a_marker_nor_a_mapped_chunk() -> None:
    kinds = [MARKER, stamped("3:20"), MARKER, MARKER, stamped("3:22"), CHUNK, MARKER]
    asked: list[int] = []

    def kind(i: int) -> RawEntry | None:
        asked.append(i)
        return kinds[i]

    run = read_run(kind, len(kinds), stamped_chunk("A"))
    assert run == RunFindings([(0, 1), (2, 2)], [(1, Position(3, 20)), (4, Position(3, 22))],
                              5, CHUNK)
    assert asked == [0, 1, 2, 3, 4, 5]  # the marker after the unstamped chunk is never asked
    # Without stamps trusted, the first chunk cuts the run short, as any other id does.
    assert read_run(lambda i: kinds[i], 7, lambda raw: None) == RunFindings(
        [(0, 1)], [], 1, kinds[1])
    assert read_run(lambda i: None, 3, stamped_chunk("A")) == RunFindings([], [], 0, None)
    assert read_run(lambda i: MARKER, 2, stamped_chunk("A")) == RunFindings([(0, 2)], [], 2,
                                                                            None)
    assert read_run(lambda i: MARKER, 0, stamped_chunk("A")) == RunFindings([], [], 0, None)


def test_only_a_chunk_replicated_from_the_source_maps_by_its_stamp() -> None:
    source_of = stamped_chunk("A")
    assert source_of(stamped("3:20")) == Position(3, 20)
    assert source_of(stamped("3:20", cluster="C")) is None  # a third cluster's position
    assert source_of(RawEntry(chunk_id=1, num_chunks=3, replicated_from="A")) is None
    assert source_of(stamped("3:-1")) is None and source_of(stamped("3;20")) is None
    # A message that is not a chunk is never mapped here, stamp or not.
    assert source_of(RawEntry(replicated_from="A",
                              properties={REPL_SOURCE_POSITION_PROPERTY: "3:20"})) is None
    assert source_of(MARKER) is None


@pytest.fixture
def stub() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


def test_admin_hole_check_over_http(stub: StubAdmin) -> None:
    """A partition's runs are checked on ``<topic>-partition-i``; markers (10, 12) kept."""
    path = "/admin/v2/persistent/acme/orders/events-partition-1/ledger/7/entry/{}"
    stub.set(path.format(1), Reply(raw=b"", headers={"X-Pulsar-marker-type": "10"}))
    stub.set(path.format(2), Reply(raw=b"", headers={"X-Pulsar-marker-type": "12"}))
    stub.set(path.format(3), Reply(raw=b"chunk", headers={"X-Pulsar-chunk-id": "0",
                                                           "X-Pulsar-num-chunks-from-msg": "2"}))
    stub.set(path.format(4), Reply(raw=b"", headers={"X-Pulsar-marker-type": "10"}))
    stub.set(path.format(9), Reply(raw=b"", headers={"X-Pulsar-marker-type": "13"}))
    key = PartitionKey("persistent://acme/orders/events", 1)
    other = PartitionKey("persistent://acme/orders/events", 0)  # 404: nothing stored there
    with AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as admin:
        check = AdminHoleCheck(admin, max_workers=4)
        got = check({key: Runs.of((7, 1, 4), (7, 9, 1)), other: Runs.of((7, 1, 1))})
    assert {k: r.rows.tolist() for k, r in got.items()} == {key: [[7, 1, 2], [7, 9, 1]]}
    asked = sorted(p for p, _ in stub.requests)
    p0 = "/admin/v2/persistent/acme/orders/events-partition-0/ledger/7/entry/1"
    assert asked == sorted([path.format(i) for i in (1, 2, 3, 9)] + [p0])
    assert (check.stats.requests, check.stats.markers, check.stats.not_markers) == (5, 3, 2)


class FakeAdmin:
    """raw_entry from a table of kinds; unknown ids are absent. The topic's ledgers are
    those the table holds ids of."""

    def __init__(self, kinds: dict[tuple[int, int], RawEntry]) -> None:
        self.kinds = kinds
        self.stats_read = 0

    def raw_entry(self, topic: TopicName, ledger: int, entry: int, *,
                  past_end_ok: bool = False) -> RawEntry | None:
        return self.kinds.get((ledger, entry))

    def internal_stats(self, topic: str) -> SimpleNamespace:
        self.stats_read += 1
        ids = sorted({lg for lg, _ in self.kinds})
        return SimpleNamespace(ledgers=SimpleNamespace(ids=np.array(ids, np.int64)))


KEY = PartitionKey("persistent://public/default/t", -1)


def target_rows(ids: list[int], ledgers: list[int] | None = None,
                first_chunks: list[str | None] | None = None) -> pa.Table:
    n = len(ids)
    chunks = {} if first_chunks is None else {"first_chunk": pa.array(first_chunks, pa.string())}
    return pa.table({**chunks,
        "cluster": ["B"] * n, "topic": [KEY.topic] * n,
        "partition": pa.array([-1] * n, pa.int32()),
        "ledger": pa.array(ledgers or [5] * n, pa.int64()), "entry": pa.array(ids, pa.int64()),
        "batch_index": pa.array([-1] * n, pa.int32()),
        "source_position": pa.array([f"1:{i}" for i in ids], pa.string()),
        "entry_identity": pa.array([None] * n, pa.binary()),
    })


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(st.sampled_from(["message", "marker", "chunk"]), min_size=1, max_size=60),
       cuts=st.lists(st.integers(0, 60), max_size=6))
def test_verified_claims_exactly_the_leading_markers_of_each_hole(
        kinds: list[str], cuts: list[int]) -> None:
    """Per-id oracle: an id is claimed iff it is a marker, lies between two ids the reader
    returned (messages), and every skipped id before it in its hole is a marker, whatever
    the batch boundaries. No chunk is ever claimed."""
    table = {(5, i): {"message": MESSAGE, "marker": MARKER, "chunk": CHUNK}[k]
             for i, k in enumerate(kinds)}
    returned = [i for i, k in enumerate(kinds) if k == "message"]
    check = AdminHoleCheck(FakeAdmin(table), max_workers=3)  # type: ignore[arg-type]
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    bounds = sorted({min(c, len(returned)) for c in cuts} | {0, len(returned)})
    for lo, hi in pairwise(bounds):
        b.process(target_rows(returned[lo:hi]))
    known = b.known.get(KEY)
    claimed = set() if known is None else {
        e for _, first, n in known.skippable.rows.tolist() for e in range(first, first + n)}
    expected = set()
    for prev, nxt in pairwise(returned):
        for i in range(prev + 1, nxt):
            if kinds[i] != "marker":
                break
            expected.add(i)
    assert claimed == expected
    assert all(kinds[i] == "marker" for i in claimed)


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(st.sampled_from(["message", "marker", "chunk", "stamped", "third"]),
                      min_size=1, max_size=60),
       cuts=st.lists(st.integers(0, 60), max_size=6))
def test_stamped_chunks_map_to_their_source_chunks_and_the_markers_after_them_are_claimed(
        kinds: list[str], cuts: list[int]) -> None:
    """Per-id oracle, stamps trusted: in each hole between two returned ids, the ids read
    before the first that is neither a marker nor a chunk replicated from the source are
    decided: its markers claimed, its chunks mapped to exactly the source entries their
    stamps name (3:100+i for id i). A chunk without a stamp, or stamped by a third cluster,
    maps to nothing and nothing after it in its hole is claimed or mapped."""
    table = {(5, i): {"message": MESSAGE, "marker": MARKER, "chunk": CHUNK,
                      "stamped": stamped(f"3:{100 + i}"),
                      "third": stamped(f"3:{100 + i}", cluster="C")}[k]
             for i, k in enumerate(kinds)}
    returned = [i for i, k in enumerate(kinds) if k == "message"]
    check = AdminHoleCheck(FakeAdmin(table), max_workers=3,  # type: ignore[arg-type]
                           source_cluster="A")
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    bounds = sorted({min(c, len(returned)) for c in cuts} | {0, len(returned)})
    for lo, hi in pairwise(bounds):
        b.process(target_rows(returned[lo:hi]))
    known = b.known.get(KEY)
    claimed = set() if known is None else {
        e for _, first, n in known.skippable.rows.tolist() for e in range(first, first + n)}
    pairs = set() if known is None else {
        (sl, se + k, tl, te + k) for sl, se, tl, te, n in known.segments.rows.tolist()
        for k in range(n)}
    expected_claimed, expected_pairs = set(), {(1, i, 5, i) for i in returned}
    for prev, nxt in pairwise(returned):
        for i in range(prev + 1, nxt):
            if kinds[i] == "marker":
                expected_claimed.add(i)
            elif kinds[i] == "stamped":
                expected_pairs.add((3, 100 + i, 5, i))
            else:
                break
    assert claimed == expected_claimed
    assert pairs == expected_pairs
    assert check.stats.chunks == sum(1 for p in expected_pairs if p[0] == 3)


def test_chunks_are_not_mapped_where_stamps_are_not_evidence() -> None:
    """Identity evidence alone: a stamped chunk's pair is dropped by the builder. The marker
    after it is claimed, and acked only once the chunk before it is, which nothing maps."""
    table = {(5, 0): MESSAGE, (5, 1): stamped("3:101"), (5, 2): MARKER, (5, 3): MESSAGE}
    check = AdminHoleCheck(FakeAdmin(table), source_cluster="A")  # type: ignore[arg-type]
    b = MappingBuilder(BuilderSettings("A", "B", ("identity",)), hole_check=check)
    b.process(target_rows([0, 3]))
    known = b.known.get(KEY)
    assert known is not None and not len(known.segments.rows)
    assert known.skippable.rows.tolist() == [[5, 2, 1]]


@pytest.mark.parametrize("first_ledger", [5, 4])
def test_a_chunked_message_first_in_the_stream_has_its_chunks_read_from_its_first(
        first_ledger: int) -> None:
    """The reader's first returned entry is a chunked message's last chunk: the ids from its
    first chunk on were read by the reader (it assembled the message from there), so they
    are checked too, in the ledger's remainder where the first chunk lies in an earlier
    ledger. Nothing before the first chunk is a candidate."""
    if first_ledger == 5:
        table = {(5, 0): MARKER, (5, 1): stamped("3:11", chunk_id=0), (5, 2): MARKER,
                 (5, 3): stamped("3:12", chunk_id=1), (5, 5): MESSAGE}
        first, expected_chunks = "5:1", {(3, 11, 5, 1), (3, 12, 5, 3)}
        expected_markers = {(5, 2)}
    else:  # chunk 0 closes ledger 4; ledger 5 holds chunk 1, a marker, then the last chunk
        table = {(4, 7): stamped("3:11", chunk_id=0), (4, 8): MARKER,
                 (5, 0): stamped("3:12", chunk_id=1), (5, 1): MARKER, (5, 5): MESSAGE}
        first, expected_chunks = "4:7", {(3, 11, 4, 7), (3, 12, 5, 0)}
        expected_markers = {(4, 8), (5, 1)}
    table[(5, 4)] = stamped("3:13", chunk_id=2)  # the last chunk: the row the reader returns
    check = AdminHoleCheck(FakeAdmin(table), source_cluster="A")  # type: ignore[arg-type]
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    rows = target_rows([4, 5], [5, 5], [first, None])
    outcome = b.process(rows.set_column(rows.schema.get_field_index("source_position"),
                                        "source_position", pa.array(["3:13", "3:14"])))
    assert (outcome.skipped_claimed, outcome.skipped_mapped) == (len(expected_markers), 2)
    known = b.known.get(KEY)
    assert known is not None
    pairs = {(sl, se + k, tl, te + k) for sl, se, tl, te, n in known.segments.rows.tolist()
             for k in range(n)}
    assert pairs == expected_chunks | {(3, 13, 5, 4), (3, 14, 5, 5)}
    claimed = {(lg, e) for lg, first_id, n in known.skippable.rows.tolist()
               for e in range(first_id, first_id + n)}
    assert claimed == expected_markers
    assert (5, 0) not in claimed or first_ledger == 4


@settings(max_examples=200, deadline=None)
@given(ledgers=st.lists(st.tuples(st.lists(st.sampled_from(["message", "marker", "chunk"]),
                                           min_size=1, max_size=40),
                                  st.integers(0, 80)).map(lambda t: t[0] + ["marker"] * t[1]),
                        min_size=1, max_size=3),
       cuts=st.lists(st.integers(0, 240), max_size=6),
       budget=st.sampled_from([4, 40, 4096]))
def test_markers_at_a_ledger_s_end_are_claimed_once_the_reader_moves_on(
        ledgers: list[list[str]], cuts: list[int], budget: int) -> None:
    """Per-id oracle across ledgers (5, 6, 8; 7 is another topic's): besides the ids
    between two returned ones, the leading markers after a ledger's last returned entry, up
    to the ledger's end (up to 80 markers close some ledgers), are claimed once the reader
    returns one from a later ledger, however many there are (probes go on over batches),
    whatever the batch boundaries and the check budget. So are the leading markers of a
    ledger of the topic the reader returned nothing from, lying between two it did; one
    before the first or after the last is never claimed; no chunk ever is."""
    default, builder_module.HOLE_CHECKS_PER_BATCH = builder_module.HOLE_CHECKS_PER_BATCH, budget
    try:
        claimed, table = _claimed_across_ledgers(ledgers, cuts)
    finally:
        builder_module.HOLE_CHECKS_PER_BATCH = default
    ids = [5, 6, 8][:len(ledgers)]
    returned = [(lid, i) for lid, kinds in zip(ids, ledgers, strict=True)
                for i, k in enumerate(kinds) if k == "message"]
    size = dict(zip(ids, map(len, ledgers), strict=True))

    def leading(lg: int, lo: int, hi: int) -> set[tuple[int, int]]:
        out = set()
        for i in range(lo, hi):
            if table[(lg, i)] is not MARKER:
                break
            out.add((lg, i))
        return out

    expected: set[tuple[int, int]] = set()
    for (pl, pe), (nl, ne) in pairwise(returned):
        if pl == nl:
            expected |= leading(pl, pe + 1, ne)
        else:
            expected |= leading(pl, pe + 1, size[pl]) | leading(nl, 0, ne)
            for between in (lg for lg in ids if pl < lg < nl):
                expected |= leading(between, 0, size[between])
    assert claimed == expected
    assert all(table[p] is MARKER for p in claimed)


def _claimed_across_ledgers(ledgers: list[list[str]], cuts: list[int],
                            ) -> tuple[set[tuple[int, int]], dict[tuple[int, int], RawEntry]]:
    """The ids the builder claims with a hole check of ``ledgers`` (kinds per id of ledgers
    5, 6, 8), the reader's entries cut into batches at ``cuts``; and the kinds."""
    ids = [5, 6, 8][:len(ledgers)]
    kind = {"message": MESSAGE, "marker": MARKER, "chunk": CHUNK}
    table = {(lid, i): kind[k] for lid, kinds in zip(ids, ledgers, strict=True)
             for i, k in enumerate(kinds)}
    returned = [(lid, i) for lid, kinds in zip(ids, ledgers, strict=True)
                for i, k in enumerate(kinds) if k == "message"]
    check = AdminHoleCheck(FakeAdmin(table), max_workers=3)  # type: ignore[arg-type]
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    bounds = sorted({min(c, len(returned)) for c in cuts} | {0, len(returned)})
    for lo, hi in pairwise(bounds):
        part = returned[lo:hi]
        b.process(target_rows([e for _, e in part], [lg for lg, _ in part]))
    for _ in range(40):  # the batches the sink asks for while ids wait
        if not b.process(target_rows([])).skipped_waiting:
            break
    known = b.known.get(KEY)
    claimed = set() if known is None else {
        (lg, e) for lg, first, n in known.skippable.rows.tolist()
        for e in range(first, first + n)}
    return claimed, table


def test_a_batch_reads_the_ledger_lists_it_needs_at_once_and_each_once() -> None:
    """Partitions that move past ledgers of other topics in one batch have their ledger
    lists read together on the check's threads before the batch's partitions are worked
    through, once each; a later batch that stays in those ledgers reads none."""
    table = {(lg, i): MESSAGE for lg in (5, 8) for i in range(3)}
    threads: list[str] = []

    class Recording(FakeAdmin):
        def internal_stats(self, topic: str) -> SimpleNamespace:
            threads.append(threading.current_thread().name)
            return super().internal_stats(topic)

    admin = Recording(table)
    check = AdminHoleCheck(admin, max_workers=4)  # type: ignore[arg-type]
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    keys = [PartitionKey("persistent://public/default/t", p) for p in range(20)]

    def rows(ledgers: list[int], ids: list[int]) -> pa.Table:
        parts = [target_rows(ids, ledgers) for _ in keys]
        return pa.concat_tables([t.set_column(t.schema.get_field_index("partition"),
                                              "partition", pa.array([k.partition] * len(ids),
                                                                    pa.int32()))
                                 for t, k in zip(parts, keys, strict=True)])

    b.process(rows([5, 5], [0, 1]))
    assert admin.stats_read == 0
    b.process(rows([5, 8, 8], [2, 0, 1]))
    assert admin.stats_read == len(keys)
    assert all(name.startswith("ledger-lists") for name in threads)
    b.process(rows([8], [2]))
    assert admin.stats_read == len(keys)


def test_an_unreachable_admin_fails_the_check_naming_the_entry() -> None:
    """Never a claim by guess: the mapping batch fails and is done again after a restart."""
    from cursorsync.errors import AdminError

    key = PartitionKey("persistent://acme/orders/events", -1)
    dead = AdminSettings.from_urls("http://127.0.0.1:9", attempts=2, backoff_initial_s=0.01)
    with AdminClient(dead) as admin, pytest.raises(AdminError, match=r"entry 7:1 of .*events"):
        AdminHoleCheck(admin)({key: Runs.of((7, 1, 1))})


def _body(message: object) -> bytes:
    data: bytes = message.SerializeToString()  # type: ignore[attr-defined]
    return data


def test_update_markers_the_check_reads_are_kept_for_the_builtin_updates_table(
        stub: StubAdmin) -> None:
    """An UPDATE marker among the skipped ids names where Pulsar's own replicated
    subscription moves the subscription on this (the target) cluster; a malformed one is
    counted and skipped."""
    from cursorsync._proto import pulsar_markers_pb2 as pm
    from cursorsync.core.records import BuiltinUpdate

    def update(sub: str, ledger: int, entry: int) -> bytes:
        return _body(pm.ReplicatedSubscriptionsUpdate(subscription_name=sub, clusters=[
            pm.ClusterMessageId(cluster="b", message_id=pm.MarkersMessageIdData(
                ledger_id=ledger, entry_id=entry))]))

    path = "/admin/v2/persistent/acme/orders/events/ledger/7/entry/{}"
    stub.set(path.format(1), Reply(raw=update("rs", 7, 0), headers={"X-Pulsar-marker-type": "13"}))
    stub.set(path.format(2), Reply(raw=b"\x0a\x05rs", headers={"X-Pulsar-marker-type": "13"}))
    stub.set(path.format(3), Reply(raw=update("other", 6, 9),
                                   headers={"X-Pulsar-marker-type": "13"}))
    key = PartitionKey("persistent://acme/orders/events", -1)
    with AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as admin:
        check = AdminHoleCheck(admin, target_cluster="b")
        got = check({key: Runs.of((7, 1, 3))})
        assert got[key].rows.tolist() == [[7, 1, 3]]
        assert sorted(check.drain_updates(), key=lambda u: u.marker) == [
            BuiltinUpdate(key, "rs", Position(7, 0), Position(7, 1)),
            BuiltinUpdate(key, "other", Position(6, 9), Position(7, 3))]
        assert check.drain_updates() == [] and check.stats.malformed == 1


def test_anchor_read_takes_snapshots_naming_the_target_at_holes_and_past_tails(
        stub: StubAdmin) -> None:
    """Holes: every id of the run is looked at (a chunk does not hide the snapshot after it).
    Tails: ids past the last one until an id that is no marker or past the end (the broker's
    500); the last marker there is reported. Snapshots naming another cluster make no anchor."""
    from cursorsync._proto import pulsar_markers_pb2 as pm
    from cursorsync.core.anchors import Anchors
    from cursorsync.mapping.anchor_read import AdminAnchorRead

    def snapshot(local: tuple[int, int], cluster: str, at: tuple[int, int]) -> bytes:
        def mid(p: tuple[int, int]) -> pm.MarkersMessageIdData:
            return pm.MarkersMessageIdData(ledger_id=p[0], entry_id=p[1])
        return _body(pm.ReplicatedSubscriptionsSnapshot(
            snapshot_id="s", local_message_id=mid(local),
            clusters=[pm.ClusterMessageId(cluster=cluster, message_id=mid(at))]))

    path = "/admin/v2/persistent/acme/orders/events/ledger/3/entry/{}"
    marker = {"X-Pulsar-marker-type": "12"}
    stub.set(path.format(1), Reply(raw=b"chunk", headers={"X-Pulsar-chunk-id": "0",
                                                           "X-Pulsar-num-chunks-from-msg": "2"}))
    stub.set(path.format(2), Reply(raw=snapshot((3, 0), "b", (9, 4)), headers=marker))
    stub.set(path.format(6), Reply(raw=snapshot((3, 5), "c", (1, 1)), headers=marker))
    stub.set(path.format(7), Reply(raw=snapshot((3, 5), "b", (9, 8)), headers=marker))
    stub.set(path.format(8), Reply(500, {"reason": "LastConfirmedEntry is 3:7"}))
    key = PartitionKey("persistent://acme/orders/events", -1)
    with AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as admin:
        read = AdminAnchorRead(admin, "b")
        found = read({key: Runs.of((3, 1, 2))}, {key: Position(3, 5)})
    assert found.anchors == {key: Anchors.of((Position(3, 0), Position(9, 4)),
                                             (Position(3, 5), Position(9, 8)))}
    assert found.tails == {key: Position(3, 7)}
    assert (read.stats.requests, read.stats.markers, read.stats.anchors) == (5, 3, 2)


def test_a_source_copy_of_a_target_chunked_message_maps_chunk_by_chunk_to_its_original(
        ) -> None:
    """A failback job's case: the source (A) holds copies, stamped by the replicator with
    the target's positions, of a chunked message first published on the target (B). The
    source reader returns its last chunk, whose stamp names the original's last chunk;
    the chunks before it in its span are read on the source's admin API and map to the
    originals their stamps name. A chunk of the source's own (no stamp, or a third
    cluster's) in the span maps to nothing, nor does anything after it in the span."""
    on_source = {(7, 1): stamped("9:40", cluster="B", chunk_id=0), (7, 2): MARKER,
                 (7, 3): stamped("9:41", cluster="B", chunk_id=1)}
    check = AdminHoleCheck(FakeAdmin(on_source),  # type: ignore[arg-type]
                           source_cluster="B")
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property", "identity")),
                       hole_check=AdminHoleCheck(FakeAdmin({})),  # type: ignore[arg-type]
                       source_chunks=check)
    rows = pa.table({
        "cluster": ["A", "A"], "topic": [KEY.topic] * 2,
        "partition": pa.array([-1, -1], pa.int32()),
        "ledger": pa.array([7, 7], pa.int64()), "entry": pa.array([0, 4], pa.int64()),
        "batch_index": pa.array([-1, -1], pa.int32()),
        "source_position": pa.array([None, "9:42"], pa.string()),
        "entry_identity": pa.array([b"x" * 16, None], pa.binary()),
        "first_chunk": pa.array([None, "7:1"], pa.string()),
    })
    b.process(rows)
    known = b.known.get(KEY)
    assert known is not None
    pairs = {(sl, se + k, tl, te + k) for sl, se, tl, te, n in known.segments.rows.tolist()
             for k in range(n)}
    assert pairs == {(7, 1, 9, 40), (7, 3, 9, 41), (7, 4, 9, 42)}
    assert check.stats.chunks == 2 and check.stats.markers == 1
    # Without stamps as evidence, nothing of it is mapped.
    plain = MappingBuilder(BuilderSettings("A", "B", ("identity",)), source_chunks=check)
    plain.process(rows)
    found = plain.known.get(KEY)
    assert found is None or not len(found.segments.rows)


def test_with_the_plugin_ledger_lists_come_from_it_and_the_rest_one_by_one(
        stub: StubAdmin) -> None:
    """``spark.cursor_digests``: partitions 0 and 1 are listed by the target broker's plugin
    (its stats carry the ledgers), partition 2 is not (being moved) and is read with its
    own internalStats: one plugin request and one internalStats, each counted; the lists
    name the same ledgers either way, and a later batch needing no new ledger asks none."""
    ns = "acme/orders"
    keys = [PartitionKey(f"persistent://{ns}/t", p) for p in range(3)]
    ledgers = [(1, 5), (3, 4), (5, 0)]
    broker = urlsplit(stub.url).netloc

    doc = stats_doc("5:0", ledgers, {"svc": ("1:4", "[]")})
    query = urlencode([("namespace", ns), ("stats", "true")])
    stub.set(f"{CURSORS_PATH}?{query}", Reply(body=plugin_listing(
        broker, ns, {k.concrete_topic(): doc for k in keys[:2]})))
    stub.set(TopicName.parse(keys[2].concrete_topic()).admin_path("internalStats"),
             Reply(body=doc))
    with AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as admin:
        check = AdminHoleCheck(admin, plugin=True)
        check.learn_ledgers(dict.fromkeys(keys, 5))
        assert [check.ledgers_between(k, 1, 5) for k in keys] == [[3], [3], [3]]
        check.learn_ledgers(dict.fromkeys(keys, 5))
        assert check.requests_by_kind() == {"raw-entry": 0, "ledger-list": 1,
                                            "plugin-ledger-list": 1}
        assert sorted(p.split("?")[0] for p, _ in stub.requests) == sorted(
            [CURSORS_PATH, TopicName.parse(keys[2].concrete_topic()).admin_path(
                "internalStats")])
