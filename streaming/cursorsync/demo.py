"""The main job on its embedded default, and the failover check that proves it.

1. Two pulsar-lite brokers as clusters A and B, replication A -> B emulated.
2. A workload on A: batched and unbatched producers, a partitioned topic and
   a plain one, consumers acking out of order with holes and partial batches;
   foreign messages produced on B.
3. The sync job (the same code as ``cursorsync run``) until every source cursor
   has been synced after the workload's last ack.
4. Failover: the job stops, consumers attach to B's subscriptions and count
   per message what they receive. Duplicates = received on B but acked on A
   before the last completed sync. Losses = not acked on A, never received on
   B. Foreign messages must all be received (never acked by us).

The same workload is scored for Pulsar's built-in replicated subscriptions,
at their best case: a snapshot exactly at the source markDeletePosition (only
the markDeletePosition moves; individual acks are never carried over), so
its duplicates are every acked message after the source markDeletePosition.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cursorsync.config import EMBEDDED_CONFIG_PATH, Config, load_config

log = logging.getLogger(__name__)


@dataclass
class FailoverCounts:
    messages: int = 0
    acked_on_source: int = 0
    received_on_target: int = 0
    duplicates: int = 0
    losses: int = 0
    partial_batch_duplicates: int = 0
    foreign_messages: int = 0
    foreign_acked: int = 0


@dataclass
class DemoReport:
    topics: list[str]
    subscription: str
    evidence: list[str]
    cursorsync: FailoverCounts
    builtin_best_case: FailoverCounts
    sync_batches: int
    mapping_batches: int
    seconds: float
    per_topic: dict[str, dict[str, int]] = field(default_factory=dict)
    restarts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        rows = [("", "cursorsync", "built-in (best case)")]
        for name in ("messages", "acked_on_source", "received_on_target", "duplicates",
                     "partial_batch_duplicates", "losses", "foreign_messages", "foreign_acked"):
            rows.append((name.replace("_", " "), str(getattr(self.cursorsync, name)),
                         str(getattr(self.builtin_best_case, name))))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a:<{w0}}  {b:>{w1}}  {c:>20}" for a, b, c in rows]
        head = (f"failover check: {', '.join(self.topics)} / subscription "
                f"{self.subscription!r}, evidence {', '.join(self.evidence)}\n"
                f"{self.mapping_batches} mapping and {self.sync_batches} sync batches in "
                f"{self.seconds:.1f} s\n")
        return head + "\n".join(lines)


def demo_config(sandbox: Any, work_dir: Path, *, topics: dict[str, int], subscription: str,
                strategies: list[str] | None = None, base: Config | None = None,
                spread: bool = False, identity_scope: str | None = None) -> Config:
    """The embedded config with the sandbox's URLs, topics and work dir filled in."""
    cfg = base or load_config(EMBEDDED_CONFIG_PATH)
    cfg = cfg.with_cluster("source", service_url=sandbox.service_url("A"),
                           admin_url=sandbox.admin_url("A"))
    cfg = cfg.with_cluster("target", service_url=sandbox.service_url("B"),
                           admin_url=sandbox.admin_url("B"))
    data = cfg.model_dump(mode="json", by_alias=True)
    data["topics"] = [{"topic": f"persistent://public/default/{name}", "subscriptions":
                       [subscription], "partitioned": bool(n)} for name, n in topics.items()]
    data["tables"]["path"] = str(work_dir / "tables")
    data["spark"]["checkpoint_dir"] = str(work_dir / "checkpoints")
    if strategies:
        data["evidence"]["strategies"] = strategies
    if identity_scope:
        data["evidence"]["identity_scope"] = identity_scope
    data["emission"]["spread_across_executors"] = spread
    for c in ("source", "target"):
        data["clusters"][c]["auth"] = {}
    from cursorsync.config import parse_config

    return parse_config(data)


def _ensure_target_subscriptions(sandbox: Any, topics: list[str], subscription: str) -> None:
    """Create B's subscriptions at the earliest position, as the DR consumers would have."""
    import pulsar

    client = sandbox.client("B")
    for t in topics:
        c = client.subscribe(t, subscription, consumer_type=pulsar.ConsumerType.Shared,
                             initial_position=pulsar.InitialPosition.Earliest,
                             receiver_queue_size=0)
        c.close()


def _receive_all(sandbox: Any, topic: str, subscription: str, timeout_ms: int = 1500) -> list[Any]:
    import pulsar

    client = sandbox.client("B")
    c = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                         initial_position=pulsar.InitialPosition.Earliest)
    got = []
    try:
        while True:
            try:
                got.append(c.receive(timeout_millis=timeout_ms))
            except pulsar.Timeout:
                break
    finally:
        c.close()
    return got


def failover_check(sandbox: Any, workload: Any, subscription: str) -> tuple[
        FailoverCounts, FailoverCounts, dict[str, dict[str, int]]]:
    """Switch to B and count, per message, duplicates and losses (and for built-in)."""
    ours = FailoverCounts()
    builtin = FailoverCounts()
    per_topic: dict[str, dict[str, int]] = {}
    source_state = sandbox.state("A")
    for topic in workload.topics():
        msgs = workload.messages_of(topic)
        acked_keys = {m.key for m in msgs if (topic, m.key) in workload.acked_at}
        acked_entries = workload.acked_entries(topic)
        received = _receive_all(sandbox, topic, subscription)
        got_keys = {r.properties().get("key") for r in received}
        foreign_keys = {f.key for f in workload.foreign if f.topic == topic}
        dup = sum(1 for k in got_keys if k in acked_keys)
        partial = sum(1 for m in msgs if m.key in got_keys and m.key in acked_keys
                      and m.position not in acked_entries)
        lost = sum(1 for m in msgs if m.key not in acked_keys and m.key not in got_keys)
        ours.messages += len(msgs)
        ours.acked_on_source += len(acked_keys)
        ours.received_on_target += len(received)
        ours.duplicates += dup
        ours.partial_batch_duplicates += partial
        ours.losses += lost
        ours.foreign_messages += len(foreign_keys)
        ours.foreign_acked += len(foreign_keys - got_keys)
        # Built-in best case: B's markDeletePosition at the counterpart of A's; nothing else.
        md = _source_mark_delete(source_state, topic, subscription)
        after_md = [m for m in msgs if md is None or m.position > md]
        builtin.messages += len(msgs)
        builtin.acked_on_source += len(acked_keys)
        builtin.received_on_target += len(after_md) + len(foreign_keys)
        builtin.duplicates += sum(1 for m in after_md if m.key in acked_keys)
        builtin.partial_batch_duplicates += sum(
            1 for m in after_md if m.key in acked_keys and m.position not in acked_entries)
        builtin.foreign_messages += len(foreign_keys)
        per_topic[topic] = {"messages": len(msgs), "duplicates": dup, "losses": lost,
                            "builtin_duplicates": sum(1 for m in after_md if m.key in acked_keys)}
    return ours, builtin, per_topic


def _source_mark_delete(state: Any, topic: str, subscription: str) -> Any:
    from cursorsync.sandbox.admin_server import internal_stats

    stats = internal_stats(state, topic)
    cur = stats.get("cursors", {}).get(subscription)
    if cur is None:
        return None
    from cursorsync.positions import Position

    return Position.parse(cur["markDeletePosition"])


def run_demo(*, json_output: bool = False, seconds: float = 60.0, work_dir: str | None = None,
             keep: bool = False, strategies: list[str] | None = None,
             stamp_source_position: bool = True, entries_per_partition: int = 60,
             seed: int = 7) -> str:
    """Run everything and return the failover table (or JSON)."""
    report = demo(seconds=seconds, work_dir=work_dir, keep=keep, strategies=strategies,
                  stamp_source_position=stamp_source_position,
                  entries_per_partition=entries_per_partition, seed=seed)
    if json_output:
        return json.dumps(report.to_dict(), indent=2, sort_keys=True)
    return report.table()


class _InjectedCrash(RuntimeError):
    """Raised inside a sync batch, after its acks went out and before its tables were written."""


def demo(*, seconds: float = 60.0, work_dir: str | None = None, keep: bool = False,
         strategies: list[str] | None = None, stamp_source_position: bool = True,
         entries_per_partition: int = 60, seed: int = 7, partial_batch_fraction: float = 0.2,
         crash_sync_batch: int | None = None, spread: bool = False,
         identity_scope: str | None = None) -> DemoReport:
    """Sandbox, workload, the job until caught up, then the failover check.

    ``crash_sync_batch``: kill the sync query in that batch after emitting and
    before writing its tables, then start the job again from its checkpoint.
    """
    from cursorsync.job import QueryFailedError, start_job
    from cursorsync.sandbox import ReplicatorOptions, Sandbox, SandboxConfig
    from cursorsync.sandbox.workload import WorkloadSpec, run_workload

    t0 = time.monotonic()
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cursorsync-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    spec = WorkloadSpec(entries_per_partition=entries_per_partition, seed=seed,
                        partial_batch_fraction=partial_batch_fraction)
    os.environ.setdefault("CURSORSYNC_EMIT_MODE", "receive-first")  # pulsar-lite: see README
    sb_cfg = SandboxConfig(topics=spec.topics, work_dir=root / "brokers",
                           replicator=ReplicatorOptions(stamp_source_position=stamp_source_position))
    restarts = 0
    try:
        with Sandbox(sb_cfg) as sandbox:
            topics = [t for name in spec.topics for t in sandbox.partitions(name)]
            _ensure_target_subscriptions(sandbox, topics, spec.subscription)
            workload = run_workload(sandbox, spec)
            if sandbox.replicator is None:
                raise RuntimeError("the sandbox was started without its replicator")
            sandbox.replicator.wait_caught_up(timeout_s=60)
            config = demo_config(sandbox, root, topics=spec.topics, subscription=spec.subscription,
                                 strategies=strategies, spread=spread,
                                 identity_scope=identity_scope)
            job = start_job(config)
            if crash_sync_batch is not None:
                def crash(batch_id: int) -> None:
                    if batch_id == crash_sync_batch:
                        raise _InjectedCrash(f"injected crash in sync batch {batch_id}")
                job.sync_sink.crash_after_emit = crash
            sync_batches = mapping_batches = 0
            try:
                deadline = time.monotonic() + seconds
                synced = False
                while time.monotonic() < deadline and not synced:
                    try:
                        job.wait_batches(1, timeout_s=max(1.0, deadline - time.monotonic()))
                        synced = _caught_up(job, config)
                    except QueryFailedError as err:
                        if "injected crash" not in str(err) or restarts:
                            raise
                        log.warning("the sync query died (%s): restarting from its checkpoint",
                                    err)
                        sync_batches += job.sync_sink.last_batch + 1
                        mapping_batches += job.mapping_sink.last_batch + 1
                        job.stop()
                        restarts += 1
                        job = start_job(config)
                job.wait_batches(1, timeout_s=30)
            finally:
                job.stop()
            ours, builtin, per_topic = failover_check(sandbox, workload, spec.subscription)
            return DemoReport(topics, spec.subscription, list(config.evidence.strategies),
                              ours, builtin, job.sync_sink.last_batch + 1,
                              job.mapping_sink.last_batch + 1, time.monotonic() - t0, per_topic,
                              restarts)
    finally:
        if not keep and not work_dir:
            shutil.rmtree(root, ignore_errors=True)


def _caught_up(job: Any, config: Config) -> bool:
    """Every observed subscription has an exact plan with nothing left to ack."""
    from cursorsync.tables import RowFilter, open_store

    store = open_store(config.tables.backend, config.tables.path)
    if not store.exists("sync_progress"):
        return False
    rows = store.read("sync_progress", RowFilter.of(min_batch_id=job.sync_sink.last_batch))
    if rows.num_rows == 0:
        return False
    outcomes = rows.column("outcome").to_pylist()
    unmapped = rows.column("unmapped_acked_entries").to_pylist()
    return all(o == "exact" for o in outcomes) and not any(unmapped)
