"""The ack emitter without brokers: plans only the guard makes, acks by id and cumulative,
refusals named (exact plans driven onto real brokers: tests/integration/pulsar/test_emitter.py).

Plans come from cursorsync.core.translate over a TopicMapping whose single segment
maps a fake source ledger (900) one to one onto the target topic's entries, so
a source cursor picks exactly which target entries are acked.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.guard import SafePlan, UnsafePlanError, guard
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.core.translate import translate
from cursorsync.errors import ConfigError, TopicNotFoundError
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.emitter import (
    EmitResult,
    Emitter,
    EmitTopicNotFoundError,
    PulsarEmitter,
    SubscriptionBusyError,
    TargetUnreachableError,
)
from tests.support.emitter_plans import SRC, _plan

pulsar = pytest.importorskip("pulsar")


# ------------------------------------------------------------------ pure: no broker


class _FakeConsumer:
    def __init__(self) -> None:
        self.acks: list[tuple[int, int, int, int]] = []
        self.cumulative: list[tuple[int, int, int, int]] = []

    @staticmethod
    def _t(mid: Any) -> tuple[int, int, int, int]:
        return (mid.partition(), mid.ledger_id(), mid.entry_id(), mid.batch_index())

    def acknowledge(self, mid: Any) -> None:
        self.acks.append(self._t(mid))

    def acknowledge_cumulative(self, mid: Any) -> None:
        self.cumulative.append(self._t(mid))

    def is_connected(self) -> bool:
        return True

    def close(self) -> None:
        pass


class _FakeClient:
    """Stands in for pulsar.Client: records subscribe() arguments, hands out fake consumers."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.subscribed: list[tuple[str, str, dict[str, Any]]] = []
        self.consumers: list[_FakeConsumer] = []
        self.fail = fail

    def get_topic_partitions(self, topic: str) -> list[str]:
        if topic.endswith("/parted"):
            return [f"{topic}-partition-{i}" for i in range(2)]
        return [topic]

    def subscribe(self, topic: str, subscription: str, **kwargs: Any) -> _FakeConsumer:
        if self.fail is not None:
            raise self.fail
        self.subscribed.append((topic, subscription, kwargs))
        self.consumers.append(_FakeConsumer())
        return self.consumers[-1]


def test_by_id_acks_whole_entries_with_the_partition_index() -> None:
    client = _FakeClient()
    em: Emitter = PulsarEmitter("pulsar://unused:6650", client=client, ack_batch_size=2)
    safe, _ = _plan(7, 10, 2, "[(900:4..900:6],(900:8..900:9]]")
    res = em.apply("persistent://public/default/t-partition-3", "s", safe, cumulative=False)
    assert res == EmitResult(acks_sent=6, cumulative_to=None, individual_entries=6)
    assert client.consumers[0].acks == [(3, 7, e, -1) for e in (0, 1, 2, 5, 6, 9)]
    topic, sub, kwargs = client.subscribed[0]
    assert (topic, sub) == ("persistent://public/default/t-partition-3", "s")
    assert kwargs["receiver_queue_size"] == 0
    # A missing target subscription must be created acking nothing: Earliest, never Latest.
    assert kwargs["initial_position"] == pulsar.InitialPosition.Earliest
    # A non-partitioned topic: partition -1. The consumer is reused across calls.
    em.apply("t", "s", safe, cumulative=False)
    em.apply("persistent://public/default/t", "s", safe, cumulative=False)
    assert len(client.consumers) == 2
    assert {a[0] for a in client.consumers[1].acks} == {-1}
    em.close()


#: Source 900:0..900:2 -> 7:0..7:2 and 900:3..900:4 -> 9:0..9:1 (ledger 8 absent), all acked.
SPANNING = TopicMapping(SegmentSet.of([Segment(SRC, 0, 7, 0, 3), Segment(SRC, 3, 9, 0, 2)]))
SPANNING_SOURCE = CursorState.parse(f"{SRC}:4", "[]", Ledgers.of([(SRC, 5)]))
SPANNING_LEDGERS = Ledgers.of([(7, 3), (9, 2)])


def _spanning(to_ack: str, md: str, *, target_md: str = "7:0") -> SafePlan:
    """A hand-made plan over the two target ledgers, through the guard against the real
    mapping and cursors (translate cuts ranges at ledger ends; target stats may not)."""
    plan = AckPlan(Position.parse(md), RangeSet(), RangeSet.parse(to_ack), Position(7, 0),
                   0, 0, 0, 0, "exact")
    target = CursorState(Position.parse(target_md), RangeSet(), SPANNING_LEDGERS)
    return guard(plan, SPANNING_SOURCE, SPANNING, target)


def test_a_safe_plan_comes_only_from_the_guard() -> None:
    safe, _ = _plan(7, 10, 4, "[(900:6..900:8]]")
    with pytest.raises(TypeError, match="only from"):
        SafePlan(safe.plan)


def test_by_id_cumulative_and_spanning_ranges() -> None:
    client = _FakeClient()
    em = PulsarEmitter("pulsar://unused:6650", client=client, subscription_type="Failover")
    safe, _ = _plan(7, 10, 4, "[(900:6..900:8]]")
    res = em.apply("t-partition-0", "s", safe, cumulative=True)
    assert res == EmitResult(3, Position(7, 4), 2)
    assert client.consumers[0].cumulative == [(0, 7, 4, -1)]
    assert client.consumers[0].acks == [(0, 7, 7, -1), (0, 7, 8, -1)]
    # A range across ledgers needs the ledger list; with it, only existing entries are acked.
    # The guard checks to_ack in position space: the target shows ledger 7 done (its
    # markDeletePosition at 9:-1, where a broker moves it past a rollover), so what lies
    # between the ledgers is settled.
    spanning = _spanning("[(7:0..9:1]]", "9:1", target_md="9:-1")
    with pytest.raises(ValueError, match="spans ledgers"):
        em.apply("t2", "s", spanning, cumulative=False)
    em.apply("t3", "s", spanning, cumulative=False, ledgers=SPANNING_LEDGERS)
    assert [a[1:3] for a in client.consumers[-1].acks] == [(7, 1), (7, 2), (9, 0), (9, 1)]
    # A markDelete at L:-1 is acked cumulatively on the last entry before it, when known.
    at_start = _spanning("[(7:0..9:1]]", "9:-1", target_md="9:-1")
    assert em.apply("t4", "s", at_start, cumulative=True,
                    ledgers=SPANNING_LEDGERS).cumulative_to == Position(7, 2)
    # Without the ledger list there is no entry to name: everything goes individually.
    single = _spanning("[(7:0..7:2]]", "9:-1")
    res = em.apply("t5", "s", single, cumulative=True)
    assert res == EmitResult(2, None, 2)
    # Across the ledgers from a target that has not acked ledger 7: refused, nothing sent.
    with pytest.raises(UnsafePlanError, match=r"\(7:2\.\.9:-1\]"):
        _spanning("[(7:0..9:1]]", "9:1")


def test_an_unsafe_plan_is_refused_before_the_emitter_sees_it() -> None:
    """Source 900:0..900:4 acked, 900:5 not: a plan that also acks 7:5 (or whose
    markDeletePosition crosses it) never becomes a SafePlan, so nothing is subscribed or
    acked; the honest plan goes through the same path."""
    client = _FakeClient()
    em = PulsarEmitter("pulsar://unused:6650", client=client, subscription_type="Failover")
    mapping = TopicMapping(SegmentSet.of([Segment(SRC, 0, 7, 0, 10)]))
    source = CursorState.parse(f"{SRC}:4", "[(900:5..900:7]]", Ledgers.of([(SRC, 10)]))
    target = CursorState(Position(7, -1), RangeSet(), Ledgers.of([(7, 10)]))
    honest = translate(source, mapping, target)
    too_many = replace(honest, to_ack=honest.to_ack | RangeSet.parse("[(7:4..7:5]]"))
    too_far = replace(honest, mark_delete=Position(7, 7))
    for plan in (too_many, too_far):
        with pytest.raises(UnsafePlanError, match=r"\(7:4\.\.7:5\]"):
            em.apply("t", "s", guard(plan, source, mapping, target), cumulative=True)
    assert client.subscribed == [] and client.consumers == []
    res = em.apply("t", "s", guard(honest, source, mapping, target), cumulative=True)
    assert res == EmitResult(3, Position(7, 4), 2)
    assert client.consumers[0].cumulative == [(-1, 7, 4, -1)]
    assert client.consumers[0].acks == [(-1, 7, 6, -1), (-1, 7, 7, -1)]


def test_the_emitter_takes_only_what_the_guard_made() -> None:
    """Not a bare plan, not a SafePlan made around the guard, not a replace()d one, not one
    whose plan changed after the guard passed it."""
    client = _FakeClient()
    em = PulsarEmitter("pulsar://unused:6650", client=client)
    safe, _ = _plan(7, 10, 4)
    with pytest.raises(TypeError, match="dataclass"):
        replace(safe, plan=replace(safe.plan, mark_delete=Position(7, 9)))  # type: ignore[type-var]
    forged = object.__new__(SafePlan)
    with pytest.raises(TypeError, match="not made by"):
        em.apply("t", "s", forged, cumulative=False)
    changed, _ = _plan(7, 10, 4)
    object.__setattr__(changed.plan, "to_ack", RangeSet.parse("[(7:-1..7:9]]"))
    with pytest.raises(TypeError, match="changed after the guard"):
        em.apply("t", "s", changed, cumulative=False)
    assert client.subscribed == []
    assert em.apply("t", "s", safe, cumulative=False).acks_sent == 5


def test_rejects_bare_plans_and_cumulative_on_shared() -> None:
    client = _FakeClient()
    em = PulsarEmitter("pulsar://unused:6650", client=client)
    safe, _ = _plan(7, 10, 4)
    bare: AckPlan = safe.plan
    with pytest.raises(TypeError, match="SafePlan"):
        em.apply("t", "s", bare, cumulative=False)  # type: ignore[arg-type]
    for kind in ("Shared", "Key_Shared"):
        em = PulsarEmitter("pulsar://unused:6650", client=client, subscription_type=kind)
        with pytest.raises(ValueError, match=f"subscription_type is {kind}"):
            em.apply("t", "s", safe, cumulative=True)
    assert client.subscribed == []  # nothing was even subscribed
    with pytest.raises(ConfigError, match="Valid values are: Exclusive"):
        PulsarEmitter("pulsar://x:1", client=client, subscription_type="Sh")  # type: ignore[arg-type]


def test_partitioned_parent_is_refused() -> None:
    em = PulsarEmitter("pulsar://unused:6650", client=_FakeClient())
    safe, _ = _plan(7, 10, 4)
    with pytest.raises(ConfigError, match="parted-partition-0"):
        em.apply("parted", "s", safe, cumulative=False)


def test_empty_plan_sends_nothing_and_subscribes_nothing() -> None:
    client = _FakeClient()
    em = PulsarEmitter("pulsar://unused:6650", client=client)
    _, after = _plan(7, 10, 4)
    again, _ = _plan(7, 10, 4, target=after)
    assert em.apply("t", "s", again, cumulative=False) == EmitResult(0, None, 0)
    assert client.subscribed == []


def test_broker_refusals_become_errors_naming_what_to_fix() -> None:
    safe, _ = _plan(7, 10, 4)
    busy = PulsarEmitter("pulsar://b:6650", subscription_type="Exclusive",
                         client=_FakeClient(pulsar.ConsumerBusy("Exclusive consumer is already "
                                                                "connected")))
    with pytest.raises(SubscriptionBusyError) as err:
        busy.apply("orders-partition-1", "app", safe, cumulative=True)
    msg = str(err.value)
    assert "persistent://public/default/orders-partition-1 subscription 'app'" in msg
    assert "pulsar://b:6650" in msg and "must be stopped" in msg
    gone = PulsarEmitter("pulsar://b:6650", client=_FakeClient(pulsar.TopicNotFound("x")))
    with pytest.raises(EmitTopicNotFoundError, match="orders-partition-1 does not exist") as e2:
        gone.apply("orders-partition-1", "app", safe, cumulative=False)
    assert isinstance(e2.value, TopicNotFoundError)


def test_unreachable_cluster_is_named() -> None:
    from cursorsync_devtools.testbed.standalone import free_port

    url = f"pulsar://127.0.0.1:{free_port()}"
    em = PulsarEmitter(ClientSettings(url, operation_timeout_s=1, connection_timeout_ms=300))
    safe, _ = _plan(7, 10, 4)
    t0 = time.monotonic()
    with pytest.raises(TargetUnreachableError, match=url.replace(".", r"\.")):
        em.apply("t", "s", safe, cumulative=False)
    assert time.monotonic() - t0 < 10
    em.close()
