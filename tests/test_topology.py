"""Which evidence holds on which replication topology, and the watch that reads it.

On two clusters everything is used; with a third cluster the position stamps and the
snapshot anchors are refused by name, and whatever they mapped is left out of every plan
(an old table's rows included), so only identity's pairs are acknowledged.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from admin_stub import Reply, StubAdmin
from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.mapping import Runs, SegmentSet, TopicMapping, evidence_mask
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.topology import Topology, holding, refusals
from cursorsync.errors import AdminUnavailableError, MalformedAdminOutputError
from cursorsync.pulsar.admin import AdminClient, AdminConfig
from cursorsync.pulsar.replication import TopologyError, TopologyWatch
from cursorsync.sync.step import SyncConfig, SyncStep

TOPIC = "persistent://t/n/orders"
TWO = Topology(TOPIC, "a", "b", frozenset({"a", "b"}))
THREE = Topology(TOPIC, "a", "b", frozenset({"a", "b", "c"}))


def test_two_clusters_refuse_nothing_and_three_refuse_stamps_and_anchors() -> None:
    assert TWO.refused(["position-property", "identity", "snapshot"]) == []
    lines = THREE.refused(["position-property", "identity", "snapshot"])
    assert len(lines) == 2
    assert lines[0].startswith(
        f"topic {TOPIC} is replicated among a, b, c: evidence position-property does not hold "
        "there (b's copies of c's messages carry c's own ledger:entry as the stamp, not a "
        "position on a); use evidence.strategies: [identity]")
    assert "evidence snapshot does not hold there" in lines[1]
    assert THREE.refused(["identity"]) == []
    assert refusals([TWO, THREE], ["snapshot"]) == THREE.refused(["snapshot"])
    assert THREE.others == ("c",) and not THREE.two_clusters


def test_holding_keeps_only_identity_segments_markers_and_foreign() -> None:
    rows = np.array([[1, 0, 9, 0, 2], [1, 2, 9, 2, 2], [1, 4, 9, 4, 2]], np.int64)
    ev = np.array([evidence_mask("position-property"), evidence_mask("identity"),
                   evidence_mask("identity,position-property")], np.int8)
    mapping = TopicMapping(SegmentSet(rows, ev), skippable=Runs.of((9, 6, 1)),
                           foreign=Runs.of((9, 7, 1)), unpaired=Runs.of((9, 8, 1)),
                           anchors=Anchors(np.array([[1, 5, 9, 8]], np.int64)))
    kept = holding(mapping)
    assert [str(s) for s in kept.segments] == ["1:2+2->9:2 (identity)"]
    assert kept.skippable == mapping.skippable and kept.foreign == mapping.foreign
    assert not len(kept.unpaired) and not len(kept.anchors)
    identity_only = TopicMapping(SegmentSet(rows[1:2], ev[1:2]))
    assert holding(identity_only) is identity_only


def _step(topology: Topology | None) -> SyncStep:
    target = CursorState(Position(9, -1), RangeSet(), Ledgers.of([(9, 10)]))
    return SyncStep(SyncConfig(dry_run=True), None, lambda t, s: target,
                    topology=None if topology is None else (lambda t: topology))


def test_a_plan_beyond_two_clusters_acks_only_what_identity_mapped() -> None:
    """The stamp of c's message 40:7 names a position on a: with three clusters what it
    mapped is not acknowledged, though a acked 1:1; identity's pair is."""
    key = PartitionKey(TOPIC, 0)
    rows = np.array([[1, 0, 9, 0, 1], [1, 1, 9, 1, 1]], np.int64)
    ev = np.array([evidence_mask("identity"), evidence_mask("position-property")], np.int8)
    mapping = {key: TopicMapping(SegmentSet(rows, ev))}
    source = CursorState(Position(1, 1), RangeSet(), Ledgers.of([(1, 5)]))
    obs = ObservedCursor(key, "sub", source, datetime.now(UTC))
    for topology, acked in ((TWO, 2), (THREE, 1), (None, 1)):
        step = _step(topology) if topology is not None else SyncStep(
            SyncConfig(dry_run=True), None,
            lambda t, s: CursorState(Position(9, -1), RangeSet(), Ledgers.of([(9, 10)])),
            topology=lambda t: None)  # not known: as beyond two clusters
        plan = step.run([obs], mapping).records[0].plan
        assert plan.to_ack.count_entries() == acked, topology
    # No topology at all (a step of its own, a benchmark): every mapping counts.
    assert _step(None).run([obs], mapping).records[0].plan.to_ack.count_entries() == 2


@pytest.fixture
def stubs() -> tuple[StubAdmin, StubAdmin]:
    a, b = StubAdmin(), StubAdmin()
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


def _admin(stub: StubAdmin, name: str) -> AdminClient:
    return AdminClient(AdminConfig((stub.url,), cluster=name, attempts=1, timeout_s=2.0))


APPLIED = "/admin/v2/persistent/t/n/orders/replication?applied=true"
NAMESPACE = "/admin/v2/namespaces/t/n/replication"


def test_the_watch_reads_both_clusters_and_again_once_stale(
        stubs: tuple[StubAdmin, StubAdmin]) -> None:
    a, b = stubs
    a.routes[APPLIED] = [Reply(body=["a", "b"])]
    b.routes[APPLIED] = [Reply(body=["a", "b"])]
    now = [0.0]
    watch = TopologyWatch(_admin(a, "a"), _admin(b, "b"), "a", "b", ["position-property"],
                          interval_s=60, clock=lambda: now[0])
    assert watch.check([TOPIC + "-partition-3", TOPIC]) == [TWO]
    asked = len(a.requests)
    now[0] = 59
    watch.check([TOPIC])
    assert len(a.requests) == asked  # still fresh
    # b now replicates to c too: the next read, a minute on, refuses the stamps.
    b.routes[APPLIED] = [Reply(body=["a", "b", "c"])]
    now[0] = 61
    with pytest.raises(TopologyError, match=r"replicated among a, b, c: evidence "
                                            r"position-property does not hold"):
        watch.check([TOPIC])


def test_topic_policies_off_read_the_namespace_and_bad_answers_are_named(
        stubs: tuple[StubAdmin, StubAdmin]) -> None:
    a, b = stubs
    a.routes[APPLIED] = [Reply(405, {"reason": "Topic level policies is disabled"})]
    a.routes[NAMESPACE] = [Reply(body=["a", "b", "c"])]
    b.routes[APPLIED] = [Reply(body={"clusters": "a"})]
    assert _admin(a, "a").replication_clusters(TOPIC) == frozenset({"a", "b", "c"})
    with pytest.raises(MalformedAdminOutputError,
                       match="replication clusters of persistent://t/n/orders"):
        _admin(b, "b").replication_clusters(TOPIC)


def test_a_failed_read_keeps_what_was_known_and_unknown_is_not_two_clusters(
        stubs: tuple[StubAdmin, StubAdmin]) -> None:
    a, b = stubs
    a.routes[APPLIED] = [Reply(body=["a", "b"])]
    b.routes[APPLIED] = [Reply(body=["a", "b"])]
    now = [0.0]
    watch = TopologyWatch(_admin(a, "a"), _admin(b, "b"), "a", "b", ["identity"],
                          interval_s=1, clock=lambda: now[0])
    assert watch.current(TOPIC) == TWO
    a.stop()
    now[0] = 5
    assert watch.current(TOPIC) == TWO  # the last one known stands
    fresh = TopologyWatch(_admin(a, "a"), _admin(b, "b"), "a", "b", ["identity"])
    assert fresh.current(TOPIC) is None
    with pytest.raises(AdminUnavailableError):
        fresh.topology(TOPIC)
