"""Entry ranges across ledgers, markers and chunked messages on the real brokers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pulsar
import pytest

from cursorsync.core.positions import Position
from cursorsync.mapping.entries_options import EntriesReadError
from cursorsync.mapping.entries_read import RANGES_AT_ONCE, read_entries, read_ranges
from cursorsync.mapping.entries_rows import arrow_batches
from cursorsync.mapping.entries_tasks import EntriesPartition
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.msgid import first_chunk_of
from cursorsync_devtools.testbed import TestBed
from tests.support.entries import (
    COLS,
    REPL,
    _Id,
    _Msg,
    _ScriptedClient,
    client_of,
    entries_reader,
    local_topic,
    produce,
    read_all,
    read_range_by_range,
)
from tests.support.replicated import send_with_snapshots
from tests.support.waiting import wait_for


def produce_many(client: Any, topic: str, n: int) -> None:
    """``n`` single-message entries, sent asynchronously."""
    p = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    for i in range(n):
        p.send_async(b"m%d" % i, None)
    p.flush()
    p.close()


def send_chunked(bed: TestBed, cluster: str, topic: str, size: int,
                 properties: dict[str, str]) -> Position:
    """One chunked message of ``size`` bytes; the position of its first chunk.

    Sent from a process of its own (cursorsync_devtools.testbed._chunked): the C++ client keeps
    one max message size per process, set by the last broker it connected to, and this
    process also talks to b, whose limit is larger than a's.
    """
    done = subprocess.run(
        [sys.executable, "-m", "cursorsync_devtools.testbed._chunked", bed.service_url(cluster),
         topic, str(size), "7"],
        input=json.dumps([{"key": "big", "properties": properties, "partition_key": "pk"}]),
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    return Position.parse(json.loads(done.stdout.splitlines()[0])["first_chunk"])


def positions_read(client: Any, topic: str) -> list[Position]:
    """The entries a plain reader delivers, in order (each entry once)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out: list[Position] = []
    try:
        while reader.has_message_available():
            mid = reader.read_next(10_000).message_id()
            pos = Position(mid.ledger_id(), mid.entry_id())
            if not out or out[-1] != pos:
                out.append(pos)
    finally:
        reader.close()
    return out


# -- ranges across ledgers, markers and chunks on the real brokers ------------------------


@pytest.mark.integration
def test_ranges_across_ledgers_are_sized_from_the_ledger_list(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """a rolls its ledgers every 60 entries. Admission control counts a batch's entries
    across ledgers from the admin ledger list, so its ranges start in an earlier ledger
    than they end; the driver sizes them from that list: the size is what a reader finds
    there, and such a range shares a task like any small one. A driver without the list
    (restarted) gives each a task of its own and reads the same."""
    (big,) = local_topic(testbed, "a", topic_name("big"))
    (small,) = local_topic(testbed, "a", topic_name("small"))
    client = client_of(testbed, "a")
    produce_many(client, big, 130)
    produce(client, small, unbatched=3, batches=[])
    ledgers = testbed.internal_stats("a", big)["ledgers"]
    assert [lg["entries"] for lg in ledgers[:-1]] == [60, 60]  # and the open one, with 10
    r = entries_reader(testbed, [big, small], maxRowsPerBatch="100")
    restarted = entries_reader(testbed, [big, small], maxRowsPerBatch="100")
    try:
        offset = r.initialOffset()
        batches = []
        while (nxt := r.latestOffset(offset, r.getDefaultReadLimit())) != offset:
            tasks = r.partitions(offset, nxt)
            batches.append([[(Position.parse(x.start).ledger != Position.parse(x.end).ledger,
                              x.entry_count(), len({(e[3], e[4]) for e in read_entries(x)}))
                             for x in t.ranges] for t in tasks])
            if len(batches) == 1:
                first = (offset, nxt, read_all(r, offset, nxt))
            offset = nxt
        start, end, rows = first
        assert [len(t.ranges) for t in restarted.partitions(start, end)] == [1, 1]
        assert read_all(restarted, start, end) == rows and len(rows) == 100
    finally:
        r.stop()
        restarted.stop()
    assert batches == [[[(True, 97, 97), (True, 3, 3)]], [[(True, 33, 33)]]]


@pytest.mark.integration
def test_a_tasks_ranges_read_at_once_give_each_ranges_rows_in_order(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """A task of many small ranges reads several at once, each on its own reader: the rows
    are those of the ranges read one after the other, range after range."""
    topics = [local_topic(testbed, "a", topic_name(f"r{i}"))[0]
              for i in range(2 * RANGES_AT_ONCE + 1)]
    client = client_of(testbed, "a")
    for i, t in enumerate(topics):
        produce(client, t, unbatched=1 + i % 3, batches=[2 + i % 2])
    r = entries_reader(testbed, topics)
    try:
        offset = r.initialOffset()
        end = r.latestOffset(offset, r.getDefaultReadLimit())
        ranges = [x for task in r.partitions(offset, end) for x in task.ranges]
        assert len(ranges) == len(topics)
        one_by_one = [row for x in ranges for row in read_entries(x)]
        assert list(read_ranges(ranges)) == one_by_one
        assert len(one_by_one) == sum(1 + i % 3 + 2 + i % 2 for i in range(len(topics)))
    finally:
        r.stop()


@pytest.mark.integration
def test_markers_on_b_leave_every_range_complete(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """With a replicated subscription on a, snapshot markers are written into b's topic
    between and after the replicated messages; readers never receive them, and b's last
    message id is its last message, not a marker. Read one entry id a batch, every range
    completes (markers only, too) and together they hold every message once; a range of the
    markers after the last message completes by the tail check instead of timing out."""
    (t,) = testbed.create_topic(topic_name())
    sub = send_with_snapshots(client_of(testbed, "a"), t, 4)
    for _ in range(4):
        sub.acknowledge(sub.receive(10_000))
    sub.close()
    testbed.wait_replicated([t])
    messages = positions_read(client_of(testbed, "b"), t)
    assert len(messages) == 4
    r = entries_reader(testbed, [t], cluster="b", maxRowsPerBatch="1", tailCheckMs="200",
                       readTimeoutMs="20000")
    try:
        assert r.latest_position(t) == messages[-1]
        lce = wait_for("markers after the last message on b", lambda: (
            e := testbed.last_entry("b", t)) > messages[-1] and e)
        batches = read_range_by_range(r)
        # The markers after the last message, as a range: nothing to deliver.
        (tail,) = r.ranges({t: messages[-1]}, {t: lce})
        assert list(read_entries(tail)) == []  # a timeout would fail the read
    finally:
        r.stop()
    assert [Position(x["ledger"], x["entry"]) for b in batches for x in b] == messages
    assert sum(1 for b in batches if not b) >= 2  # ranges of markers only
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("b"))) as admin:
        kinds = [admin.raw_entry(t, lce.ledger, e) for e in range(messages[-1].entry + 1,
                                                                   lce.entry + 1)]
    assert kinds and all(k is not None and k.is_marker for k in kinds)


@pytest.fixture(scope="module")
def chunked(testbed: TestBed) -> tuple[str, Position, Position, Position]:
    """A topic on a: a small stamped message, then a chunked one of three chunks (a's
    limit is 256 KiB), the last message of the topic: (topic, small, first and last chunk)."""
    (topic,) = local_topic(testbed, "a", f"chunky-{uuid.uuid4().hex[:8]}")
    p = client_of(testbed, "a").create_producer(topic, batching_enabled=False)
    mid = p.send(b"small", properties={REPL: "7:1"})
    p.close()
    first = send_chunked(testbed, "a", topic, 600_000, {REPL: "7:2"})
    last = testbed.last_entry("a", topic)
    assert last == Position(first.ledger, first.entry + 2)
    return topic, Position(mid.ledger_id(), mid.entry_id()), first, last


@pytest.mark.integration
def test_pin_a_reader_started_after_a_chunked_messages_first_chunk_never_delivers_it(
        testbed: TestBed, chunked: tuple[str, Position, Position, Position]) -> None:
    """Why read_entries has a tail check: the client drops chunks whose first chunk it did
    not receive, so a range that starts inside a chunked message and ends at its last chunk
    hears nothing, while the broker says more is available. From the first chunk itself
    (exclusive) the message still comes: the broker sends the start entry again."""
    topic, _, first, last = chunked
    client = client_of(testbed, "a")
    reader = client.create_reader(topic, pulsar.MessageId(-1, first.ledger, first.entry, -1))
    mid = reader.read_next(10_000).message_id()
    reader.close()
    assert (mid.ledger_id(), mid.entry_id()) == (last.ledger, last.entry)
    assert first_chunk_of(mid) == (first.ledger, first.entry)
    reader = client.create_reader(topic,
                                  pulsar.MessageId(-1, first.ledger, first.entry + 1, -1))
    try:
        with pytest.raises(pulsar.Timeout):
            reader.read_next(2000)
        assert reader.has_message_available()
    finally:
        reader.close()


@pytest.mark.integration
def test_a_chunked_message_is_read_with_its_stamp_and_first_chunk_and_no_digest(
        testbed: TestBed, chunked: tuple[str, Position, Position, Position]) -> None:
    """The read goes on; the chunked message's row, at its last chunk, carries that chunk's
    stamp (the builder pairs it as any stamped entry) and names its first chunk (where the
    hole check starts reading its other chunks); no digest."""
    topic, small, first, last = chunked
    r = entries_reader(testbed, [topic])
    try:
        (part,) = r.ranges({}, {topic: last})
    finally:
        r.stop()
    rows = [r for b in arrow_batches(read_entries(part), COLS) for r in b.to_pylist()]
    assert [(r["entry"], r["source_position"], r["first_chunk"]) for r in rows] == [
        (small.entry, "7:1", None), (last.entry, "7:2", str(first))]
    assert rows[1]["entry_identity"] is None and rows[1]["identity"] is None
    assert rows[1]["payload_size"] == 600_000


@pytest.mark.integration
def test_ranges_ending_inside_or_after_a_chunked_message_complete_one_id_at_a_time(
        testbed: TestBed, chunked: tuple[str, Position, Position, Position]) -> None:
    """One entry id a batch: the ranges that end at the first and middle chunks end when the
    message arrives past them; the one from the middle chunk to the last hears nothing (its
    first chunks lie before the start) and completes by the tail check, not a timeout."""
    topic, small, _, _ = chunked
    r = entries_reader(testbed, [topic], maxRowsPerBatch="1", tailCheckMs="200",
                       readTimeoutMs="20000")
    try:
        batches = read_range_by_range(r)  # a range that timed out would fail the read
    finally:
        r.stop()
    assert [[(x["entry"], x["source_position"]) for x in b] for b in batches] == [
        [(small.entry, "7:1")], [], [], []]


@pytest.mark.integration
def test_the_tail_check_reads_no_id_past_a_closed_ledgers_end(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """A batch's end may lie past a closed ledger's end (it bounds the same entries). When
    the reader is slow to deliver the next ledger's first entry, the tail check must not
    ask for ids the ledger never had (the broker answers those with a 500): nothing there
    is for a reader to deliver, so the range is complete."""
    (topic,) = local_topic(testbed, "a", topic_name())
    produce_many(client_of(testbed, "a"), topic, 65)
    (first, n), (second, _) = [(lg["ledgerId"], lg["entries"])
                               for lg in testbed.internal_stats("a", topic)["ledgers"]]
    assert n == 60
    delivered = [_Msg(_Id(first, e)) for e in range(60)]  # then silent, as if slow
    part = EntriesPartition(
        cluster="a", topic=topic, start="-1:-1", end=f"{first}:99",
        client=_ScriptedClient(delivered),  # type: ignore[arg-type]
        identity_fields=("payload",), identity=True, per_entry=True,
        source_position_property=REPL, read_timeout_ms=20_000, tail_check_ms=200,
        admin=AdminSettings.from_urls(testbed.admin_url("a"), attempts=1))
    assert [(r[3], r[4]) for r in read_entries(part)] == [(first, e) for e in range(60)]
    # A range whose undelivered ids hold a message is not complete, however long it waits.
    waiting = dataclasses.replace(part, end=f"{second}:0", read_timeout_ms=800,
                                  client=_ScriptedClient(list(delivered)))
    with pytest.raises(EntriesReadError, match="partial range"):
        list(read_entries(waiting))
