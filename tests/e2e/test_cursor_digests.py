"""Failover with cursorsync's broker plugin asked for what moved (``spark.cursor_digests``):
the source poll reads only the partitions whose cursors moved, and the acked source entries
past each partition's last mapped entry are classified from the brokers' last dispatchable
positions, one request per broker, instead of a reader per partition."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cursorsync_devtools.demo import demo
from cursorsync_devtools.testbed import TestBed
from tests.e2e.test_e2e import check, spec

# The shared bed with the plugin loaded (batch-index acks on, as Pulsar 4.1 has them).
pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_failover_with_the_tail_classified_from_the_plugin(
        index_testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    # The brokers keep batch-index acks (Pulsar 4.1's default) and a's consumers do not send
    # them (the clients' default): the forecast, which reads the brokers' batch indexes,
    # bounds the partly acked batches they never hear of.
    r = demo(bed=index_testbed, spec=spec(topic_name, seed=31), work_dir=str(tmp_path),
             cursor_digests=True)
    check(r)
    assert any(c["partial_batch"] for c in r.cursorsync.values()), r.table()
    asked = r.skipped_id_requests
    # Markers follow each partition's last message (replicated subscriptions' snapshots):
    # their partitions' tails were asked of the plugin before the job caught up.
    assert asked.get("source plugin-tail", 0) > 0, asked
    # The acked source entries the mapping does not map are looked up on the plugin too:
    # no raw entry read unless it could not be asked.
    assert asked.get("source raw-entry", 0) == 0, asked
