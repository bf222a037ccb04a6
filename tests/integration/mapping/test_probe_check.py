"""``evidence.holes: probe`` on the real brokers: the skipped ids of b's partitions claimed
from a probe cursor give the same answer as one raw-entry request per id, for a fraction
of the requests; where the probe cannot answer, the per-id check does."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.hole_check import AdminHoleCheck
from cursorsync.mapping.probe_check import ProbeHoleCheck
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.cursor_digests import cluster_cursor_stats
from cursorsync.pulsar.dispatch_probe import PROBE_SUBSCRIPTION, DispatchProbe
from cursorsync.pulsar.stats import TopicInternalStats
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.skipped_ids import delivered, markers_chunks_and_messages, stored
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def admin_b(testbed: TestBed) -> Iterator[AdminClient]:
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("b"), cluster="b")) as admin:
        yield admin


def skipped_on_b(bed: TestBed, topic: str) -> tuple[Runs, Position]:
    """The ids a reader on b skips (between the first and the last message it returns), and
    the last message's position."""
    got = delivered(bed, "b", topic)
    returned = {last for _, last in got}
    end = max(returned)
    ids = [p for p in stored(bed, "b", topic) if p not in returned and p < end]
    return Runs.from_positions([p.ledger for p in ids], [p.entry for p in ids]), end


def test_the_probe_claims_what_the_per_id_check_claims_for_far_fewer_requests(
        testbed: TestBed, admin_b: AdminClient, topic_name: Callable[[str], str]) -> None:
    (t,) = testbed.create_topic(topic_name("probe"))
    markers_chunks_and_messages(testbed, t, updates=True)
    runs, end = skipped_on_b(testbed, t)
    key = PartitionKey(t, -1)
    verified = AdminHoleCheck(admin_b)
    expected = verified({key: runs})
    assert expected and expected[key].entry_count() >= 2  # markers to claim

    probe = DispatchProbe(testbed.client("b"), admin_b, PROBE_SUBSCRIPTION)
    per_id = AdminHoleCheck(admin_b)
    check = ProbeHoleCheck(probe, per_id, wait_s=30.0)
    got = check({key: runs})
    assert got[key] == expected[key]
    # The per-id check was asked only where a run starts with a chunk: one request each.
    assert per_id.stats.markers == 0
    assert per_id.stats.requests == per_id.stats.not_markers < verified.stats.requests
    assert check.stats.filtered == expected[key].entry_count()
    # The mapping read up to the last message: the probe acks up to there, holding nothing.
    check.read_to({key: end})
    wait_for("the probe subscription acked up to the last message", lambda: Position.parse(
        testbed.internal_stats("b", t)["cursors"][PROBE_SUBSCRIPTION]["markDeletePosition"])
        >= end, timeout_s=30)
    check.close()


def test_ids_a_probe_is_behind_on_wait_for_it_and_cost_no_request_per_id(
        testbed: TestBed, admin_b: AdminClient, topic_name: Callable[[str], str]) -> None:
    """The probe's listener is paused when it is placed, so it stays behind the skipped
    ids: they are left for a later batch, not sent per id. Once it goes on, the same ids
    are claimed on its word, as one raw-entry request per id would claim them."""
    (t,) = testbed.create_topic(topic_name("probe-behind"))
    markers_chunks_and_messages(testbed, t, updates=True)
    runs, end = skipped_on_b(testbed, t)
    key = PartitionKey(t, -1)
    expected = AdminHoleCheck(admin_b)({key: runs})
    probe = DispatchProbe(testbed.client("b"), admin_b, PROBE_SUBSCRIPTION)
    consumer = probe._probe(t).consumer  # subscribed at the end: nothing to receive yet
    consumer.pause_message_listener()
    per_id = AdminHoleCheck(admin_b)
    check = ProbeHoleCheck(probe, per_id, wait_s=1.0)
    assert check({key: runs}) == {}
    assert check.drain_deferred() == {key} and per_id.stats.requests == 0
    assert check.stats.deferred == runs.entry_count()
    consumer.resume_message_listener()
    wait_for("the probe past the skipped ids", lambda: probe.wait_past(
        {t: Position(end.ledger, end.entry - 1)}, 0.5) == {t}, timeout_s=30)
    got = check({key: runs})
    assert got[key] == expected[key] and check.drain_deferred() == set()
    assert per_id.stats.markers == 0  # only runs starting with a chunk were asked per id
    check.close()


def test_a_topic_with_a_message_ttl_is_checked_per_id(
        testbed: TestBed, admin_b: AdminClient, topic_name: Callable[[str], str]) -> None:
    """Message expiry acks on every subscription, the probe's too: a topic with a TTL is
    not probed, and the per-id check answers for all of its skipped ids."""
    (t,) = testbed.create_topic(topic_name("probe-ttl"))
    ttl = TopicName.parse(t).admin_path("messageTTL")
    testbed.admin_call("b", "POST", ttl + "?messageTTL=3600")
    wait_for("the TTL applied on b", lambda: testbed.admin_call(
        "b", "GET", ttl + "?applied=true", ok=(200,)) == 3600, timeout_s=30)
    markers_chunks_and_messages(testbed, t, updates=True)
    runs, _ = skipped_on_b(testbed, t)
    key = PartitionKey(t, -1)
    expected = AdminHoleCheck(admin_b)({key: runs})
    probe = DispatchProbe(testbed.client("b"), admin_b, PROBE_SUBSCRIPTION)
    check = ProbeHoleCheck(probe, AdminHoleCheck(admin_b), wait_s=5.0)
    assert check({key: runs}) == expected
    assert check.stats.filtered == 0 and probe.stats.disturbed == 1
    assert PROBE_SUBSCRIPTION not in testbed.internal_stats("b", t)["cursors"]
    check.close()


def test_the_probes_of_many_partitions_are_placed_at_once_each_where_it_was_asked(
        testbed: TestBed, admin_b: AdminClient, topic_name: Callable[[str], str]) -> None:
    """Placing probes is a subscribe and a seek per partition; they run side by side, and
    each partition's probe still starts just after the position the mapping read to."""
    partitions = testbed.create_topic(topic_name("probe-wide"), partitions=12)
    producer = testbed.client("b").create_producer(
        str(TopicName.parse(partitions[0]).base), batching_enabled=False)
    for i in range(36):
        producer.send(f"m{i}".encode(), partition_key=str(i))
    producer.close()
    ends = {PartitionKey(str(TopicName.parse(t).base), i): testbed.last_entry("b", t)
            for i, t in enumerate(partitions)}
    assert all(pos.entry >= 0 for pos in ends.values())
    probe = DispatchProbe(testbed.client("b"), admin_b, PROBE_SUBSCRIPTION)
    check = ProbeHoleCheck(probe, AdminHoleCheck(admin_b), wait_s=5.0)
    check.read_to(ends)
    assert probe.stats.seeks == len(partitions)
    assert check.stats.seconds["place"] > 0
    for key, pos in ends.items():
        topic = key.concrete_topic()
        assert probe.vouches_after(topic) == pos
        cursor = testbed.internal_stats("b", topic)["cursors"][PROBE_SUBSCRIPTION]
        assert Position.parse(cursor["markDeletePosition"]) == pos, topic
    check.close()


def test_with_the_plugin_one_request_reads_every_probe_as_internal_stats_would(
        index_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """``spark.cursor_digests``: the target brokers' plugin reads the probe cursors, a
    request per broker for all partitions, and the claims are the per-id check's. What it
    answers of each probe cursor and the ledgers is what internalStats shows."""
    bed = index_testbed
    parts = bed.create_topic(topic_name("probe-plugin"), partitions=2)
    for part in parts:
        markers_chunks_and_messages(bed, part, updates=True)
    with AdminClient(AdminSettings.from_urls(bed.admin_url("b"), cluster="b")) as admin_b:
        wanted = {PartitionKey(str(TopicName.parse(part).base), i): skipped_on_b(bed, part)[0]
                  for i, part in enumerate(parts)}
        expected = AdminHoleCheck(admin_b)(wanted)
        assert all(expected[key].entry_count() >= 2 for key in wanted)  # markers to claim

        probe = DispatchProbe(bed.client("b"), admin_b, PROBE_SUBSCRIPTION, plugin=True)
        check = ProbeHoleCheck(probe, AdminHoleCheck(admin_b), wait_s=30.0)
        assert check(wanted) == expected
        assert probe.stats.cursor_reads == 0 and probe.plugin_reads == 1
        assert check.requests_by_kind()["plugin-cursor-read"] == 1

        # The brokers keep writing snapshot markers, which the probe's dispatch acks: the
        # plugin's answer is compared with internalStats read just before and just after
        # it, where those two agree.
        for part in parts:
            assert _same_when_still(admin_b, part), part
        check.close()


def _probe_view(stats: TopicInternalStats) -> tuple[Ledgers, Position, str]:
    cursor = stats.subscriptions[PROBE_SUBSCRIPTION]
    return (stats.ledgers, cursor.state.mark_delete,
            cursor.individually_deleted_text.replace(" ", ""))


def _same_when_still(admin: AdminClient, part: str, tries: int = 20) -> bool:
    """Whether the plugin says of ``part``'s probe what internalStats says, in the first
    of ``tries`` rounds in which internalStats read the same before and after it."""
    for _ in range(tries):
        before = _probe_view(admin.internal_stats(part))
        mine = _probe_view(cluster_cursor_stats(admin, {part: (PROBE_SUBSCRIPTION,)})[part])
        if _probe_view(admin.internal_stats(part)) == before:
            return mine == before
    raise AssertionError(f"{part}: the probe cursor never held still for three reads")


def test_a_target_without_the_plugin_has_its_probes_read_one_by_one(
        testbed: TestBed, admin_b: AdminClient, topic_name: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    (t,) = testbed.create_topic(topic_name("probe-no-plugin"))
    markers_chunks_and_messages(testbed, t, updates=True)
    runs, _ = skipped_on_b(testbed, t)
    key = PartitionKey(t, -1)
    expected = AdminHoleCheck(admin_b)({key: runs})
    probe = DispatchProbe(testbed.client("b"), admin_b, PROBE_SUBSCRIPTION, plugin=True)
    check = ProbeHoleCheck(probe, AdminHoleCheck(admin_b), wait_s=30.0)
    with caplog.at_level(logging.WARNING):
        assert check({key: runs}) == expected
    assert probe.stats.cursor_reads == 1 and probe.plugin_reads == 0
    assert "cannot be read from cursorsync's broker plugin" in caplog.text
    assert "no cursorsync plugin loaded" in caplog.text
    check.close()
