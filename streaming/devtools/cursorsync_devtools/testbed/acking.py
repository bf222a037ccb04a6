"""A subscription's consumer on cluster a that acknowledges per a seeded plan, on time."""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass
from typing import Any

import pulsar

from cursorsync_devtools.testbed.testbed import TestBed, TestBedError

_CONSUMER_TYPES = {"Shared": pulsar.ConsumerType.Shared,
                   "Failover": pulsar.ConsumerType.Failover,
                   "Exclusive": pulsar.ConsumerType.Exclusive,
                   "Key_Shared": pulsar.ConsumerType.KeyShared}


def consumer_type(kind: str) -> Any:
    """The pulsar-client consumer type of a subscription type name."""
    return _CONSUMER_TYPES[kind]


@dataclass(frozen=True)
class AckChoice:
    """What a subscription does with one entry's messages."""

    kind: str  # prompt | late | never | partial
    delay_s: float
    acked_indexes: int  # partial: how many of the batch's first messages are acked


#: message key -> (what its entry gets, the message's index in its batch or -1).
Decisions = dict[str, tuple[AckChoice, int]]


class Acker:
    """One subscription's consumer on a: receives everything, acks per plan, on time."""

    def __init__(self, bed: TestBed, topic: str, subscription: str, kind: str,
                 replicated: bool, decisions: Decisions, batch_index_acks: bool = False
                 ) -> None:
        self.subscription = subscription
        self.decisions = decisions
        self.consumer = bed.client("a").subscribe(
            topic, subscription, consumer_type=consumer_type(kind),
            initial_position=pulsar.InitialPosition.Earliest,
            replicate_subscription_state_enabled=replicated,
            batch_index_ack_enabled=batch_index_acks)
        self.acked: dict[str, float] = {}
        self.received = 0
        self._due: list[tuple[float, int, Any]] = []
        self._seq = 0
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"acker-{subscription}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _decide(self, msg: Any) -> None:
        found = self.decisions.get(msg.properties().get("key", ""))
        if found is None:  # not the workload's: not ours to judge
            return
        choice, index = found
        if choice.kind == "never" or (choice.kind == "partial"
                                      and index >= choice.acked_indexes):
            return
        self._seq += 1
        heapq.heappush(self._due, (time.monotonic() + choice.delay_s, self._seq, msg))

    def _ack_due(self) -> None:
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, _, msg = heapq.heappop(self._due)
            self.consumer.acknowledge(msg)
            self.acked[msg.properties()["key"]] = time.time()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._ack_due()
                try:
                    msg = self.consumer.receive(50)
                except pulsar.Timeout:
                    continue
                self.received += 1
                self._decide(msg)
            while self._due:
                time.sleep(max(0.0, min(0.05, self._due[0][0] - time.monotonic())))
                self._ack_due()
        except BaseException as err:  # reported by finish()
            self.error = err

    def finish(self, expected: int, timeout_s: float) -> None:
        """Wait until ``expected`` messages arrived and every planned ack went out; close."""
        deadline = time.monotonic() + timeout_s
        while self.received < expected and self.error is None:
            if time.monotonic() > deadline:
                raise TestBedError(f"subscription {self.subscription} on a received "
                                   f"{self.received} of {expected} messages in {timeout_s} s")
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout_s)
        self.consumer.close()  # flushes grouped acks
        if self.error is not None:
            raise TestBedError(f"subscription {self.subscription} on a: {self.error}")


# ------------------------------------------------------------------ producers
