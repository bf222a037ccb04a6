"""Failover to b on three clusters (issue 34): the namespace replicated to a, b and c in full
mesh, messages produced on all three, the job syncing a -> b.

One live workload for the module (:mod:`cursorsync_devtools.testbed.three_clusters`) on the
three-cluster bed: a, b and c produce (batched and unbatched, several producers); on a,
one Shared subscription per evidence strategy list below consumes everything a holds
(its own messages, and its copies of b's and c's) and acks the same seeded part of it,
leaving some of c's messages unacked. Each topic partition's first ledger has the same
id on a and on c, so some of c's stamps name entries a holds and acked while c's
message is unacked on a (the workload checks there are some). A job per strategy list
runs through the workload, as ``cursorsync run`` runs it, syncing that list's
subscription a -> b with tables and checkpoints of its own (the jobs share the source
and target clusters and nothing else). Once each has caught up, they stop, and each
subscription fails over to b, every delivery counted per origin.

What is expected of the product, for every strategy list:

* the job starts and, after the failover, b loses nothing: no message of any origin that
  a did not ack goes undelivered on b, and no foreign message (on b only) is acked; or
* ``cursorsync check`` and the job refuse the list for this topology: the job's start
  (or its first batches) fails with a ``ConfigError`` whose message names the topic, the
  clusters and the strategy.

Which strategy lists are refused is the product's decision: the test asks ``cursorsync
check`` (:func:`job_on_bed.refusal`) and holds the job to the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from cursorsync.errors import CursorSyncError
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.three_clusters import (
    ORIGINS,
    ThreeClusterSpec,
    create_three_cluster_subscriptions,
    create_three_cluster_topics,
    stamp_exposure,
)
from cursorsync_devtools.testbed.workload import WorkloadSpec
from tests.support.job_on_bed import (
    ThreeClusterRuns,
    refusal,
    refused_start,
    run_three_clusters,
    strategy_subscription,
    three_cluster_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

STRATEGY_LISTS: list[tuple[str, ...]] = [
    ("position-property", "identity"),  # the default
    ("identity",),
    ("position-property",),
    ("snapshot",),
    ("identity", "snapshot"),
]


TOPICS = ("three-orders", "three-audit", "three-blobs")


@pytest.fixture(scope="module")
def three_runs(three_testbed: TestBed, tmp_path_factory: pytest.TempPathFactory
               ) -> ThreeClusterRuns:
    """The module's workload with a job per strategy list that ``cursorsync check`` does
    not refuse; checks that the workload can show the failure of issue 34 (c's stamps
    read as positions on a) and that a's cursors match its ground truth."""
    bed = three_testbed
    spec = ThreeClusterSpec(
        base=WorkloadSpec(partitioned_topic=TOPICS[0], plain_topic=TOPICS[1],
                          chunked_topic=TOPICS[2], partitions=2, chunked_messages=2,
                          entries_per_partition=80, produce_seconds=6.0,
                          foreign_per_partition=3, subscription_types=("Shared",), seed=34),
        subscriptions=tuple(strategy_subscription(s) for s in STRATEGY_LISTS))
    shared = create_three_cluster_topics(bed, spec)
    create_three_cluster_subscriptions(bed, spec)
    work = tmp_path_factory.mktemp("three-jobs")
    configs = {s: three_cluster_config(bed, list(spec.topics()), s, work / "+".join(s))
               for s in STRATEGY_LISTS}
    accepted = {s: c for s, c in configs.items() if refusal(c) is None}
    runs = run_three_clusters(bed, spec, accepted)
    result = runs.result
    for sub in spec.subscriptions:
        acked = result.acked[sub]
        for origin in ORIGINS:
            keys = [m.key for m in result.messages if m.origin == origin]
            assert keys and 0 < sum(k in acked for k in keys) < len(keys), (sub, origin)
        exposed = stamp_exposure(bed, result, sub)
        print(f"{sub}: {exposed} of c's messages exposed; first ledgers shared by a and c: "
              f"{ {p.rsplit('/', 1)[-1]: str(pos) for p, pos in shared.items()} }")
        assert exposed >= 5, (sub, exposed, shared)
    return runs


def refusal_pattern(strategies: Sequence[str]) -> str:
    """A message naming one of the workload's topics and one of the strategies."""
    topics = "|".join(re.escape(t) for t in TOPICS)
    named = "|".join(re.escape(s) for s in strategies)
    return rf"(?s)(?=.*(?:{topics}))(?=.*(?:{named}))"


@pytest.mark.parametrize("strategies", STRATEGY_LISTS, ids="+".join)
def test_failover_to_b_loses_no_message_of_any_origin(
        three_testbed: TestBed, three_runs: ThreeClusterRuns, strategies: tuple[str, ...],
        tmp_path: Path) -> None:
    if strategies not in three_runs.runs:  # cursorsync check refused it
        config = three_cluster_config(three_testbed, TOPICS, strategies,
                                      tmp_path)
        with pytest.raises(CursorSyncError, match=refusal_pattern(strategies)):
            refused_start(config)
        return
    run = three_runs.runs[strategies]
    if isinstance(run, CursorSyncError):
        raise AssertionError(f"cursorsync check accepts {strategies}, but the job "
                             f"stopped: {run}") from run
    exposed = stamp_exposure(three_testbed, three_runs.result, run.subscription)
    table = f"{run.table()}\nc's messages a stamp reading would lose: {exposed}"
    print(table)
    assert {o: c.losses for o, c in run.by_origin.items()} == dict.fromkeys(ORIGINS, 0), table
    assert run.total().foreign_acked == 0, table
    assert run.total().foreign > 0 and all(
        c.messages and c.acked_on_source for c in run.by_origin.values()), table
    if strategies == ("identity",):
        # Three regions in full mesh are an ordinary deployment: this list works there,
        # its duplicates only those no broker statistic or mapping can avoid.
        assert run.total().unexplained == 0, table
