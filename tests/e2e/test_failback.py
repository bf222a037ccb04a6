"""Failback end to end on the real test bed, as docs/operation.md ("Failback") says to do it.

1. a -> b: the workload produces and acks on a (a Shared and a Failover subscription of a
   partitioned, a plain and a chunked topic, Pulsar's replicated subscriptions beside
   them) while the job syncs a -> b; it catches up, ``status --ready`` is asked, it stops.
2. Failover: the consumers move to b and acknowledge part of what b delivers by a plan of
   their own (prompt, late, never: holes; part of a batch), and the producers move too:
   new messages on b, replicated to a. A straggler publishes a few messages on a alone.
3. b -> a: the a -> b configuration with the clusters swapped and tables and checkpoints
   of its own passes ``cursorsync check``, runs while the consumers work on b, and catches
   up once they stop; ``status --ready`` must say READY; it stops.
4. Failback: a consumer per subscription drains a, acking nothing. Nothing is lost (every
   message acked on neither cluster is delivered, whichever cluster published it), no
   message only a holds is acked, and every duplicate (acked, delivered again) is explained:
   a batch not wholly acked, a chunked message, an ack after the last sync.
5. To protect a again, the a -> b job resumes on its checkpoints and tables and catches up
   (no rewind seen, ``status --ready``), and ``cursorsync retire`` removes what the failback
   job made and nothing of the a -> b job's.

The failover to b is counted as well, from what b's consumers were delivered. Every
job's ``status --ready`` must say READY for every partition, the chunked topic's too:
b's chunks carry a's positions, read on b's admin API by the a -> b job as the target's
and by the b -> a job as the source's copies of a's originals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.failback import (
    CliAnswer,
    OnB,
    SyncRun,
    config_file,
    cursorsync_cli,
    failback_config,
    run_on_b,
    sync_through,
)
from cursorsync_devtools.testbed.failback_counts import (
    FAILBACK_ROWS,
    FAILOVER_ROWS,
    FailbackCounts,
    count_failback,
    failover_counts,
    on_a,
    render,
)
from cursorsync_devtools.testbed.failover import drain
from cursorsync_devtools.testbed.workload import (
    WorkloadResult,
    WorkloadSpec,
    create_target_subscriptions,
    create_topics,
    run_workload,
    sync_subscription,
    verify_source_cursors,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_failback_loses_nothing_and_explains_every_duplicate(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    t0 = time.monotonic()
    spec = WorkloadSpec(partitioned_topic=topic_name("orders"), plain_topic=topic_name("audit"),
                        chunked_topic=topic_name("blobs"), entries_per_partition=60,
                        produce_seconds=3.0, chunked_messages=2, seed=41)
    create_topics(testbed, spec)
    create_target_subscriptions(testbed, spec)
    names = list(spec.topics())
    topics = [testbed.topic(n) for n in names]
    partitions = {testbed.topic(n): testbed.partitions(n) for n in names}
    chunked = {testbed.topic(n) for n in names if n == spec.chunked_topic}
    kinds = list(spec.subscription_types)
    subs = [sync_subscription(k) for k in kinds]

    forward = demo_config(testbed, tmp_path / "a-to-b", topics=names, subscriptions=subs)
    forward_file = config_file(forward, tmp_path / "a-to-b.yaml")

    def phase_1() -> WorkloadResult:
        result = run_workload(testbed, spec)
        verify_source_cursors(testbed, result)
        return result

    earlier, run_1 = sync_through(forward, phase_1, lambda r: r.last_ack_at,
                                  partitions=partitions, chunked=chunked,
                                  config_path=forward_file)
    testbed.wait_replicated(names)

    # The failback job: the same configuration, clusters swapped, state of its own.
    back = failback_config(forward, tmp_path / "b-to-a")
    back_file = config_file(back, tmp_path / "failback.yaml")
    assert (back.source.name, back.target.name) == ("b", "a")
    checked = cursorsync_cli("check", "-c", str(back_file))
    assert checked.returncode == 0, (checked.document, checked.stderr)

    # Long enough on b that the failback job starts while the consumers work there.
    spec_b = replace(spec, entries_per_partition=36, produce_seconds=12.0, hole_fraction=0.15,
                     seed=spec.seed + 1, builtin=False)
    after, run_2 = sync_through(back, lambda: run_on_b(testbed, earlier, spec_b),
                                lambda o: o.last_ack_at, partitions=partitions,
                                chunked=chunked, config_path=back_file, traffic_first=True)
    testbed.wait_replicated(names, origin="b")

    # Failback: the consumers come home to a.
    b_on_a = on_a(testbed, earlier, after)
    drains = [(kind, sub, topic) for kind, sub in zip(kinds, subs, strict=True)
              for topic in topics]
    with ThreadPoolExecutor(len(drains)) as pool:
        drained = list(pool.map(lambda d: drain(testbed, d[2], d[1], d[0], cluster="a"), drains))
    columns: dict[str, dict[str, int]] = {}
    totals: dict[str, FailbackCounts] = {}
    for kind, sub in zip(kinds, subs, strict=True):
        per_origin = {"a": FailbackCounts(), "b": FailbackCounts()}
        for (k, _, topic), delivered in zip(drains, drained, strict=True):
            if k != kind:
                continue
            counted = count_failback(earlier, after, b_on_a, topic, sub, delivered,
                                     synced_at=run_2.synced_at)
            for origin, c in counted.items():
                per_origin[origin] = per_origin[origin].add(c)
        for origin, c in per_origin.items():
            columns[f"{kind} from {origin}"] = c.to_dict()
        totals[kind] = per_origin["a"].add(per_origin["b"])
    failover = {k: failover_counts(earlier, after, s, topics).to_dict()
                for k, s in zip(kinds, subs, strict=True)}

    # To protect a again: the a -> b job resumes on its checkpoints and tables; the failback
    # job is retired.
    _, run_3 = sync_through(forward, time.time, lambda t: t, partitions=partitions,
                            chunked=chunked, config_path=forward_file)
    statuses = {name: cursorsync_cli("status", "-c", str(f))
                for name, f in (("a -> b", forward_file), ("b -> a", back_file))}
    retired = cursorsync_cli("retire", "-c", str(back_file), json_output=False)
    left = {c: set(testbed.internal_stats(c, partitions[topics[0]][0])["cursors"])
            for c in ("a", "b")}
    report = _report(earlier, after, {"a -> b": run_1, "b -> a": run_2, "a -> b again": run_3},
                     checked, columns, failover, time.monotonic() - t0)
    print(report)

    for c in totals.values():
        assert c.losses == 0, report
        assert c.foreign_acked == 0 and c.foreign > 0, report
        assert c.unexplained == 0, report
        assert c.duplicates == c.partial_batch + c.chunked + c.acked_after_sync, report
        assert c.messages > 0 and c.acked_on_b > 0 and c.deliveries > 0, report
    for counts in failover.values():
        assert counts["losses"] == 0 and counts["unexplained"] == 0, report
        assert counts["foreign_acked"] == 0, report
    for kind in kinds:  # b's own messages are there, and some of them were left unacked
        b = columns[f"{kind} from b"]
        assert b["messages"] > 0 and 0 < b["acked_on_source"] < b["messages"], report
    for run in (run_1, run_2, run_3):
        assert run.ready is not None
        assert not_ready(run.ready) == [], report
    for name, status in statuses.items():
        assert status.returncode == 0, (name, status.stderr)
        rewound = {s["subscription"]: s["rewound_entries"]
                   for s in status.document["subscriptions"]}
        assert set(rewound.values()) == {0}, (name, rewound)
    assert retired.returncode == 0, (retired.document, retired.stderr)
    # What the failback job made is gone; the a -> b job's own and the synced ones stay.
    assert "cursorsync-mapping-target" not in left["a"], left
    assert "cursorsync-mapping-source" not in left["b"], left
    assert {"cursorsync-mapping-source", *subs} <= left["a"], left
    assert {"cursorsync-mapping-target", *subs} <= left["b"], left


def _report(earlier: WorkloadResult, after: OnB, runs: dict[str, SyncRun], checked: CliAnswer,
            columns: dict[str, dict[str, int]], failover: dict[str, dict[str, int]],
            seconds: float) -> str:
    """The counts, with what the jobs and gates said."""
    lines = [f"failover a -> b, then failback b -> a: {len(earlier.messages)} messages "
             f"published on a, {len(after.messages)} on b after failover, "
             f"{len(after.foreign_on_a)} on a alone; {seconds:.0f} s in all",
             f"check -c failback.yaml: exit {checked.returncode}, "
             f"{checked.document.get('problems')} problems, "
             f"{checked.document.get('warnings')} warnings"]
    for name, run in runs.items():
        ready = run.ready
        verdict = ("?" if ready is None else "READY" if ready.returncode == 0
                   else f"NOT READY ({ready.returncode}): {_reasons(ready.document)}")
        lines.append(f"job {name}: caught up {run.caught_up_s:.1f} s after the last ack, "
                     f"{run.sync_batches} sync batches, {run.mapping_batches} mapping batches, "
                     f"{run.restarts} restarts; status --ready: {verdict}")
    lines.append(f"the failback job's first batch came "
                 f"{runs['b -> a'].first_batch_at - after.started_at:.1f} s after the consumers "
                 f"moved to b, who were done {after.last_ack_at - after.started_at:.1f} s after")
    lines += ["", "failover to b (deliveries to b's consumers):",
              render(failover, FAILOVER_ROWS), "", "failback to a (drained on a):",
              render(columns, FAILBACK_ROWS)]
    return "\n".join(lines)


def not_ready(answer: CliAnswer) -> list[str]:
    """What ``status --ready`` holds against a failover: its blockers, and a line per
    partition not ready."""
    doc = answer.document
    if answer.returncode not in (0, 1) or "partitions" not in doc:
        return [f"status --ready exited {answer.returncode}: {answer.stderr or doc}"]
    return [f"blocker: {b}" for b in doc["blockers"]] + [
        f"{p['partition_topic']} {p['subscription']}: {', '.join(p['reasons'])}"
        for p in doc["partitions"] if not p["ready"]]


def _reasons(document: dict[str, object]) -> str:
    """A readiness document's reasons, one per partition not ready."""
    parts = document.get("partitions")
    if not isinstance(parts, list):
        return str(document)[:300]
    return "; ".join(f"{p['partition_topic']} {p['subscription']}: {', '.join(p['reasons'])}"
                     for p in parts if not p["ready"]) or str(document.get("blockers"))
