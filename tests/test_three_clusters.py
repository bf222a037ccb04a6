"""Failover to b on three clusters (issue 34): the namespace replicated to a, b and c in full
mesh, messages produced on all three, the job syncing a -> b.

One workload for the module (:mod:`cursorsync_devtools.testbed.three_clusters`) on the
three-cluster bed: a, b and c produce (batched and unbatched, several producers); on a,
one Shared subscription per evidence strategy list below consumes everything a holds
(its own messages, and its copies of b's and c's) and acks the same seeded part of it,
leaving some of c's messages unacked. Each topic partition's first ledger has the same
id on a and on c, so some of c's stamps name entries a holds and acked while c's
message is unacked on a (the workload checks there are some). Then, one strategy list
at a time, the real job syncs that list's subscription a -> b (tables and checkpoints
of its own; the others' subscriptions on b are untouched), and a consumer fails over
to b and counts every delivery per origin.

What is expected of the product, for every strategy list:

* the job starts and, after the failover, b loses nothing: no message of any origin that
  a did not ack goes undelivered on b, and no foreign message (on b only) is acked; or
* ``cursorsync check`` and the job refuse the list for this topology: the start fails with
  a ``ConfigError`` whose message names the topic, the clusters and the strategy.

Which strategy lists are refused is the product's decision: the test asks ``cursorsync
check`` (:func:`job_on_bed.refusal`) and then holds the job to the same answer.
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
    run_three_cluster_workload,
    stamp_exposure,
)
from cursorsync_devtools.testbed.workload import WorkloadResult, WorkloadSpec, verify_source_cursors
from job_on_bed import refusal, strategy_subscription, sync_and_fail_over, three_cluster_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]

STRATEGY_LISTS: list[tuple[str, ...]] = [
    ("position-property", "identity"),  # the default
    ("identity",),
    ("position-property",),
    ("snapshot",),
    ("identity", "snapshot"),
]


@pytest.fixture(scope="module")
def three_workload(three_testbed: TestBed) -> WorkloadResult:
    """The module's workload, one subscription per strategy list, verified against a's
    cursors; it can show the failure of issue 34 (c's stamps read as positions on a)."""
    spec = ThreeClusterSpec(
        base=WorkloadSpec(partitioned_topic="three-orders", partitions=2,
                          plain_topic="three-audit", chunked_topic="three-blobs",
                          chunked_messages=2, entries_per_partition=80, produce_seconds=6.0,
                          foreign_per_partition=3, subscription_types=("Shared",), seed=34),
        subscriptions=tuple(strategy_subscription(s) for s in STRATEGY_LISTS))
    shared = create_three_cluster_topics(three_testbed, spec)
    create_three_cluster_subscriptions(three_testbed, spec)
    result = run_three_cluster_workload(three_testbed, spec)
    verify_source_cursors(three_testbed, result)
    for sub in spec.subscriptions:
        acked = result.acked[sub]
        for origin in ORIGINS:
            keys = [m.key for m in result.messages if m.origin == origin]
            assert keys and 0 < sum(k in acked for k in keys) < len(keys), (sub, origin)
        assert stamp_exposure(three_testbed, result, sub) > 0, (sub, shared)
    return result


def refusal_pattern(result: WorkloadResult, strategies: Sequence[str]) -> str:
    """A message naming one of the workload's topics and one of the strategies."""
    topics = "|".join(re.escape(t) for t in result.spec.topics())
    named = "|".join(re.escape(s) for s in strategies)
    return rf"(?s)(?=.*(?:{topics}))(?=.*(?:{named}))"


@pytest.mark.parametrize("strategies", STRATEGY_LISTS, ids="+".join)
def test_failover_to_b_loses_no_message_of_any_origin(
        three_testbed: TestBed, three_workload: WorkloadResult, strategies: tuple[str, ...],
        tmp_path: Path) -> None:
    config = three_cluster_config(three_testbed, three_workload, strategies, tmp_path)
    refused = refusal(config)
    if refused is not None:
        with pytest.raises(CursorSyncError, match=refusal_pattern(three_workload, strategies)):
            sync_and_fail_over(three_testbed, three_workload, config)
        return
    run = sync_and_fail_over(three_testbed, three_workload, config)
    exposed = stamp_exposure(three_testbed, three_workload, run.subscription)
    table = f"{run.table()}\nc's messages a stamp reading would lose: {exposed}"
    print(table)
    assert {o: c.losses for o, c in run.by_origin.items()} == dict.fromkeys(ORIGINS, 0), table
    assert run.total().foreign_acked == 0, table
    assert run.total().foreign > 0 and all(
        c.messages and c.acked_on_source for c in run.by_origin.values()), table
