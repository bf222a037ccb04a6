"""Skipped target ids checked against the real brokers' admin API: markers at the end of a
closed ledger on b are claimed once the reader moves on."""

from __future__ import annotations

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
from tests.support.replicated import send_with_snapshots, source_positions_on_b
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
