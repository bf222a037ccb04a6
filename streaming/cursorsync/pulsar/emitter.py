"""The ack emitter: sends a guarded plan's acks to a target subscription.

The sync step translates a source cursor into an :class:`~cursorsync.core.cursor.AckPlan`,
passes it through :func:`~cursorsync.core.guard.guard` (the safety rule) and
hands the resulting :class:`~cursorsync.core.guard.SafePlan` here. Nothing else
is accepted, so no ack reaches a target without passing the guard.

One consumer per (topic partition, subscription), created lazily and kept
open across calls. It subscribes at ``Earliest``: creating a missing target
subscription must not acknowledge anything (a ``Latest`` subscription would
start with every existing entry acked).

The consumer has a zero receiver queue, so the broker dispatches nothing to
it, and it acks ``MessageId(partition, ledger, entry, -1)``: the whole entry,
no batch index. A broker applies an individual or cumulative ack of any
``ledger:entry`` from any consumer of the subscription, received or not
(pinned in ``tests/integration/bed/test_pulsar_facts.py``). An id the client did not deliver
is acked whole even with a batch index and batch-index acknowledgement on: only a delivered
message's id carries its batch's acker (pinned in
``tests/integration/bed/test_batch_index_ack_facts.py``). So a plan's index acks
(:mod:`cursorsync.core.batches`) go through ids delivered on the target: a consumer of the
emitter's own batch-reader subscription (:mod:`cursorsync.pulsar.index_acks`; never a Reader,
which acks index 0 of each batch it delivers on the batch's acker) reads the batch, and the
emitter's consumer, subscribed with batch-index acknowledgement on, acks the wanted messages
of it; the broker then holds those indexes, as it does for a consumer's own (pinned in
``tests/integration/pulsar/test_index_acks.py``). A target broker
with batch-index acknowledgement off ignores such an ack: a duplicate after failover, never
a loss. The Python client has no list ack
and does not expose the ack-grouping settings, so individual acks go out
asynchronously, ``ack_batch_size`` at a time, and the C++ client's ack
grouping (defaults: 100 ms, 1000 ids) packs them into few ACK commands.

Acks are fire-and-forget in Pulsar (no receipts): they leave within the ack
grouping window, ``close()`` flushes them, and an ack lost on the way is
planned again at the next sync because the target cursor will not show it.

A cumulative ack covers everything up to its position, including entries the plan
counts as acked only because the target's cursor showed them acked when it was read.
Between that read and the ack the subscription may be reset, or deleted and created
again (by the consumer's own reconnection, at ``Earliest``): the new one holds none of
them, and the broker applies the ack to it all the same (pinned in
``tests/integration/pulsar/test_emit_races.py``). So a cumulative ack stops before the
first position only the read vouches for (``unproven``), and the plan's acks after it go one by one:
individual acks name only entries whose source is acked, whatever the subscription.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

import pulsar

from cursorsync.core.batches import IndexAck
from cursorsync.core.cursor import AckPlan
from cursorsync.core.guard import SafePlan
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import ConfigError, CursorSyncError, TopicNotFoundError
from cursorsync.pulsar.ack_entries import entries_of, last_entry
from cursorsync.pulsar.client import ClientSettings
from cursorsync.pulsar.index_acks import (
    BATCH_READER_SUBSCRIPTION,
    READ_AHEAD,
    open_batch_reader,
    read_batch,
)
from cursorsync.pulsar.reachable import reachable
from cursorsync.pulsar.subscriptions import CUMULATIVE_TYPES, SUBSCRIPTION_TYPES, SubscriptionType
from cursorsync.pulsar.topics import TopicName

log = logging.getLogger(__name__)


_CONSUMER_TYPES = {
    "Exclusive": pulsar.ConsumerType.Exclusive,
    "Failover": pulsar.ConsumerType.Failover,
    "Shared": pulsar.ConsumerType.Shared,
    "Key_Shared": pulsar.ConsumerType.KeyShared,
}
#: Consumers subscribed at once by :meth:`PulsarEmitter.open_consumers`.
OPEN_WORKERS = 8


class EmitError(CursorSyncError):
    """Acks could not be sent to a target subscription; the message names what to fix."""


class TargetUnreachableError(EmitError):
    """The target cluster's service URL does not accept connections."""


class SubscriptionBusyError(EmitError):
    """Another consumer holds the target subscription in a way that excludes the emitter."""


class EmitTopicNotFoundError(EmitError, TopicNotFoundError):
    """The target topic does not exist on the target cluster."""


@dataclass(frozen=True)
class EmitResult:
    """What one apply() did for one (topic partition, subscription)."""

    #: Ack commands issued: a cumulative ack counts 1, individual acks one per entry.
    acks_sent: int
    #: Where the cumulative ack went (None: no cumulative ack).
    cumulative_to: Position | None
    #: Entries acked individually.
    individual_entries: int
    #: Messages acked by batch index.
    index_acks: int = 0


class Emitter(Protocol):
    """Sends the acks of guarded plans to target subscriptions."""

    def apply(
        self,
        topic: str,
        subscription: str,
        safe: SafePlan,
        *,
        cumulative: bool,
        ledgers: Ledgers | None = None,
        unproven: RangeSet | None = None,
    ) -> EmitResult: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------ per consumer


@dataclass(frozen=True)
class _Subscription:
    """One open consumer of a target subscription."""

    topic: str
    subscription: str
    partition: int
    consumer: Any


# ---------------------------------------------------------------------- emitter


def emitter_name() -> str:
    """This process's emitter consumer name: ``cursorsync-emitter-<host>-<pid>``."""
    return f"cursorsync-emitter-{socket.gethostname()}-{os.getpid()}"


class PulsarEmitter:
    """Acks guarded plans on the target cluster with pulsar-client consumers (see module doc)."""

    def __init__(
        self,
        target: ClientSettings | str,
        *,
        subscription_type: SubscriptionType = "Shared",
        ack_batch_size: int = 1000,
        consumer_name: str | None = None,
        client: pulsar.Client | None = None,
        batch_index_acks: bool = False,
    ) -> None:
        """``target``: how to reach the target cluster (a bare service URL means no auth).
        ``consumer_name``: default ``cursorsync-emitter-<host>-<pid>``, so the target's
        subscription stats show which process holds each consumer (the driver, or an
        executor's Python worker). ``batch_index_acks``: consumers ack by batch index, and
        plans' index acks are sent; without it a plan with index acks is refused."""
        settings = target if isinstance(target, ClientSettings) else ClientSettings(target)
        if subscription_type not in SUBSCRIPTION_TYPES:
            raise ConfigError(
                f"{subscription_type!r} is not a valid subscription_type. "
                f"Valid values are: {', '.join(SUBSCRIPTION_TYPES)}"
            )
        if ack_batch_size < 1:
            raise ConfigError(f"ack_batch_size must be >= 1, got {ack_batch_size}")
        self.service_url = settings.service_url
        self.subscription_type: SubscriptionType = subscription_type
        self.ack_batch_size = ack_batch_size
        self.consumer_name = consumer_name or emitter_name()
        self.operation_timeout_seconds = settings.operation_timeout_s
        self._owns_client = client is None
        if client is None:
            client = settings.connect()
        self._client = client
        self.batch_index_acks = batch_index_acks
        self._subs: dict[tuple[str, str], _Subscription] = {}
        self._lock = threading.Lock()

    # -- public
    def apply(
        self,
        topic: str,
        subscription: str,
        safe: SafePlan,
        *,
        cumulative: bool,
        ledgers: Ledgers | None = None,
        unproven: RangeSet | None = None,
    ) -> EmitResult:
        """Send the acks of ``safe`` to ``subscription`` on the topic partition ``topic``.

        ``cumulative`` asks for one cumulative ack up to the plan's
        markDeletePosition (Exclusive/Failover only). ``ledgers`` is the target
        topic's ledger list: needed when a planned range spans ledgers.
        ``unproven``: target positions the plan counts as acked only because the
        target's read showed them acked; the cumulative ack stops before the first
        of them (see the module doc).
        """
        if not isinstance(safe, SafePlan):
            kind = "a bare AckPlan" if isinstance(safe, AckPlan) else type(safe).__name__
            raise TypeError(
                f"apply() takes a SafePlan from cursorsync.core.guard.guard(), got {kind}: "
                "every ack must pass the safety guard"
            )
        if cumulative and self.subscription_type not in CUMULATIVE_TYPES:
            raise ConfigError(
                f"cumulative acks need an Exclusive or Failover subscription, but the emitter's "
                f"subscription_type is {self.subscription_type} (Pulsar refuses cumulative acks "
                "on Shared/Key_Shared); apply with cumulative=False"
            )
        plan = safe.plan
        cum, individual = plan.split(cumulative=cumulative)
        if cum is not None and unproven:
            # Up to the last position before the first one only the read vouches for.
            lo = unproven.bounds[0]
            cum = min(cum, Position(int(lo[0]), int(lo[1])))
            if cum <= plan.previous_mark_delete:
                cum, individual = None, plan.to_ack
            else:
                individual = plan.to_ack.after(cum)
        cum_entry = None if cum is None else last_entry(cum, ledgers)
        if cum is not None and cum_entry is None:
            # markDelete L:-1 with no known entry before it: ack everything individually.
            cum, individual = None, plan.to_ack
        if plan.index_acks and not self.batch_index_acks:
            raise ConfigError(
                f"the plan for {topic} {subscription!r} acks batch indexes, but the emitter "
                "was made without batch_index_acks: nothing was sent")
        if not plan.to_ack and cum is None and not plan.index_acks:
            return EmitResult(0, None, 0)
        sub = self._subscription(topic, subscription)
        result = self._ack(sub, cum_entry, individual, ledgers)
        if not plan.index_acks:
            return result
        return replace(result, index_acks=self._ack_indexes(sub, plan.index_acks))

    def open_consumers(self, cursors: Sequence[tuple[str, str]]) -> None:
        """Subscribe the consumers of ``cursors`` (concrete topic, subscription) that are
        not open yet, OPEN_WORKERS at a time, as :meth:`apply` would one by one. One that
        fails to open is left: :meth:`apply` subscribes it again and says why it cannot."""
        with self._lock:
            missing = sorted({(str(TopicName.parse(t)), s) for t, s in cursors}
                             - self._subs.keys())
        if not missing:
            return

        def subscribe(key: tuple[str, str]) -> Any:
            try:
                return self._subscribe(*key)
            except (CursorSyncError, pulsar.PulsarException) as exc:
                log.debug("%s %s: not subscribed ahead of its acks (%s)", *key, exc)
                return None

        with ThreadPoolExecutor(max_workers=min(OPEN_WORKERS, len(missing)),
                                thread_name_prefix="emitter-open") as pool:
            opened = list(pool.map(subscribe, missing))
        extra = []
        with self._lock:
            for (topic, subscription), consumer in zip(missing, opened, strict=True):
                if consumer is None:
                    continue
                if (topic, subscription) in self._subs:  # opened by apply meanwhile
                    extra.append(consumer)
                    continue
                self._subs[(topic, subscription)] = _Subscription(
                    topic, subscription, TopicName.parse(topic).partition, consumer)
        for consumer in extra:
            consumer.close()
        log.debug("opened %d of %d target consumers at once",
                  sum(c is not None for c in opened), len(missing))

    def close(self) -> None:
        """Close every consumer (flushing grouped acks), then the client if we created it."""
        with self._lock:
            subs, self._subs = list(self._subs.values()), {}
        errors = []
        for sub in subs:
            try:
                sub.consumer.close()
            except pulsar.PulsarException as exc:  # already closed or disconnected
                errors.append(f"{sub.topic} {sub.subscription}: {exc}")
        if self._owns_client:
            self._client.close()
        if errors:
            log.warning("closing emitter consumers failed: %s", "; ".join(errors))

    def __enter__(self) -> PulsarEmitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- consumers
    def _subscription(self, topic: str, subscription: str) -> _Subscription:
        name = TopicName.parse(topic)
        key = (str(name), subscription)
        with self._lock:
            sub = self._subs.get(key)
            if sub is None:
                consumer = self._subscribe(str(name), subscription)
                sub = _Subscription(str(name), subscription, name.partition, consumer)
                self._subs[key] = sub
            return sub

    def _subscribe(self, topic: str, subscription: str) -> Any:
        where = f"topic {topic} subscription {subscription!r} on {self.service_url}"
        try:
            partitions = self._client.get_topic_partitions(topic)
            if partitions != [topic]:
                raise ConfigError(
                    f"{topic} is a partitioned topic ({len(partitions)} partitions): the emitter "
                    f"acks per partition, address {partitions[0]} ... instead"
                )
            return self._client.subscribe(
                topic,
                subscription,
                consumer_type=_CONSUMER_TYPES[self.subscription_type],
                receiver_queue_size=0,
                consumer_name=self.consumer_name,
                initial_position=pulsar.InitialPosition.Earliest,
                batch_index_ack_enabled=self.batch_index_acks,
            )
        except pulsar.ConsumerBusy as exc:
            raise SubscriptionBusyError(self._busy_message(where, str(exc))) from exc
        except pulsar.TopicNotFound as exc:
            raise EmitTopicNotFoundError(
                f"topic {topic} does not exist on the target cluster {self.service_url}; "
                "is it replicated there (and topic auto-creation off)?"
            ) from exc
        except (pulsar.AuthenticationError, pulsar.AuthorizationError) as exc:
            raise EmitError(
                f"{where}: refused ({exc}); check the target's auth (token, token_file or "
                "TLS certificate) and the role's consume permission"
            ) from exc
        except (pulsar.Timeout, pulsar.ConnectError) as exc:
            if not reachable(self.service_url):
                raise TargetUnreachableError(
                    f"target cluster {self.service_url} is unreachable (subscribing {where} "
                    f"failed: {exc}); check the service URL and that the brokers are up"
                ) from exc
            raise SubscriptionBusyError(
                self._busy_message(where, f"timed out after {self.operation_timeout_seconds}s "
                                   "although the broker accepts connections")
            ) from exc

    def _busy_message(self, where: str, detail: str) -> str:
        return (
            f"cannot subscribe as {self.subscription_type} to {where}: {detail}. Most likely "
            "another consumer holds the subscription (an Exclusive one, or one of another "
            "type): the consumers on the target must be stopped, or the emitter must be the "
            "only consumer of the subscription until failover"
        )

    # -- acks
    def _ack(
        self,
        sub: _Subscription,
        cum: Position | None,
        individual: RangeSet,
        ledgers: Ledgers | None,
    ) -> EmitResult:
        ids = (pulsar.MessageId(sub.partition, p.ledger, p.entry, -1)
               for p in entries_of(individual, ledgers))
        sent = self._ack_individually(sub, ids)
        if cum is not None:
            mid = pulsar.MessageId(sub.partition, cum.ledger, cum.entry, -1)
            self._call(sub, "cumulative ack", sub.consumer.acknowledge_cumulative, mid)
        log.debug("%s %s: acked %d entries by id, cumulative to %s",
                  sub.topic, sub.subscription, sent, cum)
        return EmitResult(sent + (cum is not None), cum, sent)

    def _ack_individually(self, sub: _Subscription, ids: Iterator[Any]) -> int:
        """Individual acks, ``ack_batch_size`` at a time, each group on a connected consumer.

        ``acknowledge()`` only queues the id in the client's grouping tracker, which
        sends every 100 ms or per 1000 ids; a group is started only while the
        consumer is connected, so acks are not queued into a dead connection.
        """
        sent = 0
        for mid in ids:
            if sent % self.ack_batch_size == 0:
                self._wait_connected(sub)
            self._call(sub, "ack", sub.consumer.acknowledge, mid)
            sent += 1
        return sent

    def _ack_indexes(self, sub: _Subscription, acks: tuple[IndexAck, ...]) -> int:
        """Each index ack's batch read from the target, its wanted messages acked.

        The batches are read by a consumer of a subscription of its own
        (:data:`BATCH_READER_SUBSCRIPTION`), made for the call, moved to each batch with ``seek``
        and removed after: a consumer acks nothing by itself, so the acker each delivered
        id carries holds only what the emitter acks through it. (A Reader does not do: it
        acks the first message of every batch it delivers on the batch's acker, and an
        index ack then takes index 0 with it.) Batches within READ_AHEAD entries of the
        last, in one ledger, are read on without a seek. A batch whose entry holds another
        number of messages than the plan says is not the plan's batch: skipped, warned;
        so is one that cannot be read (a trimmed ledger).
        """
        sent = 0
        try:
            reader = open_batch_reader(self._client, sub.topic, self.consumer_name)
        except pulsar.PulsarException as exc:
            raise EmitError(f"subscribing {BATCH_READER_SUBSCRIPTION!r} on {sub.topic} "
                            f"({self.service_url}) to read batches for their index acks "
                            f"failed: {exc}") from exc
        last: Position | None = None
        pending: list[Any] = []
        try:
            for a in acks:
                near = (last is not None and a.target.ledger == last.ledger
                        and last.entry < a.target.entry <= last.entry + READ_AHEAD)
                if not near:
                    self._call(sub, "seek of the batch reader", reader.seek,
                               pulsar.MessageId(sub.partition, a.target.ledger,
                                                a.target.entry, -1))
                    pending = []
                batch, pending = read_batch(reader, a.target, pending)
                last = a.target
                if len(batch) != a.size:
                    log.warning("%s %s: not acking indexes of %s: the target's entry holds %d "
                                "messages where the plan's batch has %d", sub.topic,
                                sub.subscription, a, len(batch), a.size)
                    continue
                self._wait_connected(sub)
                for i in sorted(a.indexes):
                    self._call(sub, "batch-index ack", sub.consumer.acknowledge,
                               batch[i].message_id())
                    sent += 1
        finally:
            try:
                reader.unsubscribe()
            except pulsar.PulsarException as exc:
                log.warning("%s: the batch reader's subscription %r was not removed (%s); "
                            "remove it with pulsar-admin topics unsubscribe", sub.topic,
                            BATCH_READER_SUBSCRIPTION, exc)
        log.debug("%s %s: acked %d messages by batch index", sub.topic, sub.subscription, sent)
        return sent

    def _wait_connected(self, sub: _Subscription) -> None:
        deadline = time.monotonic() + self.operation_timeout_seconds
        while not sub.consumer.is_connected():
            if time.monotonic() > deadline:
                raise TargetUnreachableError(
                    f"the consumer of {sub.topic} {sub.subscription!r} lost its connection to "
                    f"{self.service_url} and did not reconnect within "
                    f"{self.operation_timeout_seconds}s; nothing more was acked"
                )
            time.sleep(0.05)

    def _call(self, sub: _Subscription, what: str, fn: Callable[[Any], object], arg: Any) -> None:
        """``fn(arg)``, turning a client failure into an EmitError naming topic and subscription."""
        try:
            fn(arg)
        except pulsar.PulsarException as exc:
            raise EmitError(
                f"{what} on {sub.topic} {sub.subscription!r} ({self.service_url}) failed: {exc}"
            ) from exc
