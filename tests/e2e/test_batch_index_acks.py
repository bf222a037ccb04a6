"""Failover with batch-index acknowledgement on, as Pulsar 4.1 has it by default: the brokers
keep the acked messages of a partially acked batch (``acknowledgmentAtBatchIndexLevelEnabled``)
and a's consumers ack by batch index.

A restart on a delivers none of those messages again. With ``emission.batch_index_acks``
and cursorsync's broker plugin on the brokers, b holds the same batch indexes after the
sync, and a failover to b delivers none of them either; Pulsar's built-in replicated
subscriptions, beside it, deliver them. With it off (every other failover test) a restart on
a delivers them again too (tests/e2e/test_e2e.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cursorsync_devtools.demo import demo
from cursorsync_devtools.testbed import TestBed, TestBedConfig, broker_plugin_path
from tests.e2e.test_e2e import check, spec

# A test bed of its own: batch-index acks on, the broker plugin loaded (about a minute).
pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def batch_index_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    on = {"acknowledgmentAtBatchIndexLevelEnabled": "true"}
    config = TestBedConfig(work_dir=tmp_path_factory.mktemp("batch-index-acks"),
                           settings={"a": on, "b": on}, broker_plugin=broker_plugin_path())
    with TestBed(config) as bed:
        yield bed


def test_with_batch_index_acks_failover_to_b_delivers_what_a_restart_on_a_delivers(
        batch_index_bed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    r = demo(bed=batch_index_bed, spec=spec(topic_name, seed=23, batch_index_acks=True),
             work_dir=str(tmp_path), restart_on_source=True)
    check(r)
    assert r.batch_index_acks
    carried = False
    for kind, counts in r.cursorsync.items():
        restarted = r.source_restart[kind]
        # a's broker holds those acks: a restart there delivers none of them, and after the
        # sync neither does b; the built-in, which carries no batch index, does.
        assert restarted["partial_batch"] == 0 and restarted["losses"] == 0, r.table()
        assert counts["partial_batch"] == 0 and counts["losses"] == 0, r.table()
        assert r.builtin_source_restart[kind]["partial_batch"] == 0, r.table()
        carried |= r.builtin[kind]["partial_batch"] > 0
    assert carried, f"no partly acked batch in the workload:\n{r.table()}"
