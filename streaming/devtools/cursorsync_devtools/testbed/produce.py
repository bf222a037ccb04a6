"""Keyed production on a: a planned sequence of entries, sent asynchronously, each
message's position on a recorded from its send receipt.

What a benchmark needs from a workload: many entries fast (a backlog) or at a
paced rate (a live phase), a share of them batches, and for every message its
key (``properties["key"]``, ``<topic partition local name>:<n>``) and the
entry it landed in. The key is known before the send, so a consumer that
receives the message can look up what to do with it; where the message landed
on b is found by key (:func:`cursorsync_devtools.testbed.readers.positions_by_key`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cursorsync.core.positions import Position
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed.testbed import TestBed, TestBedError
from cursorsync_devtools.testbed.workload import Produced

#: Bytes after the key in each payload: entries of a realistic small size.
PAYLOAD_PAD = b"." * 96


@dataclass(frozen=True)
class Plan:
    """Entries to send per topic partition, in order: 0 = one unbatched message, k = a batch
    of k messages."""

    entries: Mapping[str, Sequence[int]]

    @classmethod
    def of(cls, partitions: Sequence[str], entries: int, *, batched_fraction: float,
           batch_size: int, seed: int) -> Plan:
        """``entries`` in all, spread evenly over the partitions, each a batch with
        probability ``batched_fraction`` (seeded)."""
        rng = random.Random(seed)
        per, extra = divmod(entries, len(partitions))
        return cls({p: [batch_size if rng.random() < batched_fraction else 0
                        for _ in range(per + (i < extra))]
                    for i, p in enumerate(partitions)})

    def messages(self) -> Iterator[tuple[str, str, int, int]]:
        """(topic partition, key, batch size, index in the batch) of every message, in the
        order :func:`produce` sends them (entries round-robin over the partitions)."""
        counters = dict.fromkeys(self.entries, 0)
        longest = max((len(v) for v in self.entries.values()), default=0)
        for i in range(longest):
            for topic, sizes in self.entries.items():
                if i >= len(sizes):
                    continue
                size = sizes[i]
                for index in range(max(1, size)):
                    yield topic, message_key(topic, counters[topic]), size, index if size else -1
                    counters[topic] += 1

    def message_count(self) -> int:
        return sum(max(1, s) for sizes in self.entries.values() for s in sizes)

    def entry_count(self) -> int:
        return sum(len(sizes) for sizes in self.entries.values())

    def batched_count(self) -> int:
        return sum(1 for sizes in self.entries.values() for s in sizes if s)


def message_key(topic: str, n: int) -> str:
    return f"{TopicName.parse(topic).local}:{n}"


class _Receipts:
    """Send receipts of asynchronous sends; waits for all of them."""

    def __init__(self) -> None:
        self.produced: list[Produced] = []
        self.failures: list[str] = []
        self._pending = 0
        self._cond = threading.Condition()

    def callback(self, topic: str, key: str, size: int) -> Any:
        with self._cond:
            self._pending += 1

        def done(result: Any, mid: Any) -> None:
            import pulsar

            with self._cond:
                if result != pulsar.Result.Ok:
                    self.failures.append(f"{topic} {key}: {result}")
                else:
                    self.produced.append(Produced(
                        topic, key, Position(mid.ledger_id(), mid.entry_id()),
                        mid.batch_index() if size else -1, size))
                self._pending -= 1
                self._cond.notify_all()

        return done

    def wait(self, timeout_s: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending == 0, timeout_s):
                raise TestBedError(f"{self._pending} sends on a were not confirmed within "
                                   f"{timeout_s:.0f} s")
        if self.failures:
            raise TestBedError(f"{len(self.failures)} sends on a failed, e.g. "
                               f"{self.failures[0]}")


def produce(bed: TestBed, plan: Plan, *, rate_per_s: float | None = None,
            timeout_s: float = 120.0) -> list[Produced]:
    """Send the plan on a and return every message with its entry on a, in send order.

    Per topic partition, an unbatched producer and a batching one whose batches close at the
    plan's largest batch size (smaller batches are flushed: a flush waits for the broker, so
    a plan of one batch size sends without waiting). ``rate_per_s``: messages per second
    over all partitions, paced; None: as fast as the brokers take them.
    """
    client = bed.client("a")
    largest = max((s for v in plan.entries.values() for s in v), default=0)
    producers: dict[str, tuple[Any, Any]] = {}
    receipts = _Receipts()
    try:
        for topic in plan.entries:
            local = TopicName.parse(topic).local
            producers[topic] = (
                client.create_producer(topic, producer_name=f"{local}-single",
                                       batching_enabled=False, max_pending_messages=20_000,
                                       block_if_queue_full=True),
                client.create_producer(topic, producer_name=f"{local}-batch",
                                       batching_enabled=True,
                                       batching_max_messages=max(1, largest),
                                       batching_max_publish_delay_ms=3_600_000,
                                       batching_max_allowed_size_in_bytes=1 << 24,
                                       max_pending_messages=20_000, block_if_queue_full=True))
        t0 = time.monotonic()
        for n, (topic, key, size, index) in enumerate(plan.messages()):
            if rate_per_s is not None:
                ahead = t0 + n / rate_per_s - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            single, batching = producers[topic]
            producer = batching if size else single
            producer.send_async(key.encode() + PAYLOAD_PAD, receipts.callback(topic, key, size),
                                properties={"key": key}, event_timestamp=10**12 + n)
            if 0 < size < largest and index == size - 1:
                batching.flush()
        for single, batching in producers.values():
            single.flush()
            batching.flush()
        receipts.wait(timeout_s)
    finally:
        for pair in producers.values():
            for p in pair:
                p.close()
    return sorted(receipts.produced, key=lambda m: (m.topic, m.position, m.batch_index))


def entries_of(messages: Sequence[Produced]) -> dict[tuple[str, Position], list[Produced]]:
    """The messages of each entry, by (topic partition, position on a)."""
    out: dict[tuple[str, Position], list[Produced]] = {}
    for m in messages:
        out.setdefault((m.topic, m.position), []).append(m)
    return out
