"""Stored, delivered and skipped entry ids of a topic on the test bed, and chunked
messages to skip: what the tests of skipped-id classification compare against."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pulsar

from cursorsync.core.positions import Position
from cursorsync.pulsar.msgid import first_chunk_of
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed


def raw_headers(bed: TestBed, cluster: str, topic: str, pos: Position) -> httpx.Headers:
    path = TopicName.parse(topic).admin_path(f"ledger/{pos.ledger}/entry/{pos.entry}")
    r = httpx.get(bed.admin_url(cluster) + path, timeout=10)
    assert r.status_code == 200, (topic, pos, r.text)
    return r.headers


def stored(bed: TestBed, cluster: str, topic: str) -> list[Position]:
    """Every entry id the topic holds on the cluster, in order."""
    st = bed.internal_stats(cluster, topic)
    last = Position.parse(st["lastConfirmedEntry"])
    out: list[Position] = []
    for lg in st["ledgers"]:
        n = lg["entries"] if lg["ledgerId"] != last.ledger else last.entry + 1
        out += [Position(lg["ledgerId"], e) for e in range(n)]
    return out


def delivered(bed: TestBed, cluster: str, topic: str, start: Any = None,
              ) -> list[tuple[Position, Position]]:
    """What a reader from ``start`` (earliest by default, exclusive) returns: each message as
    (first entry, last entry); the two differ only for a chunked message. Reads until the
    reader says nothing is left, or until nothing comes for 5 s though it says something
    is (see the test of a read begun inside a chunked message)."""
    reader = bed.client(cluster).create_reader(
        topic, pulsar.MessageId.earliest if start is None else start)
    out = []
    try:
        while reader.has_message_available():
            try:
                mid = reader.read_next(5_000).message_id()
            except pulsar.Timeout:
                break
            last = Position(mid.ledger_id(), mid.entry_id())
            first = first_chunk_of(mid)
            out.append((Position(*first) if first else last, last))
    finally:
        reader.close()
    return out


def send_chunked(bed: TestBed, topic: str, count: int, size: int) -> list[Position]:
    """``count`` chunked messages on a, from a process of its own (the C++ client keeps one
    maximum message size per process); their first chunks' positions on a."""
    items = [{"key": f"big-{i}", "properties": {"key": f"big-{i}"}, "partition_key": "k"}
             for i in range(count)]
    done = subprocess.run(
        [sys.executable, "-m", "cursorsync_devtools.testbed._chunked", bed.service_url("a"),
         topic, str(size), "7"], input=json.dumps(items), capture_output=True, text=True,
        timeout=120, check=True)
    return [Position.parse(json.loads(line)["first_chunk"]) for line in done.stdout.splitlines()]


def kill_mid_chunked_message(bed: TestBed, topic: str) -> Position:
    """A producer ``chunky-killed`` on a, killed a few chunks into a 16 MB chunked message
    that so never completes; a's last entry before its first chunk."""
    from tests.support.waiting import wait_for

    before = bed.last_entry("a", topic)
    killed = subprocess.Popen(
        [sys.executable, "-m", "cursorsync_devtools.testbed._chunked", bed.service_url("a"),
         topic, str(16 * 1024 * 1024), "5", "chunky-killed"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    assert killed.stdin is not None
    killed.stdin.write(json.dumps([{"key": "never", "properties": {}, "partition_key": "k"}]))
    killed.stdin.close()
    wait_for("a few chunks of the message that never completes on a",
             lambda: bed.last_entry("a", topic) > Position(before.ledger, before.entry + 2),
             timeout_s=60)
    killed.kill()
    killed.wait(timeout=30)
    return before


def runtime_setting(bed: TestBed, cluster: str, name: str) -> str:
    conf = bed.admin_call(cluster, "GET", "/admin/v2/brokers/configuration/runtime", ok=(200,))
    return str(conf[name])


def markers_chunks_and_messages(bed: TestBed, topic: str, *, updates: bool = False) -> None:
    """On a, then replicated to b: a replicated Shared subscription's markers around three
    messages, two chunked messages, and one plain message after them. ``updates``: one
    message acked as well (an UPDATE marker or two)."""
    from tests.support.replicated import send_with_snapshots

    consumer = send_with_snapshots(bed.client("a"), topic, 3)
    send_chunked(bed, topic, 2, 600 * 1024)
    if updates:
        consumer.acknowledge(consumer.receive(10_000))
    producer = bed.client("a").create_producer(topic, batching_enabled=False)
    producer.send(b"after")
    producer.close()
    consumer.close()
    bed.wait_replicated([topic])
