"""The main job on its embedded default, and the failover check that proves it.

1. The test bed: two Apache Pulsar clusters a and b, geo-replicated both ways
   (:mod:`cursorsync_devtools.testbed`), with Pulsar's replicated subscriptions on.
2. The job (the same code as ``cursorsync run``, ``by-id`` emission) starts,
   syncing the ``sync-*`` subscriptions from a to b.
3. A live workload on a (:mod:`cursorsync_devtools.testbed.workload`), in a process of
   its own as a user's clients are (:mod:`cursorsync_devtools.testbed.apart`): per subscription
   type, a ``sync-*`` subscription and its ``builtin-*`` twin, created with
   replicated subscription state, acked alike (out of order, delayed, holes,
   partial batches); foreign messages produced on b.
4. The job runs until its own progress says it has caught up with the last ack
   on a; the built-in's cursors on b until they stop moving. Both times are
   reported.
5. Failover: the job stops, cursorsync's redelivery forecast is taken (what
   ``cursorsync status --forecast`` prints), a consumer attaches to each subscription on b
   and every delivery is counted (:mod:`cursorsync_devtools.testbed.failover`), for
   cursorsync and for Pulsar's built-in side by side, as measured, each explained kind
   beside its forecast. The same subscriptions are then restarted on a and counted alike:
   what a's brokers hold of partially acked batches.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC
from pathlib import Path
from typing import Any

from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, Config, load_config, parse_config
from cursorsync.errors import CursorSyncError
from cursorsync_devtools import batch_figures
from cursorsync_devtools.demo_report import DemoReport

log = logging.getLogger(__name__)

class DemoError(CursorSyncError):
    """The demo could not complete; the message says which step and why."""


def demo_config(bed: Any, work_dir: Path, *, topics: Sequence[str], subscriptions: Sequence[str],
                strategies: Sequence[str] | None = None, base: Config | None = None,
                spread: bool = False, identity_scope: str | None = None,
                backend: str | None = None, spark_conf: dict[str, str] | None = None,
                admin_urls: dict[str, str] | None = None, holes: str | None = None,
                batch_index_acks: bool = False, cursor_digests: bool = False,
                kept_readers: int | None = None) -> Config:
    """The embedded config with the test bed's URLs, the topics and the work dir filled in.

    ``admin_urls``: admin URLs to use instead of the bed's, per cluster (a proxy, say).
    ``batch_index_acks``: carry partly acked batches; ``cursor_digests``: ask the source
    brokers which cursors moved (both need the plugin on the bed's brokers).
    ``kept_readers``: both clusters' ``kept_readers`` (None: the config's)."""
    cfg = base or load_config(EMBEDDED_CONFIG_PATH)
    admin = {c: (admin_urls or {}).get(c) or bed.admin_url(c) for c in ("a", "b")}
    cfg = cfg.with_cluster("source", service_url=bed.service_url("a"), admin_url=admin["a"])
    cfg = cfg.with_cluster("target", service_url=bed.service_url("b"), admin_url=admin["b"])
    data = cfg.model_dump(mode="json", by_alias=True)
    data["topics"] = [{"topic": bed.topic(t), "subscriptions": list(subscriptions)}
                      for t in topics]
    data["tables"]["path"] = str(work_dir / "tables")
    data["spark"]["checkpoint_dir"] = str(work_dir / "checkpoints")
    if strategies:
        data["evidence"]["strategies"] = list(strategies)
    if identity_scope:
        data["evidence"]["identity_scope"] = identity_scope
    if holes:
        data["evidence"]["holes"] = holes
    if backend:
        data["tables"]["backend"] = backend
    if spark_conf:
        data["spark"]["conf"] = {**data["spark"]["conf"], **spark_conf}
    data["emission"]["spread_across_executors"] = spread
    data["emission"]["batch_index_acks"] = batch_index_acks
    data["spark"]["cursor_digests"] = cursor_digests
    if kept_readers is not None:
        for side in ("source", "target"):
            data["clusters"][side]["kept_readers"] = kept_readers
    return parse_config(data)


#: Snapshot evidence alone: how long after its last acks a cursor must stay quiet to count as
#: caught up (the brokers' snapshot interval, 1 s, plus the builder's tail watch at work).
ANCHOR_SETTLE_S = 10.0


def caught_up(store: Any, config: Config, *, after: float, since_batch: int,
              partitions: dict[str, list[str]], chunked: set[str]) -> float | str:
    """When the sync caught up with the source as it was at ``after`` (epoch seconds), or
    what it still waits on (a sentence naming the cursor) if it has not yet.

    Caught up: for every (topic partition, subscription), a sync batch planned from a
    source state known current after ``after`` (read then, or confirmed unchanged by the
    topic stats) and its plan was exact with nothing unmapped, and a later batch sent no
    acks (the target already showed everything). A chunked topic's acked chunks stay
    unmapped (README, Limits), so for it two batches after ``after`` sending nothing is
    the test. Rows from ``since_batch`` on are read. The time returned is the newest
    emitted_at among the batches up to that quiet one that sent acks, or the first batch
    after ``after`` when none did. Snapshot evidence alone makes no segment, so no plan is
    exact: quiet batches spanning :data:`ANCHOR_SETTLE_S` after the last that sent acks are
    the test (the anchor that covers the last message is written after it).
    """
    from cursorsync.pulsar.topics import TopicName
    from cursorsync.tables import RowFilter

    if not store.exists("sync_progress"):
        return "the sync_progress table, which no sync batch has written yet"
    rows = store.read("sync_progress", RowFilter.of(
        source_cluster=config.source.name, target_cluster=config.target.name,
        min_batch_id=since_batch)).to_pylist()
    by_key: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        current = r["source_observed_at"].replace(tzinfo=UTC).timestamp()
        if current > after:
            by_key.setdefault((r["topic"], r["partition"], r["subscription"]), []).append(r)
    done_at = after
    segments = bool({"position-property", "identity"} & set(config.evidence.strategies))
    for spec in config.topics:
        for p in partitions[spec.topic]:
            tn = TopicName.parse(p)
            for sub in spec.subscriptions:
                got = sorted(by_key.get((str(tn.base), tn.partition, sub), []),
                             key=lambda r: r["batch_id"])
                settled = _settled(got, exact_needed=spec.topic not in chunked and segments,
                                   quiet_for_s=0.0 if segments else ANCHOR_SETTLE_S)
                if isinstance(settled, str):
                    return f"{p} {sub}: {settled}"
                last_sent = [r for r in settled if r["acks_sent"]]
                moment = (last_sent[-1] if last_sent else settled[0])["emitted_at"]
                done_at = max(done_at, moment.replace(tzinfo=UTC).timestamp())
    return done_at - after


def _settled(got: list[dict[str, Any]], *, exact_needed: bool,
             quiet_for_s: float = 0.0) -> list[dict[str, Any]] | str:
    """One cursor's sync_progress rows (by batch) up to the quiet batch that shows it caught
    up, or why there is none yet. The exact plan may come after quiet batches: unmapped
    entries past the last mapped one (markers the source wrote last) are looked up only
    once the mapping has stopped moving. With ``quiet_for_s``, the quiet batch must come that
    long after the last batch that sent acks (or after the first batch)."""
    first = 0
    if exact_needed:
        exact = [i for i, r in enumerate(got)
                 if r["outcome"] == "exact" and not r["unmapped_acked_entries"]]
        if not exact:
            last = got[-1] if got else None
            return ("no exact plan with nothing unmapped yet" + (
                f" (last: outcome {last['outcome']}, {last['unmapped_acked_entries']} acked "
                "entries unmapped)" if last else ""))
        first = exact[0]
    if not got:
        return "no sync batch since the workload's end"
    quiet = [i for i, r in enumerate(got) if r["acks_sent"] == 0 and i > first]
    if quiet_for_s:
        sent = [r["emitted_at"] for r in got if r["acks_sent"]] or [got[0]["emitted_at"]]
        quiet = [i for i in quiet
                 if (got[i]["emitted_at"] - max(sent)).total_seconds() >= quiet_for_s]
    if not quiet:
        return (f"{len(got)} batches since the workload's end, none after batch "
                f"{got[first]['batch_id']} sending no acks")
    return got[: quiet[0] + 1]


class _InjectedCrash(RuntimeError):
    """Raised inside a sync batch, after its acks went out and before its tables were written."""


def demo(*, bed: Any = None, work_dir: str | None = None, keep: bool = False,
         spec: Any = None, strategies: Sequence[str] | None = None,
         identity_scope: str | None = None, spread: bool = False,
         backend: str | None = None, spark_conf: dict[str, str] | None = None,
         crash_sync_batch: int | None = None, crash_mapping_claims: bool = False,
         carry_batches: bool | None = None, cursor_digests: bool = False,
         kept_readers: int | None = None, timeout_s: float = 240.0,
         admin_urls: dict[str, str] | None = None, holes: str | None = None,
         restart_on_source: bool = False, watch_builtin: bool = True) -> DemoReport:
    """Test bed, job, workload, catch-up, failover check (see the module doc).

    ``bed``: a running :class:`~cursorsync_devtools.testbed.TestBed` to use (the tests share one);
    None starts one and stops it at the end. ``crash_sync_batch``: kill the sync query in
    that batch after emitting and before writing its tables, then start the job again
    from its checkpoint. ``crash_mapping_claims``: the same for the mapping query, in its
    first batch that claimed skipped ids (checked, probes acked, nothing written).
    A ``spec`` with ``batch_index_acks`` starts its own bed with the brokers keeping
    batch-index acks and cursorsync's broker plugin loaded, and the job carries partly
    acked batches (a given ``bed`` must be such a bed); ``carry_batches`` False runs the job
    without carrying them on such a bed (None: as the spec says). ``cursor_digests``: the
    job asks the source brokers' plugin which cursors moved (a given ``bed`` needs the
    plugin; an own bed loads it). ``kept_readers``: the mapping readers each worker keeps
    open (None: the config's). ``restart_on_source``:
    also count what a restart on a would deliver again (about 8 s more). ``watch_builtin``:
    follow the built-in's cursors on b from the start, for when they last moved (an
    ``internalStats`` of every partition each poll, a load on b's brokers and this
    process); False follows them only after the sync caught up, to fail the built-in over
    once they are still (``builtin_settled_s`` None).
    """
    from cursorsync_devtools.testbed import (
        PULSAR_VERSION,
        TestBed,
        TestBedConfig,
        broker_plugin_path,
    )
    from cursorsync_devtools.testbed.workload import WorkloadSpec

    t0 = time.monotonic()
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cursorsync-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    spec = spec or WorkloadSpec()
    own_bed = bed is None
    if own_bed:
        on = {"acknowledgmentAtBatchIndexLevelEnabled": "true"}
        settings = {"a": on, "b": on} if spec.batch_index_acks else {}
        plugin = (broker_plugin_path() if spec.batch_index_acks or cursor_digests
                  else None)
        bed = TestBed(TestBedConfig(work_dir=root / "pulsar", settings=settings,
                                    broker_plugin=plugin)).start()
    try:
        report = _run(bed, root, spec, strategies=strategies, identity_scope=identity_scope,
                      spread=spread, backend=backend, spark_conf=spark_conf,
                      crash_sync_batch=crash_sync_batch,
                      crash_mapping_claims=crash_mapping_claims, timeout_s=timeout_s,
                      admin_urls=admin_urls, holes=holes,
                      restart_on_source=restart_on_source,
                      carry_batches=(spec.batch_index_acks if carry_batches is None
                                     else carry_batches), cursor_digests=cursor_digests,
                      kept_readers=kept_readers, watch_builtin=watch_builtin)
        return replace(report, pulsar_version=PULSAR_VERSION, seconds=time.monotonic() - t0)
    finally:
        if own_bed:
            bed.stop()
        if not keep and not work_dir:
            shutil.rmtree(root, ignore_errors=True)


def _run(bed: Any, root: Path, spec: Any, *, strategies: Sequence[str] | None,
         identity_scope: str | None, spread: bool, backend: str | None,
         spark_conf: dict[str, str] | None, crash_sync_batch: int | None,
         timeout_s: float, crash_mapping_claims: bool = False,
         admin_urls: dict[str, str] | None = None,
         holes: str | None = None, restart_on_source: bool = True,
         carry_batches: bool = False, cursor_digests: bool = False,
         kept_readers: int | None = None, watch_builtin: bool = True) -> DemoReport:
    from cursorsync.app.job import QueryFailedError, restart, start_job
    from cursorsync.tables import open_store
    from cursorsync_devtools.testbed.apart import in_own_process
    from cursorsync_devtools.testbed.failover import CursorWatch, failover
    from cursorsync_devtools.testbed.workload import (
        builtin_subscription,
        create_target_subscriptions,
        create_topics,
        run_workload,
        sync_subscription,
        verify_source_cursors,
    )

    # The job's tables and checkpoints describe one test bed's topics; a work dir used
    # by an earlier demo holds another bed's ledger ids under the same topic names.
    for state in ("tables", "checkpoints"):
        shutil.rmtree(root / state, ignore_errors=True)
    create_topics(bed, spec)
    create_target_subscriptions(bed, spec)
    topics = list(spec.topics())
    config = demo_config(bed, root, topics=topics,
                         subscriptions=[sync_subscription(k) for k in spec.subscription_types],
                         strategies=strategies, spread=spread, identity_scope=identity_scope,
                         backend=backend, spark_conf=spark_conf, admin_urls=admin_urls,
                         holes=holes, batch_index_acks=carry_batches,
                         cursor_digests=cursor_digests, kept_readers=kept_readers)
    partitions = {bed.topic(t): bed.partitions(t) for t in topics}
    chunked = {bed.topic(spec.chunked_topic)} if spec.chunked_topic else set()
    watches = [CursorWatch(bed, [p for parts in partitions.values() for p in parts],
                           builtin_subscription(k))
               for k in spec.subscription_types] if spec.builtin else []
    if watch_builtin:
        for w in watches:
            w.start()
    job = start_job(config)
    restarts = sync_batches = mapping_batches = 0
    crashed: list[int] = []
    try:
        if crash_sync_batch is not None:
            def crash(batch_id: int) -> None:
                if batch_id == crash_sync_batch and not crashed:
                    crashed.append(batch_id)
                    raise _InjectedCrash(f"injected crash in sync batch {batch_id}")
            job.sync_sink.crash_after_emit = crash
        if crash_mapping_claims:
            def crash_mapping(batch_id: int, outcome: Any) -> None:
                if not crashed and outcome.skipped_claimed:
                    crashed.append(batch_id)
                    raise _InjectedCrash(f"injected crash in mapping batch {batch_id}, after "
                                         f"{outcome.skipped_claimed} skipped ids were claimed")
            job.mapping_sink.crash_after_process = crash_mapping
        def next_batch(timeout: float) -> None:
            """One more batch; a failed query is restarted as ``cursorsync run`` does."""
            nonlocal job, restarts, sync_batches, mapping_batches
            try:
                job.wait_batches(1, timeout_s=timeout)
            except QueryFailedError as err:
                sync_batches += job.sync_sink.last_batch + 1
                mapping_batches += job.mapping_sink.last_batch + 1
                restarts += 1
                job = restart(job, config, err, restarts)

        next_batch(120)
        log.info("demo: the job runs; starting the workload")
        workload_began = time.time()
        workload = in_own_process(run_workload, bed, spec)
        result = workload.value
        since_batch = job.sync_sink.last_batch
        verify_source_cursors(bed, result)
        store = open_store(config.tables.backend, config.tables.path, spark=job.spark)
        deadline = time.monotonic() + timeout_s
        caught: float | str = "the first sync batch after the workload"
        # When the mapping last had no skipped target id waiting for its check: the sync
        # has caught up only with batches after it (the markers claimed last are acked).
        checked_at: float | None = None
        while isinstance(caught, str):
            if time.monotonic() > deadline:
                raise DemoError(f"the sync did not catch up within {timeout_s:.0f} s of the "
                                f"workload's end; it waits on {caught}")
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
            after = max(result.last_ack_at, checked_at)
            caught = caught_up(store, config, after=after,
                               since_batch=since_batch if not restarts else 0,
                               partitions=partitions, chunked=chunked)
            if not isinstance(caught, str):
                caught += after - result.last_ack_at  # from the last ack on a
        if not watch_builtin:  # only to fail the built-in over once its cursors are still
            for w in watches:
                w.start()
        sync_batches += job.sync_sink.last_batch + 1
        mapping_batches += job.mapping_sink.last_batch + 1
        batch_seconds = batch_figures.batch_seconds(job.sync_sink.metrics)
        phases = batch_figures.phase_seconds(job.sync_sink.metrics)
        phases_cpu = batch_figures.phase_cpu_seconds(job.sync_sink.metrics)
        requests = batch_figures.skipped_id_requests(job.sync_sink.metrics)
        # Spark's phases around the job's own (since a restart: the running queries').
        spark_phases = batch_figures.trigger_phases(
            {q.name: [json.loads(p.json) for p in q.recentProgress] for q in job.queries},
            since_epoch_s=workload_began)
    finally:
        job.stop()
    marks: dict[str, dict[str, str]] = {sync_subscription(k): {} for k in
                                         spec.subscription_types}
    for p in (p for parts in partitions.values() for p in parts):
        cursors = bed.internal_stats("b", p).get("cursors", {})
        for sub, found in marks.items():
            if sub in cursors:
                found[p] = cursors[sub]["markDeletePosition"]
    forecast = taken_forecast(config, {sync_subscription(k): k for k in spec.subscription_types})
    settled: float | None = max((w.settle() - result.last_ack_at for w in watches),
                                default=0.0)
    if not watch_builtin:
        settled = None  # the watch began after the sync caught up: when it last moved is unknown
    checks: list[tuple[str, str, float | None]] = [
        (kind, sync_subscription(kind), result.last_ack_at) for kind in spec.subscription_types]
    if spec.builtin:
        checks += [(kind, builtin_subscription(kind), None) for kind in spec.subscription_types]
    with ThreadPoolExecutor(len(checks)) as pool:
        counted = list(pool.map(lambda c: failover(bed, result, c[1], c[0], synced_at=c[2]),
                                checks))
        # The same subscriptions restarted on a instead: what a's brokers hold of the
        # partially acked batches.
        on_a = (list(pool.map(lambda c: failover(bed, result, c[1], c[0], cluster="a"),
                              checks)) if restart_on_source else [None] * len(checks))
    ours: dict[str, dict[str, int]] = {}
    builtin: dict[str, dict[str, int]] = {}
    on_a_again: dict[str, dict[str, int]] = {}
    builtin_on_a_again: dict[str, dict[str, int]] = {}
    for (kind, sub, _), counts, again in zip(checks, counted, on_a, strict=True):
        mine = sub == sync_subscription(kind)
        (ours if mine else builtin)[kind] = counts.to_dict()
        if again is not None:
            (on_a_again if mine else builtin_on_a_again)[kind] = again.to_dict()
    return DemoReport(topics=[bed.topic(t) for t in topics],
                      evidence=list(config.evidence.strategies), pulsar_version="",
                      cursorsync=ours, builtin=builtin, sync_caught_up_s=caught,
                      builtin_settled_s=settled, sync_batches=sync_batches,
                      mapping_batches=mapping_batches, seconds=0.0,
                      workload=result.to_dict(), restarts=restarts, injected_crashes=len(crashed),
                      batch_seconds=batch_seconds, phase_seconds=phases,
                      phase_cpu_seconds=phases_cpu, spark_phases=spark_phases,
                      target_marks=marks,
                      skipped_id_requests=requests, forecast=forecast,
                      batch_index_acks=spec.batch_index_acks, source_restart=on_a_again,
                      builtin_source_restart=builtin_on_a_again,
                      workload_cpu_s=round(workload.cpu_s, 1))


def taken_forecast(config: Config, kinds: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``cursorsync status --forecast`` for the subscriptions (name -> subscription type):
    per type, each cause's figure over the subscription's partitions."""
    from cursorsync.app.forecast import by_subscription
    from cursorsync.app.forecast_read import forecast_now
    from cursorsync.app.status import subscription_status
    from cursorsync.tables import open_reader

    store = open_reader(config.tables.path, storage_options=dict(config.tables.storage_options))
    rows = [r for r in subscription_status(store, source_cluster=config.source.name,
                                           target_cluster=config.target.name)
            if r.subscription in kinds]
    subs = by_subscription(forecast_now(store, rows, config))
    out = {kinds[s.subscription]: s.to_dict()["causes"] for s in subs}
    log.info("demo: redelivery forecast before failover: %s", json.dumps(out))
    return out


def run_demo(*, json_output: bool = False, work_dir: str | None = None,
             keep: bool = False, **kwargs: Any) -> str:
    """Run everything and return the failover table (or JSON), with what a restart on a
    would deliver again beside it."""
    report = demo(work_dir=work_dir, keep=keep, restart_on_source=True, **kwargs)
    if json_output:
        return json.dumps(report.to_dict(), indent=2, sort_keys=True)
    return report.table()
