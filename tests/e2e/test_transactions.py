"""Transactions on the real brokers: messages committed, aborted and sent plainly in one
topic, acked in part on a, synced by the job, then failover to b with every delivery
counted (issue 36's shapes of a skipped id: an aborted transaction's messages and the
transaction markers are entries no consumer ever receives).

The clusters of this module run with the transaction coordinator on; the Java client
sends the transactions (cursorsync_devtools.testbed.transactions).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pulsar
import pytest

from cursorsync.tables import open_store
from cursorsync_devtools.demo import caught_up, demo_config
from cursorsync_devtools.testbed import TestBed, TestBedConfig
from cursorsync_devtools.testbed.failover import drain
from cursorsync_devtools.testbed.transactions import TRANSACTION_SETTINGS, send_transactions
from tests.support.job_on_bed import SUB, consumer_on_a, running, shared_topic
from tests.support.skipped_ids import delivered, stored

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: Committed, aborted and plain messages interleaved, twice over.
PLAN = "p2,c3,a2,c1,a3,p1,c2,a1,p2,c3,a2,c1,a3,p1,c2,a1,p2"


@pytest.fixture(scope="module")
def txn_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    work = tmp_path_factory.mktemp("txn-bed")
    settings = {"a": TRANSACTION_SETTINGS, "b": TRANSACTION_SETTINGS}
    with TestBed(TestBedConfig(work_dir=work, settings=settings)) as bed:
        yield bed


def test_aborted_messages_are_never_delivered_on_either_cluster(
        txn_bed: TestBed, topic_name: Callable[[str], str]) -> None:
    """What the brokers do with transactions, pinned: a holds every message sent and one
    marker per transaction ended (commit or abort), and its readers skip the aborted
    messages and the markers; the replicator copies the committed and plain messages alone,
    so b holds no entry a reader skips on their account."""
    topic = shared_topic(txn_bed, topic_name("txn-facts"))
    sent = send_transactions(txn_bed, "a", topic, PLAN)
    kinds = Counter(m.kind for m in sent)
    assert kinds == {"c": 12, "a": 12, "p": 8}, kinds
    on_a = {last for _, last in delivered(txn_bed, "a", topic)}
    assert on_a == {m.position for m in sent if m.kind != "a"}
    txn_bed.wait_replicated([topic])
    ended = PLAN.count("c") + PLAN.count("a")
    assert len(stored(txn_bed, "a", topic)) == len(sent) + ended
    on_b = {last for _, last in delivered(txn_bed, "b", topic)}
    assert len(stored(txn_bed, "b", topic)) == len(on_b) == len(on_a)
    reader = txn_bed.client("b").create_reader(topic, pulsar.MessageId.earliest)
    keys = []
    try:
        while reader.has_message_available():
            keys.append(reader.read_next(5_000).properties().get("key"))
    finally:
        reader.close()
    assert sorted(keys) == sorted(m.key for m in sent if m.kind != "a")


@pytest.mark.parametrize("holes", ["verified", "probe"])
def test_failover_after_transactions_loses_nothing_and_redelivers_nothing_acked(
        txn_bed: TestBed, topic_name: Callable[[str], str], tmp_path: Path,
        holes: str) -> None:
    topic = shared_topic(txn_bed, topic_name(f"txn-{holes}"))
    consumer = consumer_on_a(txn_bed, topic)
    sent = send_transactions(txn_bed, "a", topic, PLAN)
    deliverable = {m.key for m in sent if m.kind != "a"}
    got: dict[str, pulsar.Message] = {}
    while len(got) < len(deliverable):
        msg = consumer.receive(timeout_millis=30_000)
        got[msg.properties()["key"]] = msg
    assert set(got) == deliverable
    # Ack all but every third message, out of order: holes on a's cursor between them.
    keys = sorted(got, key=lambda k: int(k[1:]))
    acked = {k for i, k in enumerate(keys) if i % 3 != 1}
    for k in sorted(acked, reverse=True):
        consumer.acknowledge(got[k])
    consumer.close()
    last_ack = time.time()
    txn_bed.wait_replicated([topic])

    config = demo_config(txn_bed, tmp_path, topics=[topic], subscriptions=[SUB], holes=holes)
    store = open_store(config.tables.backend, config.tables.path)
    with running(config):
        deadline = time.monotonic() + 180
        state: float | str = "nothing yet"
        while time.monotonic() < deadline:
            state = caught_up(store, config, after=last_ack + 1, since_batch=0,
                              partitions={txn_bed.topic(topic): [txn_bed.topic(topic)]},
                              chunked=set())
            if isinstance(state, float):
                break
            time.sleep(1)
        assert isinstance(state, float), f"the sync did not catch up: it waits on {state}"

    seen = Counter(m.properties().get("key") for m in drain(txn_bed, topic, SUB, "Shared"))
    aborted = {m.key for m in sent if m.kind == "a"}
    losses = sorted(k for k in deliverable - acked if not seen[k])
    duplicates = sorted(k for k in acked if seen[k])
    assert not losses, f"lost after failover: {losses}"
    assert not duplicates, f"acked on a, delivered again on b: {duplicates}"
    assert not aborted & set(seen), sorted(aborted & set(seen))
    assert sum(seen.values()) == len(deliverable - acked)
