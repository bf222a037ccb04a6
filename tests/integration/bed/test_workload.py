"""The test bed's workload: its ground truth agrees with the real brokers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.workload import (
    WorkloadSpec,
    ack_choice,
    create_target_subscriptions,
    create_topics,
    run_workload,
    verify_source_cursors,
)

pytestmark = pytest.mark.integration


def test_ack_choices_are_seeded_and_cover_every_kind() -> None:
    spec = WorkloadSpec()
    kinds = {ack_choice(spec, "t", i, 3).kind for i in range(400)}
    assert kinds == {"prompt", "late", "never", "partial"}
    assert [ack_choice(spec, "t", i, 3) for i in range(50)] == [
        ack_choice(spec, "t", i, 3) for i in range(50)]
    assert {ack_choice(spec, "t", i, 0).kind for i in range(400)} == {"prompt", "late", "never"}


def test_the_workload_acks_on_a_what_its_ground_truth_says(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    spec = WorkloadSpec(partitioned_topic=topic_name("p"), plain_topic=topic_name("plain"),
                        chunked_topic=topic_name("chunks"), entries_per_partition=80,
                        produce_seconds=3.0, chunked_messages=2, seed=3)
    parts = create_topics(testbed, spec)
    create_target_subscriptions(testbed, spec)
    result = run_workload(testbed, spec)
    verify_source_cursors(testbed, result)
    assert len(parts) == 5 and result.topic_partitions() == sorted(parts)
    batched = [m for m in result.messages if m.batch_size]
    assert batched and len(batched) < len(result.messages)
    assert sum(m.chunked for m in result.messages) == 2
    assert len(result.foreign) == 4 * spec.foreign_per_partition
    for sub in spec.subscriptions():
        assert 0 < len(result.acked[sub]) < len(result.messages)
    assert result.acked["sync-shared"].keys() == result.acked["builtin-shared"].keys()
    # a's ledgers rolled over during the run (the test bed rolls them every 60 entries).
    ledgers = testbed.internal_stats("a", parts[0])["ledgers"]
    assert len(ledgers) >= 2
