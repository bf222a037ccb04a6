"""A live workload on the test bed, with its ground truth.

On cluster a, for each topic partition: two unbatched producers and a batching
producer (batches of chosen sizes) publish an interleaved, seeded sequence of
entries over ``produce_seconds``, with keys and properties; some messages are
delayed (``deliver_after``), and one topic carries chunked messages. On b,
foreign messages (``disable_replication``: they exist on b only) are produced
half way through.

Subscriptions on a come in pairs, one per subscription type: ``sync-<type>``
(what cursorsync carries to b) and ``builtin-<type>`` (created with
``replicate_subscription_state_enabled``: what Pulsar's own replicated
subscriptions carry to b). Both receive everything and acknowledge the same
messages with the same delays: per entry, a seeded choice of prompt, late
(out of order), never (a long-lived hole) or, for a batch, part of its
messages only (a partially acked batch, which the broker counts as unacked).

What is deterministic for a seed: which messages exist, their keys, batch
composition and order per partition, and which are acked. What is not:
ledger ids, timing, and where foreign entries and markers land on b.

After the run, the ground truth is checked against a's own cursors: every
entry whose messages were all acked is acked in a's internalStats, and no
other entry is (``verify_source_cursors``).
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pulsar

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed.acking import AckChoice, Acker, Decisions, consumer_type
from cursorsync_devtools.testbed.testbed import TestBed, TestBedError

SUBSCRIPTION_TYPES = ("Shared", "Failover")
#: How long a workload producer's send may wait: with 1,000 partitions the two brokers share
#: two cores with the job, and a send can wait longer than the client's default 30 s.
SEND_TIMEOUT_MS = 120_000


def sync_subscription(kind: str) -> str:
    return f"sync-{kind.lower()}"


def builtin_subscription(kind: str) -> str:
    return f"builtin-{kind.lower()}"


@dataclass(frozen=True)
class WorkloadSpec:
    """The shape of a run. Topic names are local names in the test bed's namespace."""

    partitioned_topic: str = "orders"
    partitions: int = 3
    plain_topic: str = "audit"
    #: A plain topic whose producer chunks (messages of ``chunk_message_bytes`` over the
    #: brokers' max message size); None: no chunked topic.
    chunked_topic: str | None = "blobs"
    chunked_messages: int = 6
    chunk_message_bytes: int = 600 * 1024
    entries_per_partition: int = 150
    produce_seconds: float = 8.0
    batch_sizes: tuple[int, ...] = (2, 3, 5)
    batched_fraction: float = 0.35
    #: Share of entries acked late (1 - 4 s after receipt, so out of order) ...
    late_fraction: float = 0.15
    #: ... never acked (holes for good) ...
    hole_fraction: float = 0.08
    #: ... and, among batches, acked in part only.
    partial_batch_fraction: float = 0.15
    #: Share of unbatched messages sent with ``deliver_after`` (Shared subscriptions hold
    #: them back: acked later than the messages around them).
    delayed_fraction: float = 0.05
    delay_seconds: float = 3.0
    foreign_per_partition: int = 4
    subscription_types: tuple[str, ...] = SUBSCRIPTION_TYPES
    #: Also run the ``builtin-<type>`` twin of each subscription.
    builtin: bool = True
    #: a's consumers acknowledge by batch index (``batch_index_ack_enabled``); the brokers
    #: keep such acks only with ``acknowledgmentAtBatchIndexLevelEnabled`` on (off in 4.0).
    batch_index_acks: bool = False
    #: The publishers of this many partitions share one pulsar client on a. A client holds
    #: a handful of descriptors (its connection, event and timer fds): at 5,000 partitions,
    #: a client each passes the 20,000 this machine allows a process.
    partitions_per_client: int = 1
    seed: int = 7

    def topics(self) -> dict[str, int]:
        """Local topic name -> partitions (0: not partitioned)."""
        out = {self.partitioned_topic: self.partitions, self.plain_topic: 0}
        if self.chunked_topic:
            out[self.chunked_topic] = 0
        return out

    def subscriptions(self) -> list[str]:
        subs = [sync_subscription(k) for k in self.subscription_types]
        if self.builtin:
            subs += [builtin_subscription(k) for k in self.subscription_types]
        return subs


@dataclass(frozen=True)
class Produced:
    """One message as published on a (or, on the three-cluster bed, on b or c)."""

    topic: str  # the topic partition
    key: str
    position: Position  # its entry on a (for a message produced elsewhere: its copy's)
    batch_index: int  # -1: not batched
    batch_size: int  # 0: not batched
    chunked: bool = False
    #: The cluster it was produced on, and its entry there when that is not a.
    origin: str = "a"
    origin_position: Position | None = None


@dataclass
class WorkloadResult:
    """Ground truth of one run."""

    spec: WorkloadSpec
    messages: list[Produced] = field(default_factory=list)
    foreign: list[Produced] = field(default_factory=list)  # on b; position is b's
    #: subscription -> message key -> time.time() of its ack on a.
    acked: dict[str, dict[str, float]] = field(default_factory=dict)
    started_at: float = 0.0
    last_ack_at: float = 0.0
    finished_at: float = 0.0

    def by_key(self) -> dict[str, Produced]:
        return {m.key: m for m in self.messages}

    def topic_partitions(self) -> list[str]:
        return sorted({m.topic for m in self.messages})

    def acked_entries(self, subscription: str) -> dict[str, set[Position]]:
        """Per topic partition, the entries whose every message was acked (what a's broker
        counts as acked for the subscription)."""
        acked = self.acked.get(subscription, {})
        entries: dict[tuple[str, Position], list[str]] = {}
        for m in self.messages:
            entries.setdefault((m.topic, m.position), []).append(m.key)
        out: dict[str, set[Position]] = {t: set() for t in self.topic_partitions()}
        for (topic, pos), keys in entries.items():
            if all(k in acked for k in keys):
                out[topic].add(pos)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"messages": len(self.messages), "foreign": len(self.foreign),
                "acked": {s: len(a) for s, a in self.acked.items()},
                "seconds": round(self.finished_at - self.started_at, 2)}


# ------------------------------------------------------------------- the plan


def _fraction(seed: int, *parts: object) -> float:
    """A stable pseudo-random number in [0, 1) from its arguments (same on every run)."""
    h = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def ack_choice(spec: WorkloadSpec, topic: str, entry_no: int, batch_size: int) -> AckChoice:
    """The seeded choice for the ``entry_no``-th entry of a topic partition."""
    r = _fraction(spec.seed, "ack", topic, entry_no)
    delay = _fraction(spec.seed, "delay", topic, entry_no)
    if r < spec.hole_fraction:
        return AckChoice("never", 0.0, 0)
    r -= spec.hole_fraction
    if batch_size > 1 and r < spec.partial_batch_fraction:
        k = 1 + int(_fraction(spec.seed, "part", topic, entry_no) * (batch_size - 1))
        return AckChoice("partial", 0.2 * delay, k)
    r -= spec.partial_batch_fraction if batch_size > 1 else 0.0
    if r < spec.late_fraction:
        return AckChoice("late", 1.0 + 3.0 * delay, batch_size or 1)
    return AckChoice("prompt", 0.2 * delay, batch_size or 1)


def _plan(rng: random.Random, spec: WorkloadSpec) -> list[int]:
    """Entry sizes in order: 0 = one unbatched message, k = a batch of k."""
    return [rng.choice(spec.batch_sizes) if rng.random() < spec.batched_fraction else 0
            for _ in range(spec.entries_per_partition)]


def _message_fields(topic: str, n: int, origin: str = "a"
                    ) -> tuple[str, bytes, dict[str, str], str]:
    local = TopicName.parse(topic).local
    key = f"{local}:{n}" if origin == "a" else f"{local}:{origin}-{n}"
    payload = json.dumps({"key": key, "n": n}).encode()
    return key, payload, {"key": key, "n": str(n)}, f"pk-{n % 5}"


class _Publisher:
    """The producers of one topic partition on a (or on ``cluster``), and what they
    published.

    Each message's ack decision is recorded before it is sent, so a consumer that
    receives it finds it. Another cluster's keys, producer names and ack choices are
    its own, so its messages never look like a's."""

    def __init__(self, bed: TestBed, topic: str, spec: WorkloadSpec,
                 decisions: Decisions, *, cluster: str = "a", client: Any = None) -> None:
        self.topic = topic
        self.spec = spec
        self.decisions = decisions
        self.cluster = cluster
        self.client = client if client is not None else bed.client(cluster)
        local = TopicName.parse(topic).local
        prefix = local if cluster == "a" else f"{local}-{cluster}"
        self._plan_name = topic if cluster == "a" else f"{topic}@{cluster}"
        self.singles = [self.client.create_producer(topic, producer_name=f"{prefix}-single-{i}",
                                                    batching_enabled=False,
                                                    send_timeout_millis=SEND_TIMEOUT_MS)
                        for i in range(2)]
        self.batching = self.client.create_producer(
            topic, producer_name=f"{prefix}-batch", batching_enabled=True,
            batching_max_messages=10_000, batching_max_publish_delay_ms=3_600_000,
            batching_max_allowed_size_in_bytes=1 << 30, send_timeout_millis=SEND_TIMEOUT_MS)
        self.out: list[Produced] = []
        self.entries = 0
        self.n = 0

    def _next(self, size: int, index: int) -> tuple[str, bytes, dict[str, str], str]:
        fields = _message_fields(self.topic, self.n, self.cluster)
        self.decisions[fields[0]] = (ack_choice(self.spec, self._plan_name, self.entries, size),
                                     index)
        self.n += 1
        return fields

    def _produced(self, key: str, mid: Any, batch_index: int, batch_size: int) -> Produced:
        pos = Position(mid.ledger_id(), mid.entry_id())
        if self.cluster == "a":
            return Produced(self.topic, key, pos, batch_index, batch_size)
        # Its position on a is known once a holds the copy (the three-cluster workload).
        return Produced(self.topic, key, pos, batch_index, batch_size, origin=self.cluster,
                        origin_position=pos)

    def entry(self, size: int, rng: random.Random) -> None:
        if size == 0:
            key, payload, props, pk = self._next(0, -1)
            delayed = rng.random() < self.spec.delayed_fraction
            mid = self.singles[self.n % 2].send(
                payload, properties=props, partition_key=pk, event_timestamp=10**12 + self.n,
                deliver_after=timedelta(seconds=self.spec.delay_seconds) if delayed else None)
            self.out.append(self._produced(key, mid, -1, 0))
            self.entries += 1
            return
        ids: list[Any] = [None] * size
        done = threading.Semaphore(0)
        keys = []
        for i in range(size):
            key, payload, props, pk = self._next(size, i)
            keys.append(key)

            def cb(res: Any, mid: Any, i: int = i) -> None:
                ids[i] = mid
                done.release()

            self.batching.send_async(payload, cb, properties=props, ordering_key=pk,
                                     event_timestamp=10**12 + self.n)
        self.batching.flush()
        for _ in range(size):
            if not done.acquire(timeout=SEND_TIMEOUT_MS / 1000):
                raise TestBedError(f"a batch sent to {self.topic} on {self.cluster} was "
                                   f"not confirmed in {SEND_TIMEOUT_MS / 1000:g} s")
        entries = {(m.ledger_id(), m.entry_id()) for m in ids}
        if len(entries) != 1:
            raise TestBedError(f"{self.topic}: a batch of {size} landed in {len(entries)} entries")
        for key, mid in zip(keys, ids, strict=True):
            self.out.append(self._produced(key, mid, mid.batch_index(), size))
        self.entries += 1

    def chunked(self, service_url: str, count: int) -> None:
        """``count`` chunked messages, each followed by a small one; a chunked message is
        recorded at its first chunk's position.

        They are sent from a process of their own: the C++ client keeps one max message
        size per process (the last broker it connected to set it), and this process also
        talks to b, whose limit is larger, so its chunks would be too large for a.
        """
        fields: list[dict[str, Any]] = []
        for _ in range(count):
            key, _, props, pk = self._next(0, -1)
            fields.append({"key": key, "properties": props, "partition_key": pk})
            self.entries += 1
        done = subprocess.run(
            [sys.executable, "-m", "cursorsync_devtools.testbed._chunked", service_url, self.topic,
             str(self.spec.chunk_message_bytes), str(self.spec.seed)],
            input=json.dumps(fields), capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise TestBedError(f"{self.topic}: sending chunked messages failed: "
                               f"{done.stderr.strip()[-800:]}")
        for line, f in zip(done.stdout.splitlines(), fields, strict=True):
            first = Position.parse(json.loads(line)["first_chunk"])
            self.out.append(Produced(self.topic, f["key"], first, -1, 0, chunked=True))

    def close(self) -> None:
        for p in (*self.singles, self.batching):
            p.close()


def _publish_foreign(bed: TestBed, topic: str, spec: WorkloadSpec) -> list[Produced]:
    if not spec.foreign_per_partition:
        return []  # no client either: each holds threads and file descriptors
    client = bed.client("b")
    local = TopicName.parse(topic).local
    producer = client.create_producer(topic, producer_name=f"{local}-foreign-b",
                                      batching_enabled=False)
    out = []
    try:
        for i in range(spec.foreign_per_partition):
            key = f"{local}:foreign-{i}"
            mid = producer.send(json.dumps({"key": key}).encode(),
                                properties={"key": key, "origin": "b"}, disable_replication=True)
            out.append(Produced(topic, key, Position(mid.ledger_id(), mid.entry_id()), -1, 0))
    finally:
        producer.close()
    return out


# ------------------------------------------------------------------ the run


def create_topics(bed: TestBed, spec: WorkloadSpec) -> list[str]:
    """The spec's topics on both clusters; their topic partitions."""
    return [p for name, n in spec.topics().items() for p in bed.create_topic(name, n)]


def create_target_subscriptions(bed: TestBed, spec: WorkloadSpec) -> None:
    """b's ``sync-*`` subscriptions at the earliest position, as a DR site's consumers
    would have them, before anything is produced. (The ``builtin-*`` ones are made on b
    by Pulsar's replicated subscriptions themselves.)"""
    client = bed.client("b")
    for name in spec.topics():
        for kind in spec.subscription_types:
            client.subscribe(bed.topic(name), sync_subscription(kind),
                             consumer_type=consumer_type(kind),
                             initial_position=pulsar.InitialPosition.Earliest,
                             receiver_queue_size=1).close()


def run_workload(bed: TestBed, spec: WorkloadSpec | None = None) -> WorkloadResult:
    """Produce on a (and foreign messages on b), consume and ack on a; the ground truth.

    Topics must exist (:func:`create_topics`). Returns once every planned ack has been
    sent and a's consumers are closed (which flushes their acks).
    """
    spec = spec or WorkloadSpec()
    rng = random.Random(spec.seed)
    result = WorkloadResult(spec, started_at=time.time())
    partitions = {name: bed.partitions(name) for name in spec.topics()}
    regular = [p for name, parts in partitions.items() if name != spec.chunked_topic
               for p in parts]
    plans = {p: _plan(rng, spec) for p in regular}
    decisions: Decisions = {}
    ackers: list[tuple[str, Acker]] = []
    for name in spec.topics():
        for kind in spec.subscription_types:
            subs = [(sync_subscription(kind), False)]
            if spec.builtin:
                subs.append((builtin_subscription(kind), True))
            for sub, replicated in subs:
                ackers.append((name, Acker(bed, bed.topic(name), sub, kind, replicated,
                                            decisions, spec.batch_index_acks)))
    every = [p for parts in partitions.values() for p in parts]
    clients = [bed.client("a") for _ in range(0, len(every), spec.partitions_per_client)]
    publishers = {p: _Publisher(bed, p, spec, decisions,
                                client=clients[i // spec.partitions_per_client])
                  for i, p in enumerate(every)}
    for _, a in ackers:
        a.start()
    rounds = max(1, int(spec.produce_seconds * 4))
    per_round = max(1, -(-spec.entries_per_partition // rounds))
    t0 = time.monotonic()
    try:
        for r in range(rounds):
            for p in regular:
                for size in plans[p][r * per_round:(r + 1) * per_round]:
                    publishers[p].entry(size, rng)
            if r == rounds // 2:
                for p in regular:
                    result.foreign += _publish_foreign(bed, p, spec)
                if spec.chunked_topic:
                    (chunk_topic,) = partitions[spec.chunked_topic]
                    publisher = publishers[chunk_topic]
                    for _ in range(spec.chunked_messages):
                        publisher.chunked(bed.service_url("a"), 1)
                        publisher.entry(0, rng)
            time.sleep(max(0.0, t0 + (r + 1) * spec.produce_seconds / rounds - time.monotonic()))
    finally:
        for pub in publishers.values():
            pub.close()
    for pub in publishers.values():
        result.messages += pub.out
    expected: dict[str, int] = {}
    for m in result.messages:
        name = TopicName.parse(m.topic).base.local
        expected[name] = expected.get(name, 0) + 1
    for name, a in ackers:
        a.finish(expected.get(name, 0), timeout_s=60 + spec.delay_seconds)
        result.acked.setdefault(a.subscription, {}).update(a.acked)
    result.last_ack_at = max((t for acks in result.acked.values() for t in acks.values()),
                             default=result.started_at)
    result.finished_at = time.time()
    return result


def verify_source_cursors(bed: TestBed, result: WorkloadResult) -> None:
    """Every entry the ground truth calls acked is acked in a's internalStats, and no
    workload entry it calls unacked is; TestBedError naming the first difference."""
    by_topic: dict[str, list[Produced]] = {}
    for m in result.messages:
        if not m.chunked:
            by_topic.setdefault(m.topic, []).append(m)
    for sub in result.acked:
        acked = result.acked_entries(sub)
        for topic in result.topic_partitions():
            cur = bed.internal_stats("a", topic)["cursors"].get(sub)
            if cur is None:
                raise TestBedError(f"{topic}: a has no subscription {sub}")
            done = (RangeSet.parse(cur["individuallyDeletedMessages"])
                    | RangeSet.up_to(Position.parse(cur["markDeletePosition"])))
            for m in by_topic.get(topic, ()):
                if (m.position in done) != (m.position in acked[topic]):
                    raise TestBedError(
                        f"{topic} {sub}: entry {m.position} is "
                        f"{'acked' if m.position in done else 'not acked'} on a, but the "
                        f"workload {'acked' if m.position in acked[topic] else 'did not ack'} "
                        f"all its messages (a's cursor: {cur['markDeletePosition']} "
                        f"{cur['individuallyDeletedMessages']})")
