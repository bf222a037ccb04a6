"""Failback on the test bed: after a failover to b, consumers and producers work on b, a
job syncs b -> a, and the consumers come home to a, where every delivery is counted.

docs/operation.md, "Failback": the a -> b job's configuration with the clusters swapped
and tables and checkpoints of its own (:func:`failback_config`). While the consumers are
on b (:func:`run_on_b`) they acknowledge part of what b delivers (the backlog a left, and
what the producers, moved to b too, publish there, replicated to a), by a seeded plan of
their own: prompt, late, never (holes) or part of a batch. A straggler on a publishes a
few messages there only (``disable_replication``): foreign to the b -> a sync.

After failback, per subscription, a consumer drains a (:func:`drain`, acknowledging
nothing) and each message is counted (:func:`count_failback`, the failover's
:func:`~cursorsync_devtools.testbed.failover.count` on a ground truth for the way back):

* **acked**: by a's consumers before the failover, or by b's after it. Acked on a it
  stays acked on a whatever b did (acks cannot be taken back).
* **duplicate**: acked, and a delivers it again. Explained: a batch not wholly acked (its
  entry stays unacked on b, so the sync leaves a's unacked too), a chunked message (never
  mapped), an ack on b after the last completed sync. The rest is **unexplained**.
* **lost**: acked on neither cluster, and a never delivers it.
* **foreign**: the messages on a only; nobody acked them on b, so a must deliver them all.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pulsar
import yaml

from cursorsync.app.settings import Config, parse_config
from cursorsync.core.positions import Position
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed.acking import Decisions, consumer_type
from cursorsync_devtools.testbed.failover import (
    QUIET_S,
)
from cursorsync_devtools.testbed.testbed import TestBed, TestBedError
from cursorsync_devtools.testbed.workload import (
    Produced,
    WorkloadResult,
    WorkloadSpec,
    _plan,
    _Publisher,
    ack_choice,
    sync_subscription,
)

T = TypeVar("T")

#: The plan name b's consumers draw their choices for a's messages under (their own, so
#: they ack other entries than a's consumers did).
FAILBACK_PLAN = "failback"


# ------------------------------------------------------------------ configuration


def failback_config(config: Config, work_dir: Path) -> Config:
    """``config`` with source and target swapped (names, URLs, auth) and tables and
    checkpoints under ``work_dir``: the a -> b job's state binds to that direction."""
    data = config.model_dump(mode="json", by_alias=True)
    clusters = data["clusters"]
    clusters["source"], clusters["target"] = clusters["target"], clusters["source"]
    data["tables"]["path"] = str(work_dir / "tables")
    data["spark"]["checkpoint_dir"] = str(work_dir / "checkpoints")
    return parse_config(data)


def config_file(config: Config, path: Path) -> Path:
    """The configuration as the YAML file an operator hands ``cursorsync -c``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True)))
    return path


@dataclass(frozen=True)
class CliAnswer:
    """One ``cursorsync`` command run in a process of its own, as an operator runs it."""

    args: tuple[str, ...]
    returncode: int
    document: dict[str, Any]
    stderr: str


def cursorsync_cli(*args: str, json_output: bool = True, timeout_s: float = 180.0
                   ) -> CliAnswer:
    """``python -m cursorsync ARGS [--json]``: its JSON document, or ``{"lines": [...]}``
    for a command without ``--json`` (or output that is not JSON)."""
    extra = ["--json"] if json_output else []
    done = subprocess.run([sys.executable, "-m", "cursorsync", *args, *extra],
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    try:
        doc = json.loads(done.stdout) if json_output and done.stdout.strip() else {
            "lines": done.stdout.splitlines()}
    except json.JSONDecodeError:
        doc = {"lines": done.stdout.splitlines()}
    return CliAnswer(args, done.returncode, doc, done.stderr[-2000:])


# ------------------------------------------------------------------ the job


@dataclass
class SyncRun:
    """One job's run through traffic: how long it took to catch up, and the failover gate
    (``cursorsync status --ready``) when it had."""

    caught_up_s: float
    #: The last ack the traffic made, or later: every sync after it saw it.
    synced_at: float
    #: When the job's first sync batch was done (epoch seconds).
    first_batch_at: float
    restarts: int
    sync_batches: int
    mapping_batches: int
    ready: CliAnswer | None = None


def sync_through(config: Config, traffic: Callable[[], T], last_ack_at: Callable[[T], float],
                 *, partitions: dict[str, list[str]], chunked: set[str],
                 config_path: Path | None = None, traffic_first: bool = False,
                 timeout_s: float = 240.0) -> tuple[T, SyncRun]:
    """Run the job (restarted from its checkpoints when a query fails, as ``cursorsync run``
    does) through ``traffic`` until it has caught up with the last ack the traffic made
    (the demo's test, :func:`cursorsync_devtools.demo.caught_up`); then, with
    ``config_path``, ask ``cursorsync status --ready``, and stop the job.

    ``traffic_first``: the traffic starts before the job (consumers already moved), else
    once the job has run its first batch."""
    from cursorsync.app.job import QueryFailedError, restart, start_job
    from cursorsync.tables import open_store
    from cursorsync_devtools.demo import DemoError, caught_up

    with ThreadPoolExecutor(1, thread_name_prefix="traffic") as pool:
        work: Future[T] | None = pool.submit(traffic) if traffic_first else None
        job = start_job(config)
        restarts = sync_batches = mapping_batches = 0

        def next_batch(timeout: float) -> None:
            nonlocal job, restarts, sync_batches, mapping_batches
            try:
                job.wait_batches(1, timeout_s=timeout)
            except QueryFailedError as err:
                sync_batches += job.sync_sink.last_batch + 1
                mapping_batches += job.mapping_sink.last_batch + 1
                restarts += 1
                job = restart(job, config, err, restarts)

        try:
            next_batch(120)
            first_batch_at = time.time()
            work = work or pool.submit(traffic)
            value = work.result()
            acked_at = last_ack_at(value)
            since_batch = job.sync_sink.last_batch
            store = open_store(config.tables.backend, config.tables.path, spark=job.spark)
            deadline = time.monotonic() + timeout_s
            caught: float | str = "the first sync batch after the traffic"
            checked_at: float | None = None
            after = acked_at
            while isinstance(caught, str):
                if time.monotonic() > deadline:
                    raise DemoError(f"{config.source.name} -> {config.target.name}: the sync "
                                    f"did not catch up within {timeout_s:.0f} s of the last "
                                    f"ack; it waits on {caught}")
                before = restarts
                next_batch(max(1.0, deadline - time.monotonic()))
                if restarts != before:
                    continue
                waiting = job.mapping_sink.skipped_waiting
                if waiting:
                    checked_at = None
                    caught = f"{waiting} skipped target ids waiting for their check"
                    continue
                checked_at = checked_at or time.time()
                after = max(acked_at, checked_at)
                caught = caught_up(store, config, after=after,
                                   since_batch=since_batch if not restarts else 0,
                                   partitions=partitions, chunked=chunked)
                if not isinstance(caught, str):
                    caught += after - acked_at
            ready = None
            if config_path is not None:
                ready = cursorsync_cli("status", "-c", str(config_path), "--ready")
            sync_batches += job.sync_sink.last_batch + 1
            mapping_batches += job.mapping_sink.last_batch + 1
        finally:
            job.stop()
    return value, SyncRun(caught, after, first_batch_at, restarts, sync_batches,
                          mapping_batches, ready)


# ------------------------------------------------------------------ on b


class PlannedConsumer:
    """A subscription's consumer on one cluster: receives everything, keeps each delivery,
    and acknowledges per plan, on time, one message at a time (so holes stay)."""

    def __init__(self, bed: TestBed, cluster: str, topic: str, subscription: str, kind: str,
                 decisions: Decisions) -> None:
        self.topic = topic
        self.subscription = subscription
        self.decisions = decisions
        self.consumer = bed.client(cluster).subscribe(
            topic, subscription, consumer_type=consumer_type(kind),
            initial_position=pulsar.InitialPosition.Earliest)
        self.delivered: list[Any] = []
        self.acked: dict[str, float] = {}
        self.last_delivery = time.monotonic()
        self.error: BaseException | None = None
        self._due: list[tuple[float, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"consumer-{cluster}-{subscription}")

    def start(self) -> PlannedConsumer:
        self._thread.start()
        return self

    def keys(self) -> set[str]:
        return {m.properties().get("key") for m in self.delivered}

    def _decide(self, msg: Any) -> None:
        found = self.decisions.get(msg.properties().get("key", ""))
        if found is None:
            return
        choice, index = found
        if choice.kind == "never" or (choice.kind == "partial"
                                      and index >= choice.acked_indexes):
            return
        self._due.append((time.monotonic() + choice.delay_s, msg))
        self._due.sort(key=lambda d: d[0])

    def _ack_due(self) -> None:
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, msg = self._due.pop(0)
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
                self.delivered.append(msg)
                self.last_delivery = time.monotonic()
                self._decide(msg)
            while self._due:
                time.sleep(max(0.0, min(0.05, self._due[0][0] - time.monotonic())))
                self._ack_due()
        except BaseException as err:  # reported by finish()
            self.error = err

    def finish(self, expected: set[str], timeout_s: float) -> None:
        """Wait until every key in ``expected`` was delivered and nothing more came for
        QUIET_S; send the acks still due and close (which flushes them)."""
        deadline = time.monotonic() + timeout_s
        while self.error is None:
            missing = expected - self.keys()
            if not missing and time.monotonic() - self.last_delivery >= QUIET_S:
                break
            if time.monotonic() > deadline:
                raise TestBedError(f"{self.subscription} on {self.topic}: {len(missing)} "
                                   f"expected messages not delivered in {timeout_s:.0f} s "
                                   f"(e.g. {sorted(missing)[:3]})")
            time.sleep(0.1)
        self._stop.set()
        self._thread.join(timeout_s)
        self.consumer.close()
        if self.error is not None:
            raise TestBedError(f"{self.subscription} on {self.topic}: {self.error}")


@dataclass
class OnB:
    """What happened while the consumers were on b, the ground truth for failback."""

    spec: WorkloadSpec
    #: Published on b after the failover: position on b (``origin`` b).
    messages: list[Produced] = field(default_factory=list)
    #: Published on a only, after the failover (a straggler there): position on a.
    foreign_on_a: list[Produced] = field(default_factory=list)
    #: Per subscription: every delivery on b (pulsar messages), and key -> time of its ack.
    delivered: dict[str, list[Any]] = field(default_factory=dict)
    acked: dict[str, dict[str, float]] = field(default_factory=dict)
    started_at: float = 0.0
    last_ack_at: float = 0.0


def failback_decisions(spec: WorkloadSpec, earlier: WorkloadResult) -> Decisions:
    """What b's consumers do with each message of the first phase b may deliver (a's, and
    b's foreign ones): per entry a seeded choice of their own (prompt, late, never, part of
    a batch), whatever a's consumers did with it."""
    entries: dict[str, dict[Position, int]] = {}
    out: Decisions = {}
    for m in [*earlier.messages, *earlier.foreign]:
        numbered = entries.setdefault(m.topic, {})
        n = numbered.setdefault(m.position, len(numbered))
        choice = ack_choice(spec, f"{m.topic}@{FAILBACK_PLAN}", n, m.batch_size)
        out[m.key] = (choice, m.batch_index)
    return out


def publish_only_on(bed: TestBed, cluster: str, topic: str, count: int) -> list[Produced]:
    """``count`` messages on ``cluster`` alone (``disable_replication``)."""
    local = TopicName.parse(topic).local
    producer = bed.client(cluster).create_producer(
        topic, producer_name=f"{local}-only-{cluster}", batching_enabled=False)
    out = []
    try:
        for i in range(count):
            key = f"{local}:only-{cluster}-{i}"
            mid = producer.send(json.dumps({"key": key}).encode(),
                                properties={"key": key, "origin": cluster},
                                disable_replication=True)
            out.append(Produced(topic, key, Position(mid.ledger_id(), mid.entry_id()), -1, 0,
                                origin=cluster))
    finally:
        producer.close()
    return out


def run_on_b(bed: TestBed, earlier: WorkloadResult, spec: WorkloadSpec, *,
             foreign_on_a: int = 2, timeout_s: float = 90.0) -> OnB:
    """The consumers and producers after failover to b (see the module doc): per topic and
    ``sync-*`` subscription a consumer on b; ``spec.entries_per_partition`` entries per topic
    partition published on b over ``spec.produce_seconds`` (batches, delayed messages, no
    chunks: a's smaller maxMessageSize would not take b's); half way, ``foreign_on_a``
    messages per partition on a alone. Returns once every consumer has had every message
    published on b, sent its acks and closed."""
    rng = random.Random(spec.seed)
    out = OnB(spec, started_at=time.time())
    decisions = failback_decisions(spec, earlier)
    names = list(spec.topics())
    consumers = [PlannedConsumer(bed, "b", bed.topic(name), sync_subscription(kind), kind,
                                 decisions).start()
                 for name in names for kind in spec.subscription_types]
    parts = [p for name in names for p in bed.partitions(name)]
    plans = {p: _plan(rng, spec) for p in parts}
    publishers = {p: _Publisher(bed, p, spec, decisions, cluster="b") for p in parts}
    rounds = max(1, int(spec.produce_seconds * 4))
    per_round = max(1, -(-spec.entries_per_partition // rounds))
    t0 = time.monotonic()
    try:
        for r in range(rounds):
            for p in parts:
                for size in plans[p][r * per_round:(r + 1) * per_round]:
                    publishers[p].entry(size, rng)
            if r == rounds // 2:
                for p in parts:
                    out.foreign_on_a += publish_only_on(bed, "a", p, foreign_on_a)
            time.sleep(max(0.0, t0 + (r + 1) * spec.produce_seconds / rounds - time.monotonic()))
    finally:
        for pub in publishers.values():
            pub.close()
    for pub in publishers.values():
        out.messages += pub.out
    for c in consumers:
        expected = {m.key for m in out.messages if in_topic(m.topic, c.topic)}
        c.finish(expected, timeout_s)
        out.delivered.setdefault(c.subscription, []).extend(c.delivered)
        out.acked.setdefault(c.subscription, {}).update(c.acked)
    out.last_ack_at = max((t for acks in out.acked.values() for t in acks.values()),
                          default=out.started_at)
    return out


# ------------------------------------------------------------------ back on a


def in_topic(name: str, topic: str) -> bool:
    """Whether ``name`` is ``topic`` or one of its partitions."""
    return name == topic or name.startswith(topic + "-partition-")
