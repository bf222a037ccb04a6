"""A live workload on the three-cluster test bed, with its ground truth.

Messages are produced on all three clusters of the namespace (``a``, ``b`` and
``c``, replicated in full mesh): per topic partition and per cluster, two
unbatched producers and a batching one publish an interleaved, seeded sequence
of entries (the two-cluster workload's machinery,
:mod:`cursorsync_devtools.testbed.workload`, run once per origin). A chunked topic,
if any, gets its chunked messages from a; foreign messages (on b only) come half
way through.

Every subscription named in the spec consumes on a and acknowledges part of
everything it receives there, a's own messages and a's copies of b's and c's
alike: per entry a seeded choice of prompt, late, never or (a batch) partly, the
same for every subscription. c's messages are left unacked more often than the
others (``hole_fraction_by_origin``). The subscriptions on b exist from the start,
at the earliest position, as a DR site's would.

The topics are made so that each topic partition's first ledger has the same id on a
and on c (:func:`create_three_cluster_topics`): c's first 50 entries of a partition (c
rolls every 50 entries, a every 60) carry stamps that name entries a really holds in the
same partition, entries a may have acked while c's message itself stays unacked. Later
ledgers get ids of their own on each cluster (a also makes one per subscription cursor).
:func:`stamp_exposure` counts the messages a synchronizer that reads c's stamps as
positions on a would lose.

The ground truth records each message's origin; its ``position`` is its entry on a
(for b's and c's messages, a's copy, found by key once replication has caught up)
and ``origin_position`` its entry where it was produced. "Acked on a" means the
same for every origin: the subscription consumed a's copy. So after a failover to
b, a message a acked and b delivers is a duplicate, and one a did not ack and b
never delivers is lost, whether it came from a, b or c.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pulsar

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed.acking import Acker, Decisions, consumer_type
from cursorsync_devtools.testbed.readers import positions_by_key
from cursorsync_devtools.testbed.testbed import THIRD, TestBed, TestBedError
from cursorsync_devtools.testbed.workload import (
    Produced,
    WorkloadResult,
    WorkloadSpec,
    _plan,
    _publish_foreign,
    _Publisher,
    builtin_subscription,
)

ORIGINS = ("a", "b", THIRD)
#: The subscription type every subscription of this workload has.
KIND = "Shared"


def _base() -> WorkloadSpec:
    return WorkloadSpec(partitions=2, entries_per_partition=80, produce_seconds=6.0,
                        chunked_messages=2, foreign_per_partition=3,
                        subscription_types=(KIND,))


@dataclass(frozen=True)
class ThreeClusterSpec:
    """The shape of a run: ``base`` gives topics, batching, ack fractions and seed;
    entries and hole fractions are per origin."""

    base: WorkloadSpec = field(default_factory=_base)
    #: Entries per topic partition produced on each cluster.
    entries_per_origin: Mapping[str, int] = field(
        default_factory=lambda: {"a": 80, "b": 40, THIRD: 60})
    #: The base's hole_fraction, overridden per origin: more of c's left unacked on a.
    hole_fraction_by_origin: Mapping[str, float] = field(
        default_factory=lambda: {THIRD: 0.5})
    #: The subscriptions consumed and acked on a and present on b from the start.
    subscriptions: tuple[str, ...] = ("sync-shared",)
    #: Also a replicated subscription (Pulsar's own): with one on a topic, the brokers
    #: write snapshot markers into it, which snapshot evidence reads.
    builtin: bool = True

    def origin_spec(self, origin: str) -> WorkloadSpec:
        """The base, with the origin's entries and hole fraction."""
        return replace(self.base, entries_per_partition=self.entries_per_origin[origin],
                       hole_fraction=self.hole_fraction_by_origin.get(
                           origin, self.base.hole_fraction))

    def topics(self) -> dict[str, int]:
        return self.base.topics()

    def all_subscriptions(self) -> list[str]:
        return [*self.subscriptions, *([builtin_subscription(KIND)] if self.builtin else [])]


def create_three_cluster_topics(bed: TestBed, spec: ThreeClusterSpec) -> dict[str, Position]:
    """The spec's topics on the three clusters; per topic partition, its first ledger on a
    when c's has the same id (all of them, unless something else made a ledger on either
    cluster meanwhile).

    c's next ledger id is brought to a's first; then, one at a time, each topic partition
    is loaded on a (its first ledger), and on c (a's replicator loads it there too) before
    the next. Nothing else makes ledgers then: cursors make theirs on their first ack."""
    bed.align_ledger_ids(THIRD, "a")
    parts = [p for name, n in spec.topics().items() for p in bed.create_topic(name, n)]
    shared = {}
    for p in parts:
        first = {c: bed.internal_stats(c, p)["ledgers"][0]["ledgerId"] for c in ("a", THIRD)}
        if first["a"] == first[THIRD]:
            shared[p] = Position(first["a"], 0)
    return shared


def create_three_cluster_subscriptions(bed: TestBed, spec: ThreeClusterSpec) -> None:
    """b's subscriptions at the earliest position, before anything is produced."""
    client = bed.client("b")
    for name in spec.topics():
        for sub in spec.subscriptions:
            client.subscribe(bed.topic(name), sub, consumer_type=consumer_type(KIND),
                             initial_position=pulsar.InitialPosition.Earliest,
                             receiver_queue_size=1).close()


def run_three_cluster_workload(bed: TestBed, spec: ThreeClusterSpec | None = None
                               ) -> WorkloadResult:
    """Produce on a, b and c, consume and ack on a; the ground truth (see the module doc).

    Topics must exist (:func:`create_three_cluster_topics`). Returns once every planned
    ack has been sent, a's consumers are closed, and every cluster has sent every other
    what it holds.
    """
    spec = spec or ThreeClusterSpec()
    if tuple(bed.clusters) != ORIGINS:
        raise TestBedError(f"the three-cluster workload needs clusters {ORIGINS}; the test "
                           f"bed has {tuple(bed.clusters)}")
    base = spec.base
    rng = random.Random(base.seed)
    result = WorkloadResult(base, started_at=time.time())
    partitions = {name: bed.partitions(name) for name in spec.topics()}
    regular = [p for name, parts in partitions.items() if name != base.chunked_topic
               for p in parts]
    plans = {(o, p): _plan(rng, spec.origin_spec(o)) for o in ORIGINS for p in regular}
    decisions: Decisions = {}
    ackers = [(name, Acker(bed, bed.topic(name), sub, KIND, sub not in spec.subscriptions,
                           decisions))
              for name in spec.topics() for sub in spec.all_subscriptions()]
    publishers = {(o, p): _Publisher(bed, p, spec.origin_spec(o), decisions, cluster=o)
                  for o in ORIGINS for p in regular}
    if base.chunked_topic:
        (chunk_topic,) = partitions[base.chunked_topic]
        publishers["a", chunk_topic] = _Publisher(bed, chunk_topic, spec.origin_spec("a"),
                                                  decisions)
    for _, a in ackers:
        a.start()
    rounds = max(1, int(base.produce_seconds * 4))
    t0 = time.monotonic()
    try:
        for r in range(rounds):
            for (o, p), plan in plans.items():
                per_round = max(1, -(-len(plan) // rounds))
                for size in plan[r * per_round:(r + 1) * per_round]:
                    publishers[o, p].entry(size, rng)
            if r == rounds // 2:
                for p in regular:
                    result.foreign += _publish_foreign(bed, p, base)
                if base.chunked_topic:
                    for _ in range(base.chunked_messages):
                        publishers["a", chunk_topic].chunked(bed.service_url("a"), 1)
                        publishers["a", chunk_topic].entry(0, rng)
            time.sleep(max(0.0, t0 + (r + 1) * base.produce_seconds / rounds - time.monotonic()))
    finally:
        for pub in publishers.values():
            pub.close()
    produced = [m for pub in publishers.values() for m in pub.out]
    expected: dict[str, int] = {}
    for m in produced:
        name = TopicName.parse(m.topic).base.local
        expected[name] = expected.get(name, 0) + 1
    for name, a in ackers:
        a.finish(expected.get(name, 0), timeout_s=60 + base.delay_seconds)
        result.acked.setdefault(a.subscription, {}).update(a.acked)
    bed.wait_replicated(list(spec.topics()), origin=None)
    result.messages = _on_a(bed, produced)
    result.last_ack_at = max((t for acks in result.acked.values() for t in acks.values()),
                             default=result.started_at)
    result.finished_at = time.time()
    return result


def _on_a(bed: TestBed, produced: list[Produced]) -> list[Produced]:
    """The messages, each at its entry on a: b's and c's found there by key."""
    counts: dict[str, int] = {}
    for m in produced:
        counts[m.topic] = counts.get(m.topic, 0) + 1
    elsewhere = {m.topic for m in produced if m.origin != "a"}
    found = positions_by_key(bed, "a", {t: n for t, n in counts.items() if t in elsewhere})
    out = []
    for m in produced:
        if m.origin == "a":
            out.append(m)
        elif m.key in found:
            out.append(replace(m, position=found[m.key]))
        else:
            raise TestBedError(f"{m.topic}: {m.key}, produced on {m.origin} at "
                               f"{m.origin_position}, is not on a")
    return out


def origins_of(result: WorkloadResult) -> dict[str, int]:
    """How many messages each cluster produced (foreign ones aside)."""
    out = dict.fromkeys(ORIGINS, 0)
    for m in result.messages:
        out[m.origin] += 1
    return out


def stamp_exposure(bed: TestBed, result: WorkloadResult, subscription: str) -> int:
    """c's messages the subscription left unacked on a whose stamp (c's own position) names
    an entry a holds in the same topic partition, has acked (its cursor on a now), and that
    is not one of a's own messages: the messages b loses if c's stamps are read as
    positions on a. (A stamp naming a's own message is contradicted by that message's copy
    on b, whose stamp names the same entry; evidence that conflicts maps nothing.) Zero
    means the run cannot show that failure."""
    exposed = 0
    acked = result.acked_entries(subscription)
    for topic in result.topic_partitions():
        stats = bed.internal_stats("a", topic)
        sizes = {lg["ledgerId"]: lg["entries"] for lg in stats["ledgers"]}
        last = Position.parse(stats["lastConfirmedEntry"])
        sizes[last.ledger] = last.entry + 1
        cur = stats["cursors"][subscription]
        done = (RangeSet.parse(cur["individuallyDeletedMessages"])
                | RangeSet.up_to(Position.parse(cur["markDeletePosition"])))
        own = {m.position for m in result.messages if m.topic == topic and m.origin == "a"}
        for m in result.messages:
            stamp = m.origin_position
            if (m.topic != topic or m.origin != THIRD or stamp is None
                    or m.position in acked[topic] or stamp in own):
                continue
            exposed += stamp.entry < sizes.get(stamp.ledger, 0) and stamp in done
    return exposed
