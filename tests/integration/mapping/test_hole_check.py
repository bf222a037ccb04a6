"""Skipped target ids checked against the real brokers' admin API: markers at the end of a
closed ledger on b are claimed once the reader moves on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pyarrow as pa
import pytest

from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.mapping.builder import BuilderSettings, MappingBuilder
from cursorsync.mapping.hole_check import AdminHoleCheck
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.entries import entries_reader, read_range_by_range
from tests.support.replicated import send_with_snapshots, source_positions_on_b
from tests.support.skipped_ids import kill_mid_chunked_message, raw_headers
from tests.support.waiting import wait_for


@pytest.mark.integration
def test_markers_at_the_end_of_a_closed_ledger_on_b_are_claimed_once_the_reader_moves_on(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Real Pulsar 4.0: a replicated subscription leaves markers on b after its last message;
    b's ledger then closes (the topic is unloaded) and the next message lands in a new
    ledger. A reader on b returns the last message, then the new one: the ids between them
    at the old ledger's end are probed through b's admin API (the first id past its end
    answers "no such entry") and every one of them is claimed, as a marker; the ids past
    the end are not counted as skipped ids."""
    (t,) = testbed.create_topic(topic_name("ledger-end"))
    a = testbed.client("a")
    sub = send_with_snapshots(a, t, 3)
    producer = a.create_producer(t, batching_enabled=False)
    for _ in range(3):
        sub.acknowledge(sub.receive(10_000))
    last = wait_for("three messages on b",
                    lambda: list(source_positions_on_b(testbed, t))[2:3])[0]
    wait_for("markers on b after its last message",
             lambda: testbed.last_entry("b", t) > last, timeout_s=60)
    time.sleep(3)  # the UPDATE markers the acks cause
    testbed.admin_call("b", "PUT", TopicName.parse(t).admin_path("unload"))
    producer.send(b"after")
    returned = wait_for("the fourth message on b", lambda: (
        lambda got: got if len(got) == 4 else None)(list(source_positions_on_b(testbed, t))),
        timeout_s=60)
    assert returned[3].ledger > last.ledger, returned
    closed = {lg["ledgerId"]: lg["entries"] for lg in testbed.internal_stats("b", t)["ledgers"]}
    tail = [Position(last.ledger, e) for e in range(last.entry + 1, closed[last.ledger])]
    assert tail, "no marker after b's last message in its closed ledger: nothing to probe"

    key = PartitionKey(t, -1)
    rows = pa.table({
        "cluster": ["b"] * 4, "topic": [t] * 4, "partition": pa.array([-1] * 4, pa.int32()),
        "ledger": pa.array([p.ledger for p in returned], pa.int64()),
        "entry": pa.array([p.entry for p in returned], pa.int64()),
        "batch_index": pa.array([-1] * 4, pa.int32()),
        "source_position": pa.array([None] * 4, pa.string()),
        "entry_identity": pa.array([None] * 4, pa.binary()),
    })
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("b"), cluster="b")) as admin:
        check = AdminHoleCheck(admin)
        builder = MappingBuilder(BuilderSettings("a", "b", ("position-property",)),
                                 hole_check=check)
        outcomes = [builder.process(rows)]
        while outcomes[-1].skipped_waiting and len(outcomes) < 10:
            outcomes.append(builder.process(rows.slice(0, 0)))
        kinds = {p: admin.raw_entry(t, p.ledger, p.entry) for p in tail}
    assert all(k is not None and k.is_marker for k in kinds.values()), kinds
    claimed = builder.known[key].skippable.ranges()
    assert all(claimed.contains(p) for p in tail), (tail, claimed)
    assert not claimed.contains(Position(last.ledger, closed[last.ledger])), claimed
    # Ids probed past the ledger's end are no skipped ids: every one counted was claimed.
    assert sum(o.skipped_ids for o in outcomes) == sum(o.skipped_claimed for o in outcomes)
    sub.close()


@pytest.mark.integration
def test_interleaved_chunked_messages_map_chunk_by_chunk_among_markers_on_real_brokers(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Real Pulsar 4.0: two producer processes send chunked messages at once, while a
    replicated subscription's markers and plain messages are written around them, so
    chunks of different messages interleave on a and on b. The entries reader reads b from
    the start (its first entry is a chunk), the builder checks what it skipped on b's
    admin API: every chunk on b, the last ones included, is mapped to exactly the entry on
    a holding the same chunk (same uuid and chunk id, read back from a), every marker is
    claimed or lies after the last returned entry, and no other id is mapped or claimed.
    A third producer is killed in the middle of a chunked message that never completes:
    no reader returns it, and its chunks map one by one like the others (acked on b only
    as a's are, so never a loss, deliverable or not). Ledgers the reader returns nothing
    from are pinned by the per-id oracle in tests/unit/mapping/test_hole_check.py."""
    (t,) = testbed.create_topic(topic_name("interleaved"))
    a = testbed.client("a")
    # Publishing throttled to 20 entries a second on a: the two producers' chunks take
    # turns, and the third producer is killed long before its message's last chunk,
    # however loaded the machine is.
    rate = TopicName.parse(t).admin_path("publishRate")
    testbed.admin_call("a", "POST", rate, json={"publishThrottlingRateInMsg": 20,
                                                 "publishThrottlingRateInByte": -1})
    wait_for("the publish rate applied on a", lambda: testbed.admin_call(
        "a", "GET", rate, ok=(200, 204)), timeout_s=30)
    time.sleep(1)
    # Each sender connects, then waits for its list on stdin: both start sending at once.
    senders = [subprocess.Popen(
        [sys.executable, "-m", "cursorsync_devtools.testbed._chunked", testbed.service_url("a"),
         t, str(2500 * 1024), str(seed), f"chunky-{seed}"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True) for seed in (3, 4)]
    stats_path = TopicName.parse(t).admin_path("stats")
    wait_for("both chunked producers connected to a", lambda: len(testbed.admin_call(
        "a", "GET", stats_path, ok=(200,))["publishers"]) == 2, timeout_s=60)
    lists = [json.dumps([{"key": f"big-{i}-{j}", "properties": {}, "partition_key": "k"}
                         for j in range(3)]) for i in range(2)]
    for s, items in zip(senders, lists, strict=True):
        assert s.stdin is not None
        s.stdin.write(items)
    for s in senders:
        assert s.stdin is not None
        s.stdin.close()
    sub = send_with_snapshots(a, t, 4)
    for s in senders:
        assert s.wait(timeout=120) == 0
    kill_mid_chunked_message(testbed, t)
    # Chunks the broker already buffered from the killed producer are still written after
    # the kill; once the broker has dropped the producer no more are, so "after" is last.
    wait_for("the killed producer dropped by a", lambda: not any(
        p.get("producerName") == "chunky-killed"
        for p in testbed.admin_call("a", "GET", stats_path, ok=(200,))["publishers"]),
        timeout_s=120)
    producer = a.create_producer(t, batching_enabled=False)
    producer.send(b"after")
    producer.close()
    sub.close()
    testbed.wait_replicated([t])

    r = entries_reader(testbed, [t], cluster="b")
    try:
        rows = pa.Table.from_pylist([x for b in read_range_by_range(r) for x in b])
    finally:
        r.stop()
    assert rows.num_rows == 4 + 6 + 1, rows.to_pylist()
    chunked = [x for x in rows.to_pylist() if x["first_chunk"] is not None]
    assert len(chunked) == 6
    key = PartitionKey(t, -1)
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("b"), cluster="b")) as admin, \
            AdminClient(AdminSettings.from_urls(testbed.admin_url("a"), cluster="a")) as on_a:
        check = AdminHoleCheck(admin, target_cluster="b", source_cluster="a")
        builder = MappingBuilder(BuilderSettings("a", "b", ("position-property",)),
                                 hole_check=check)
        outcomes = [builder.process(rows)]
        while outcomes[-1].skipped_waiting and len(outcomes) < 10:
            outcomes.append(builder.process(rows.slice(0, 0)))
        known = builder.known[key]
        pairs = {Position(tl, te + k): Position(sl, se + k)
                 for sl, se, tl, te, n in known.segments.rows.tolist() for k in range(n)}
        claimed = known.skippable.ranges()
        st = testbed.internal_stats("b", t)
        last_returned = max(Position(x["ledger"], x["entry"]) for x in rows.to_pylist())
        uuids: dict[Position, str | None] = {}
        for lg in st["ledgers"]:
            end = (lg["entries"] if lg["ledgerId"] != Position.parse(
                st["lastConfirmedEntry"]).ledger else Position.parse(
                st["lastConfirmedEntry"]).entry + 1)
            for e in range(end):
                pos = Position(lg["ledgerId"], e)
                raw = admin.raw_entry(t, pos.ledger, pos.entry)
                assert raw is not None
                if raw.is_marker:
                    uuids[pos] = "marker"
                    assert pos not in pairs, pos
                    assert claimed.contains(pos) or pos > last_returned, pos
                    continue
                assert not claimed.contains(pos), pos
                source = pairs.get(pos)
                assert source is not None, (pos, raw)  # every message and chunk is mapped
                copy = on_a.raw_entry(t, source.ledger, source.entry)
                assert copy is not None and not copy.is_marker
                assert (copy.chunk_id, copy.num_chunks) == (raw.chunk_id, raw.num_chunks)
                uuids[pos] = raw_headers(testbed, "b", t, pos).get("X-Pulsar-uuid")
                assert raw_headers(testbed, "a", t, source).get("X-Pulsar-uuid") == uuids[pos]
    # Something else lies inside some chunked message's span: chunks do interleave.
    spans = [(Position.parse(x["first_chunk"]), Position(x["ledger"], x["entry"]))
             for x in chunked]
    assert any(uuids[p] != uuids[last] for first, last in spans for p in uuids
               if first < p < last), uuids
    # The message that never completed left chunks on b, mapped, in no span.
    incomplete = {p for p, u in uuids.items() if u is not None and "chunky-killed" in u}
    assert len(incomplete) >= 3 and all(p in pairs for p in incomplete), uuids
    assert check.stats.chunks >= 6 * 2  # two or more chunks of each message before its last
    assert sum(o.skipped_mapped for o in outcomes) == check.stats.chunks
