"""What a target reader's skipped entry ids are, and what the brokers say about them in bulk,
pinned against the real test bed (Pulsar 4.0.8).

The mapping classifies the ids a reader on the target skips (``evidence.holes``): a marker
or an aborted transaction's message may be acked on the target, a chunk of a chunked
message only as its message is. These are the facts a classification without one admin
request per skipped id can stand on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pulsar
import pytest

from cursorsync.core.cursor import CursorState
from cursorsync.core.identity import REPL_SOURCE_POSITION_PROPERTY
from cursorsync.core.positions import Position
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.replicated import send_with_snapshots
from tests.support.skipped_ids import (
    delivered,
    markers_chunks_and_messages,
    raw_headers,
    runtime_setting,
    send_chunked,
    stored,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def test_a_continuous_read_skips_only_markers_and_the_chunks_inside_a_delivered_span(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """On b, with a replicated subscription's markers, chunked messages from a and plain
    messages between them: every stored id a reader from the earliest entry does not return
    is a marker, or a chunk lying between the first and the last chunk of a message the
    reader did return (a chunked message's id names both). Nothing else is skipped. A
    marker may lie inside such a span too (the brokers write them whenever, between two
    chunks of one message as well: seen once, 844:22 between chunks 844:21 and 844:24), so
    a span alone never says an id is a chunk."""
    bed = testbed
    (t,) = bed.create_topic(topic_name("skips"))
    markers_chunks_and_messages(bed, t)
    got = delivered(bed, "b", t)
    spans = [(f, last) for f, last in got if f != last]
    assert len(spans) == 2, got
    returned = {last for _, last in got}
    kinds: dict[str, int] = {"marker": 0, "chunk": 0}
    for pos in stored(bed, "b", t):
        if pos in returned:
            continue
        h = raw_headers(bed, "b", t, pos)
        if "X-Pulsar-marker-type" in h:
            kinds["marker"] += 1
        else:
            assert h.get("X-Pulsar-chunk-id") is not None, (pos, dict(h))
            assert any(f <= pos < last for f, last in spans), (pos, spans)
            kinds["chunk"] += 1
    assert kinds["marker"] >= 2 and kinds["chunk"] >= 2, kinds


def test_a_read_begun_inside_a_chunked_message_skips_its_other_chunks_outside_every_span(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """A reader started after a chunked message's first chunk never returns the message:
    its later chunks are skipped ids no delivered span covers, indistinguishable, for the
    reader, from markers. A classification by spans holds only over a read that began
    at or before the first chunk of every chunked message it classifies."""
    bed = testbed
    (t,) = bed.create_topic(topic_name("mid-chunk"))
    (first_on_a,) = send_chunked(bed, t, 1, 600 * 1024)
    bed.wait_replicated([t])
    ((first, last),) = delivered(bed, "b", t)
    assert first.ledger == last.ledger and first.entry + 2 <= last.entry
    assert raw_headers(bed, "b", t, last).get("X-Pulsar-chunk-id") is not None
    # Started exactly at the first chunk (exclusive), a reader still returns the message:
    # the broker dispatches from the start entry and the client drops only messages whose
    # id is not past it, and a chunked message's id is its last chunk's.
    at_first = pulsar.MessageId(-1, first.ledger, first.entry, -1)
    assert delivered(bed, "b", t, at_first) == [(first, last)]
    # Started after the first chunk, it never returns the message ("uncached chunk", the
    # client logs), though it keeps saying a message is available.
    after_first = pulsar.MessageId(-1, first.ledger, first.entry + 1, -1)
    assert delivered(bed, "b", t, after_first) == []
    reader = bed.client("b").create_reader(t, after_first)
    try:
        assert reader.has_message_available()
        with pytest.raises(pulsar.Timeout):
            reader.read_next(3_000)
        assert reader.has_message_available()
    finally:
        reader.close()
    assert first_on_a.ledger >= 0


@pytest.mark.slow  # a minute of stats updates; the classification never rests on it
def test_the_chunk_flag_counts_only_producers_connected_at_the_stats_update(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Topic stats carry ``msgChunkPublished``, set at a stats update (every
    ``statsUpdateFrequencyInSecs``) from the chunk counts of the producers connected then.
    On b, where the replicator's producer stays, it turns true after replicated chunks
    arrive; on a, where the chunked message's producer left right after sending, it stays
    false though a holds the message. It is false on a topic with plain messages and
    markers only, and false again after an unload; ``entriesAddedCounter`` (internalStats)
    counts the entries added since the load. So the flag is no witness that a topic holds
    no chunks, and classifying skipped ids does not rest on it."""
    bed = testbed
    plain, chunky = (bed.create_topic(topic_name(n))[0] for n in ("plain", "chunky"))
    send_with_snapshots(bed.client("a"), plain, 2).close()
    send_chunked(bed, chunky, 1, 600 * 1024)  # its producer's process exits after the send
    sent = time.monotonic()
    bed.wait_replicated([plain, chunky])
    every = float(runtime_setting(bed, "b", "statsUpdateFrequencyInSecs"))

    def flag(cluster: str, topic: str) -> bool:
        path = TopicName.parse(topic).admin_path("stats")
        return bool(bed.admin_call(cluster, "GET", path, ok=(200,)).get("msgChunkPublished"))

    wait_for("msgChunkPublished on b", lambda: flag("b", chunky), 2 * every + 30)
    time.sleep(max(0.0, sent + every + 5 - time.monotonic()))  # a's stats update passed too
    ((first, last),) = delivered(bed, "a", chunky)
    assert first < last and not flag("a", chunky)  # a holds a chunked message, unflagged
    assert not flag("b", plain)
    added = bed.internal_stats("b", chunky)["entriesAddedCounter"]
    assert added == len(stored(bed, "b", chunky)) > 0
    bed.admin_call("b", "PUT", TopicName.parse(chunky).admin_path("unload"))
    assert not flag("b", chunky)  # asking loads it again: the flag starts false
    assert bed.internal_stats("b", chunky)["entriesAddedCounter"] == 0


def test_a_durable_cursor_shows_which_ids_the_broker_filtered_as_it_dispatched(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """A consumer on b that acks nothing reads through a replicated subscription's markers,
    chunked messages and plain ones: its subscription's cursor then holds as acked exactly
    the markers, which the broker acks itself as it filters them out of dispatch, and none
    of the chunks or messages. One internalStats request per partition then answers for
    every id the consumer skipped."""
    bed = testbed
    (t,) = bed.create_topic(topic_name("filtered"))
    markers_chunks_and_messages(bed, t)
    probe = bed.client("b").subscribe(t, "probe", consumer_type=pulsar.ConsumerType.Exclusive,
                                      initial_position=pulsar.InitialPosition.Earliest)
    got = []
    try:
        while True:
            try:
                got.append(probe.receive(5_000).message_id())
            except pulsar.Timeout:
                break
        cursor = bed.internal_stats("b", t)["cursors"]["probe"]
    finally:
        probe.close()
    assert len(got) == 3 + 2 + 1
    markers = {pos for pos in stored(bed, "b", t)
               if "X-Pulsar-marker-type" in raw_headers(bed, "b", t, pos)}
    assert len(markers) >= 2
    acked = CursorState.parse(cursor["markDeletePosition"],
                              cursor.get("individuallyDeletedMessages") or "[]").acked()
    assert {pos for pos in stored(bed, "b", t) if acked.contains(pos)} == markers, cursor


def test_every_replicated_chunk_names_its_source_chunk(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """The replicator stamps each entry it copies with its source position, chunks
    included: every chunk of a chunked message on b, replicated from a, names the entry
    on a that holds the same chunk (the same uuid and chunk id), so the chunks map one by
    one with no guess about spans. The message a reader returns carries its last chunk's
    properties, so its stamp names a's last chunk."""
    bed = testbed
    (t,) = bed.create_topic(topic_name("stamped-chunks"))
    markers_chunks_and_messages(bed, t)
    spans = [(f, last) for f, last in delivered(bed, "b", t) if f != last]
    assert len(spans) == 2, spans
    stamps = {}
    reader = bed.client("b").create_reader(t, pulsar.MessageId.earliest)
    try:
        while reader.has_message_available():
            msg = reader.read_next(5_000)
            mid = msg.message_id()
            stamps[Position(mid.ledger_id(), mid.entry_id())] = msg.properties().get(
                REPL_SOURCE_POSITION_PROPERTY)
    finally:
        reader.close()
    for first, last in spans:
        chunks = {}
        for pos in (p for p in stored(bed, "b", t) if first <= p <= last):
            h = raw_headers(bed, "b", t, pos)
            if "X-Pulsar-marker-type" in h:
                continue
            stamp = json.loads(h.get("X-Pulsar-property", "{}")).get(REPL_SOURCE_POSITION_PROPERTY)
            assert stamp is not None and h.get("X-Pulsar-replicated-from") == "a", (pos,
                                                                                   dict(h))
            on_a = raw_headers(bed, "a", t, Position.parse(stamp))
            for name in ("X-Pulsar-uuid", "X-Pulsar-chunk-id", "X-Pulsar-num-chunks-from-msg"):
                assert on_a.get(name) == h.get(name) is not None, (pos, name, dict(h),
                                                                   dict(on_a))
            chunks[int(h["X-Pulsar-chunk-id"])] = pos
        assert sorted(chunks) == list(range(int(h["X-Pulsar-num-chunks-from-msg"]))), chunks
        assert chunks[0] == first and chunks[max(chunks)] == last, (chunks, first, last)
        last_stamp = json.loads(raw_headers(bed, "b", t, last)["X-Pulsar-property"])
        assert stamps[last] == last_stamp[REPL_SOURCE_POSITION_PROPERTY], (stamps, last)
