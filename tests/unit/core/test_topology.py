"""Which evidence holds on which replication topology, and the watch that reads it.

On two clusters everything is used; with a third cluster the position stamps and the
snapshot anchors are refused by name, and whatever they mapped is left out of every plan
(an old table's rows included), so only identity's pairs are acknowledged.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey
from cursorsync.core.segments import Runs, SegmentSet, TopicMapping, evidence_mask
from cursorsync.core.topology import Topology, holding, refusals
from cursorsync.errors import AdminUnavailableError, MalformedAdminOutputError
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.replication import TopologyError, TopologyWatch
from cursorsync.sync.step import StepSettings, SyncStep
from tests.support.admin_stub import Reply, StubAdmin

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


def _target() -> CursorState:
    return CursorState(Position(9, -1), RangeSet(), Ledgers.of([(9, 10)]))


def _step(topology: Topology | None) -> SyncStep:
    return SyncStep(StepSettings(dry_run=True), None, lambda t, s: _target(),
                    topology=None if topology is None else (lambda t: topology))


def test_a_third_cluster_s_stamp_is_not_acked_beyond_two_clusters() -> None:
    """The review's case: c's message reached b as 9:1 with c's own position 40:7 as its
    stamp. Read as a position on a it lies before a's markDeletePosition 100:1, so with
    the stamps trusted 9:1 is acked though a's copy of that message (100:5) is not. With
    the topic known to have three clusters (or not known) nothing the stamps mapped is
    acked; identity's pair is."""
    key = PartitionKey(TOPIC, 0)
    rows = np.array([[100, 0, 9, 0, 1], [40, 7, 9, 1, 1], [100, 1, 9, 2, 1]], np.int64)
    stamps = evidence_mask("position-property")
    mapping = {key: TopicMapping(SegmentSet(rows, np.array([stamps] * 3, np.int8)))}
    paired = {key: TopicMapping(SegmentSet(rows[[0, 2]], np.array(
        [evidence_mask("identity")] * 2, np.int8)))}
    # a's ledger 40 holds entries too: the stamp names a real position there.
    source = CursorState(Position(100, 1), RangeSet(), Ledgers.of([(40, 10), (100, 10)]))
    obs = ObservedCursor(key, "sub", source, datetime.now(UTC))
    trusted = _step(TWO).run([obs], mapping).records[0].plan
    assert trusted.to_ack.count_entries() == 3  # what two clusters would allow
    for topology in (THREE, None):
        step = _step(THREE) if topology is THREE else SyncStep(
            StepSettings(dry_run=True), None, lambda t, s: _target(), topology=lambda t: None)
        assert step.run([obs], mapping).records[0].plan.to_ack.count_entries() == 0
        plan = (_step(THREE) if topology is THREE else step).run([obs], paired).records[0].plan
        assert plan.to_ack == RangeSet.entries(np.array([9, 9]), np.array([0, 2]),
                                               np.array([1, 1]))
    # No topology at all (a step of its own, a benchmark): every mapping counts.
    assert _step(None).run([obs], mapping).records[0].plan.to_ack.count_entries() == 3


def test_a_third_cluster_s_copy_is_not_acked_by_an_anchor() -> None:
    """The review's third case: b's entry 9:1 came from c, and a's copy of it shows the
    same digest, so it is an unpaired copy; an anchor (S 100:3 on a, T 9:2 on b) acks
    every copy up to 9:2 once a's markDeletePosition passes S. For c's message that does
    not follow: with three clusters the anchor acks nothing."""
    key = PartitionKey(TOPIC, 0)
    mapping = {key: TopicMapping(unpaired=Runs.of((9, 0, 3)),
                                 anchors=Anchors(np.array([[100, 3, 9, 2]], np.int64)))}
    source = CursorState(Position(100, 3), RangeSet(), Ledgers.of([(100, 10)]))
    obs = ObservedCursor(key, "sub", source, datetime.now(UTC))
    assert _step(TWO).run([obs], mapping).records[0].plan.to_ack.count_entries() == 3
    assert _step(THREE).run([obs], mapping).records[0].plan.to_ack.count_entries() == 0


@pytest.fixture
def stubs() -> tuple[StubAdmin, StubAdmin]:
    a, b = StubAdmin(), StubAdmin()
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


def _admin(stub: StubAdmin, name: str) -> AdminClient:
    return AdminClient(AdminSettings((stub.url,), cluster=name, attempts=1, timeout_s=2.0))


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


class _Rows:
    """What foreachBatch hands the sink: a DataFrame, here only its Arrow table."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:  # pyspark's name
        return self.table


def test_the_mapping_sink_refuses_a_batch_once_the_topic_has_a_third_cluster(
        stubs: tuple[StubAdmin, StubAdmin], tmp_path: Path) -> None:
    """A topic whose replication grew a third cluster under the running job: the mapping
    query's next batch maps nothing of it (the job stops with the refusal)."""
    from cursorsync.app.queries import builder_config
    from cursorsync.app.settings import parse_config
    from cursorsync.mapping.entries_rows import pack_batches
    from cursorsync.mapping.sink import MappingSink
    from cursorsync.tables import open_store

    a, b = stubs
    a.routes[APPLIED] = [Reply(body=["a", "b"])]
    b.routes[APPLIED] = [Reply(body=["a", "b"])]
    now = [0.0]
    watch = TopologyWatch(_admin(a, "a"), _admin(b, "b"), "a", "b", ["position-property"],
                          interval_s=60, clock=lambda: now[0])
    config = parse_config({
        "clusters": {"source": {"name": "a", "service_url": "pulsar://h:6650",
                                "admin_url": a.url},
                     "target": {"name": "b", "service_url": "pulsar://h:6651",
                                "admin_url": b.url}},
        "topics": [{"topic": TOPIC, "subscriptions": ["billing"]}],
        "evidence": {"strategies": ["position-property"], "holes": "unacked"},
        "tables": {"path": str(tmp_path / "tables")},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")}})
    store = open_store("delta-rs", str(tmp_path / "tables"))
    store.ensure_all()

    def batch(first: int) -> _Rows:
        n = 2
        entries = [first, first + 1]
        rows = pa.RecordBatch.from_pydict({
            "cluster": ["b"] * n, "topic": [TOPIC] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "ledger": pa.array([9] * n, pa.int64()), "entry": pa.array(entries, pa.int64()),
            "batch_index": pa.array([-1] * n, pa.int32()),
            "batch_size": pa.array([1] * n, pa.int32()),
            "producer_name": pa.array([None] * n, pa.string()),
            "publish_time": pa.array([None] * n, pa.int64()),
            "source_position": pa.array([f"40:{e}" for e in entries], pa.string()),
            "entry_identity": pa.array([None] * n, pa.binary()),
            "first_chunk": pa.array([None] * n, pa.string())})
        return _Rows(pa.Table.from_batches(list(pack_batches(iter([rows]), "b"))))

    sink = MappingSink(builder_config(config), store, tmp_path / "state", None, topology=watch)
    sink(batch(0), 0)
    written = store.read("mappings").num_rows
    assert written > 0
    b.routes[APPLIED] = [Reply(body=["a", "b", "c"])]
    now[0] = 61
    with pytest.raises(TopologyError, match=f"topic {TOPIC} is replicated among a, b, c"):
        sink(batch(2), 1)
    assert store.read("mappings").num_rows == written
