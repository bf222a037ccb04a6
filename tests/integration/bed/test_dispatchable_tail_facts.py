"""What the source broker says in one round trip about the entries past a partition's last
message, pinned against the real test bed (Pulsar 4.0.8).

The sync classifies the acked source entries past the last one the mapping maps by the
broker's last dispatchable position: a reader started after that entry asks for it
(:class:`cursorsync.pulsar.dispatchable.DispatchableTail`), or cursorsync's broker plugin
lists it for every partition the broker serves (``PluginTail``, on a bed with the plugin).
Each test runs both ways and compares the answer with what the admin API's raw entries say
every entry past that position is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from cursorsync.core.positions import Position
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.dispatchable import DispatchableTail, PluginTail
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.replicated import send_with_snapshots
from tests.support.skipped_ids import delivered, kill_mid_chunked_message, raw_headers, stored
from tests.support.waiting import wait_for

# The plugin's bed is asked for by one parameter only (see tests.support.shared).
pytestmark = [pytest.mark.integration, pytest.mark.shares("index_testbed")]

Tail = DispatchableTail | PluginTail


@pytest.fixture(params=["reader", "plugin"])
def bed_tail(request: pytest.FixtureRequest) -> Iterator[tuple[TestBed, Tail]]:
    """A bed and its tail check: a reader per check, or the plugin's answers (a bed with
    the plugin loaded)."""
    if request.param == "reader":
        bed: TestBed = request.getfixturevalue("testbed")
        tail: Tail = DispatchableTail(ClientSettings(bed.service_url("a")))
    else:
        bed = request.getfixturevalue("index_testbed")
        admin = AdminClient(AdminSettings.from_urls(bed.admin_url("a"), cluster="a"))
        tail = PluginTail(admin, DispatchableTail(ClientSettings(bed.service_url("a"))))
    yield bed, tail
    if isinstance(tail, PluginTail):
        # Every partition here has had messages since it was loaded: its broker knows
        # its position without reading, so no check went to a reader.
        assert tail.requests_by_kind()["tail-check"] == 0
        assert tail.answered > 0
        tail.admin.close()
    tail.close()


def is_marker(bed: TestBed, topic: str, pos: Position) -> bool:
    return "X-Pulsar-marker-type" in raw_headers(bed, "a", topic, pos)


def markers_after_last_message(bed: TestBed, topic: str) -> Position:
    """Waits until the topic on a holds markers after its last message (the snapshot the
    replicated subscription takes after it); the last message's position."""
    last = delivered(bed, "a", topic)[-1][1]
    wait_for("snapshot markers after the last message on a",
             lambda: bed.last_entry("a", topic) >= Position(last.ledger, last.entry + 2),
             timeout_s=60)
    return last


def test_only_markers_past_the_last_message_say_nothing_dispatchable(
        bed_tail: tuple[TestBed, Tail], topic_name: Callable[[str], str]) -> None:
    """Past a partition's last message only markers: nothing dispatchable after it, and
    something after any earlier message; a message sent after the markers turns the answer,
    and the first answer's markers are still markers."""
    testbed, tail = bed_tail
    part = testbed.create_topic(topic_name("tail"), partitions=2)[1]
    sub = send_with_snapshots(testbed.client("a"), part, 3)
    last = markers_after_last_message(testbed, part)
    past = [p for p in stored(testbed, "a", part) if p > last]
    assert past and all(is_marker(testbed, part, p) for p in past), past
    assert tail.nothing_dispatchable_after(part, last)
    first = delivered(testbed, "a", part)[0][1]
    assert not tail.nothing_dispatchable_after(part, first)
    producer = testbed.client("a").create_producer(part, batching_enabled=False)
    producer.send(b"after the markers")
    producer.close()
    assert not tail.nothing_dispatchable_after(part, last)
    assert all(is_marker(testbed, part, p) for p in past)
    assert sum(tail.requests_by_kind().values()) == 3  # a reader or a plugin answer each
    sub.close()


def test_a_batched_last_message_and_its_markers(
        bed_tail: tuple[TestBed, Tail], topic_name: Callable[[str], str]) -> None:
    """The last message's entry a batch of several: past it only markers, nothing
    dispatchable (the broker names the batch's last index; the answer compares entries)."""
    testbed, tail = bed_tail
    (t,) = testbed.create_topic(topic_name("tail-batch"))
    a = testbed.client("a")
    sub = send_with_snapshots(a, t, 1)
    producer = a.create_producer(t, batching_enabled=True, batching_max_messages=5,
                                 batching_max_publish_delay_ms=1_000)
    for i in range(5):
        producer.send_async(b"b%d" % i, None)
    producer.flush()
    producer.close()
    last = markers_after_last_message(testbed, t)
    assert delivered(testbed, "a", t)[-2][1] == last  # five messages of one entry
    assert tail.nothing_dispatchable_after(t, last)
    assert not tail.nothing_dispatchable_after(t, Position(last.ledger, last.entry - 1))
    sub.close()


def test_the_chunks_of_a_message_that_never_completes_are_dispatchable(
        bed_tail: tuple[TestBed, Tail], topic_name: Callable[[str], str]) -> None:
    """A producer killed in the middle of a chunked message leaves chunks no reader
    returns: the broker counts them dispatchable, so they are never taken for markers."""
    testbed, tail = bed_tail
    (t,) = testbed.create_topic(topic_name("tail-chunks"))
    rate = TopicName.parse(t).admin_path("publishRate")
    testbed.admin_call("a", "POST", rate, json={"publishThrottlingRateInMsg": 20,
                                                 "publishThrottlingRateInByte": -1})
    wait_for("the publish rate applied on a", lambda: testbed.admin_call(
        "a", "GET", rate, ok=(200, 204)), timeout_s=30)
    sub = send_with_snapshots(testbed.client("a"), t, 2)
    last = markers_after_last_message(testbed, t)
    assert tail.nothing_dispatchable_after(t, last)
    before = kill_mid_chunked_message(testbed, t)
    time.sleep(1)
    assert delivered(testbed, "a", t)[-1][1] == last  # no reader returns the chunks
    # Past ``before``: the chunks, and the markers of the snapshots they set off.
    past = {p: raw_headers(testbed, "a", t, p) for p in stored(testbed, "a", t) if p > before}
    chunks = [p for p, h in past.items() if h.get("X-Pulsar-chunk-id") is not None]
    assert len(chunks) >= 2 and all(
        p in chunks or "X-Pulsar-marker-type" in h for p, h in past.items()), past
    assert not tail.nothing_dispatchable_after(t, last)
    assert not tail.nothing_dispatchable_after(t, before)
    sub.close()
