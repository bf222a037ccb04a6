"""A deterministic (given a seed) workload on the sandbox, with its ground truth.

On the source cluster: per topic partition, a non-batching producer and a
batching producer (batches of chosen sizes, closed with ``flush()``) publish
an interleaved, seeded sequence of entries, to a partitioned topic (its
``<t>-partition-<i>``) and a non-partitioned one. Recording consumers
(Shared) receive everything and acknowledge in a shuffled order, leaving
holes (messages never acked during the run) and some partially acked
batches (which the broker counts as unacked entries). On the target cluster,
foreign producers publish messages that do not come from the source, half
way through, so they interleave with replicated entries.

What is deterministic: which messages exist, their keys, properties, batch
composition, order per partition, and which get acked. What is not: ledger
ids (broker-assigned), timing, and where foreign entries land among
replicated ones on the target.
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cursorsync.positions import MessageId, Position
from cursorsync.sandbox.state import split_partition

if TYPE_CHECKING:
    from cursorsync.sandbox.sandbox import Sandbox


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape of the workload. Topics must be configured in the Sandbox with these partitions."""

    partitioned_topic: str = "orders"
    partitions: int = 3
    plain_topic: str = "audit"
    entries_per_partition: int = 30
    batch_sizes: tuple[int, ...] = (2, 3, 5)
    batched_fraction: float = 0.4
    subscription: str = "app"
    hole_fraction: float = 0.1
    partial_batch_fraction: float = 0.2
    foreign_per_partition: int = 3
    seed: int = 7

    @property
    def topics(self) -> dict[str, int]:
        """The SandboxConfig.topics this workload needs."""
        return {self.partitioned_topic: self.partitions, self.plain_topic: 0}


@dataclass(frozen=True)
class ProducedMessage:
    """One message as published: where it landed and what identifies it."""

    cluster: str
    topic: str  # the topic partition
    message_id: MessageId  # partition index from the topic name; batch_index -1 if unbatched
    key: str
    producer_name: str
    batch_size: int  # 0: non-batched

    @property
    def position(self) -> Position:
        return self.message_id.position


@dataclass
class WorkloadResult:
    """Ground truth of one run."""

    spec: WorkloadSpec
    messages: list[ProducedMessage] = field(default_factory=list)
    foreign: list[ProducedMessage] = field(default_factory=list)
    acked_at: dict[tuple[str, str], float] = field(default_factory=dict)  # (topic, key) -> time
    holes: set[tuple[str, str]] = field(default_factory=set)  # (topic, key) never acked

    def topics(self) -> list[str]:
        return sorted({m.topic for m in self.messages})

    def messages_of(self, topic: str) -> list[ProducedMessage]:
        return [m for m in self.messages if m.topic == topic]

    def acked_entries(self, topic: str) -> set[Position]:
        """Entries whose every message was acked on the source (what the broker counts)."""
        by_entry: dict[Position, list[ProducedMessage]] = {}
        for m in self.messages_of(topic):
            by_entry.setdefault(m.position, []).append(m)
        return {
            pos
            for pos, ms in by_entry.items()
            if all((topic, m.key) in self.acked_at for m in ms)
        }

    def unacked_entries(self, topic: str) -> set[Position]:
        return {m.position for m in self.messages_of(topic)} - self.acked_entries(topic)


def run_workload(sandbox: Sandbox, spec: WorkloadSpec | None = None) -> WorkloadResult:
    """Produce on A (and foreign messages on B), consume and ack on A; returns ground truth."""
    spec = spec or WorkloadSpec()
    rng = random.Random(spec.seed)
    result = WorkloadResult(spec)
    source, target = sandbox.source, sandbox.target
    client_a = sandbox.client(source)
    client_b = sandbox.client(target)
    topics = sandbox.partitions(spec.partitioned_topic) + sandbox.partitions(spec.plain_topic)
    for topic in topics:
        plan = _plan(rng, spec)
        half = len(plan) // 2
        _publish(client_a, source, topic, plan[:half], result, result.messages)
        _publish_foreign(client_b, target, topic, spec, result)
        _publish(client_a, source, topic, plan[half:], result, result.messages)
    for topic in topics:
        _consume_and_ack(sandbox, source, topic, spec, rng, result)
    return result


def _plan(rng: random.Random, spec: WorkloadSpec) -> list[int]:
    """Entry sizes in order: 0 = one non-batched message, k = a batch of k."""
    return [
        rng.choice(spec.batch_sizes) if rng.random() < spec.batched_fraction else 0
        for _ in range(spec.entries_per_partition)
    ]


def _message_fields(topic: str, n: int, producer: str) -> tuple[str, bytes, dict[str, str], str]:
    local = topic.rsplit("/", 1)[-1]
    key = f"{local}/{n}"
    payload = json.dumps({"key": key, "n": n}).encode()
    props = {"key": key, "n": str(n), "producer": producer}
    return key, payload, props, f"pk-{n % 4}"


def _publish(
    client: Any,
    cluster: str,
    topic: str,
    plan: list[int],
    result: WorkloadResult,
    into: list[ProducedMessage],
) -> None:
    _, partition = split_partition(topic)
    local = topic.rsplit("/", 1)[-1]
    single = client.create_producer(topic, producer_name=f"wl-{local}-single")
    batching = client.create_producer(
        topic,
        producer_name=f"wl-{local}-batch",
        batching_enabled=True,
        batching_max_messages=10_000,
        batching_max_publish_delay_ms=24 * 3600 * 1000,
        batching_max_allowed_size_in_bytes=1 << 30,
    )
    n = sum(1 for m in into if m.topic == topic)
    try:
        for size in plan:
            if size == 0:
                key, payload, props, pk = _message_fields(topic, n, single.producer_name())
                mid = single.send(
                    payload, properties=props, partition_key=pk, event_timestamp=10**12 + n
                )
                into.append(
                    ProducedMessage(
                        cluster, topic, _mid(mid, partition), key, single.producer_name(), 0
                    )
                )
                n += 1
                continue
            ids: list[Any] = [None] * size
            done = threading.Semaphore(0)
            keys = []
            for i in range(size):
                key, payload, props, pk = _message_fields(topic, n, batching.producer_name())
                keys.append(key)

                def cb(
                    res: Any,
                    msg_id: Any,
                    i: int = i,
                    ids: list[Any] = ids,
                    done: threading.Semaphore = done,
                ) -> None:
                    ids[i] = msg_id
                    done.release()

                batching.send_async(
                    payload, cb, properties=props, ordering_key=pk, event_timestamp=10**12 + n
                )
                n += 1
            batching.flush()
            for _ in range(size):
                if not done.acquire(timeout=30):
                    raise TimeoutError(f"batch send to {topic} was not confirmed in 30 s")
            for key, mid in zip(keys, ids, strict=True):
                into.append(
                    ProducedMessage(
                        cluster, topic, _mid(mid, partition), key, batching.producer_name(), size
                    )
                )
    finally:
        single.close()
        batching.close()


def _publish_foreign(
    client: Any, cluster: str, topic: str, spec: WorkloadSpec, result: WorkloadResult
) -> None:
    _, partition = split_partition(topic)
    producer = client.create_producer(topic, producer_name=f"foreign-{cluster}")
    try:
        for i in range(spec.foreign_per_partition):
            local = topic.rsplit("/", 1)[-1]
            key = f"{local}/foreign-{i}"
            mid = producer.send(
                json.dumps({"key": key}).encode(), properties={"key": key, "origin": cluster}
            )
            result.foreign.append(
                ProducedMessage(cluster, topic, _mid(mid, partition), key, f"foreign-{cluster}", 0)
            )
    finally:
        producer.close()


def _consume_and_ack(
    sandbox: Sandbox,
    cluster: str,
    topic: str,
    spec: WorkloadSpec,
    rng: random.Random,
    result: WorkloadResult,
) -> None:
    import pulsar

    expected = result.messages_of(topic)
    consumer = sandbox.subscribe(
        cluster,
        topic,
        spec.subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    try:
        received = []
        for _ in expected:
            received.append(consumer.receive(10_000))
        keys = {json.loads(m.data())["key"]: m for m in received}
        by_entry: dict[Position, list[str]] = {}
        for m in expected:
            by_entry.setdefault(m.position, []).append(m.key)
        to_ack: list[str] = []
        for pos in sorted(by_entry):
            ks = by_entry[pos]
            r = rng.random()
            if r < spec.hole_fraction:
                result.holes.update((topic, k) for k in ks)
            elif len(ks) > 1 and r < spec.hole_fraction + spec.partial_batch_fraction:
                keep = rng.randrange(1, len(ks))
                to_ack.extend(ks[:keep])
                result.holes.update((topic, k) for k in ks[keep:])
            else:
                to_ack.extend(ks)
        rng.shuffle(to_ack)
        for key in to_ack:
            result.acked_at[(topic, key)] = consumer.acknowledge(keys[key]).at
    finally:
        consumer.close()


def _mid(msg_id: Any, partition: int) -> MessageId:
    return MessageId(msg_id.ledger_id(), msg_id.entry_id(), partition, msg_id.batch_index())
