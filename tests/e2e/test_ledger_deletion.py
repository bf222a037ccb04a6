"""Ledgers deleted under the running job, on the real test bed: the sync forgets what
names them, the ``mappings`` table gets a live row naming the first ledgers each side
still has, the merge drops the rows about the deleted ones, and b's cursor goes on
following a's with nothing lost."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cursorsync.core.positions import Position
from cursorsync.pulsar.topics import TopicName
from cursorsync.tables import open_store
from cursorsync.tables.mappings_table import load_mappings, merge_rows
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from tests.support.job_on_bed import (
    SUB,
    consumer_on_a,
    last_data_entry,
    mark_delete,
    nothing_redelivered_on_b,
    running,
    send_and_ack,
    shared_topic,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: Bound on each wait: the job's restarts after a broker's transient error take seconds.
WAIT_S = 120.0


def _ledgers(bed: TestBed, cluster: str, topic: str) -> list[int]:
    return [lg["ledgerId"] for lg in bed.internal_stats(cluster, topic)["ledgers"]]


def _last_entry(bed: TestBed, cluster: str, topic: str) -> Position:
    """The last entry of the topic's last ledger with entries (markers included)."""
    last = [lg for lg in bed.internal_stats(cluster, topic)["ledgers"] if lg["entries"]][-1]
    return Position(last["ledgerId"], last["entries"] - 1)


def test_ledgers_deleted_under_the_job_leave_the_mapping_and_the_table(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    topic = shared_topic(testbed, topic_name("retention"))
    consumer = consumer_on_a(testbed, topic)
    # Enough entries for several ledgers on each side (they roll at 60 on a, 45 on b).
    send_and_ack(testbed, topic, consumer, 3 * max(testbed.config.entries_per_ledger) + 5)
    testbed.wait_replicated([topic])
    old = {c: _ledgers(testbed, c, topic) for c in ("a", "b")}
    assert all(len(lgs) >= 3 for lgs in old.values()), old

    config = demo_config(testbed, tmp_path, topics=[topic], subscriptions=[SUB])
    store = open_store("delta-rs", config.tables.path)
    clusters = {"source_cluster": "a", "target_cluster": "b"}
    with running(config):
        last = last_data_entry(testbed, topic)
        wait_for("b's cursor follows a's",
                 lambda: mark_delete(testbed, "b", topic, SUB) >= last, WAIT_S)
        ends = {c: _last_entry(testbed, c, topic) for c in ("a", "b")}
        # The mapping query acks what it read on each side when its next batch starts:
        # traffic, then every cursor (the sync's, the mapping's, the replicators') is
        # past the old ledgers. An unload persists the cursors and a trim deletes the
        # consumed ledgers.
        send_and_ack(testbed, topic, consumer, 20)
        for c in ("a", "b"):
            wait_for(f"every cursor on {c} past its first ledgers", lambda c=c: all(
                Position.parse(k["markDeletePosition"]) >= ends[c]
                for k in testbed.internal_stats(c, topic)["cursors"].values()), WAIT_S)
            testbed.admin_call(c, "PUT", TopicName.parse(topic).admin_path("unload"))
            testbed.admin_call(c, "POST", TopicName.parse(topic).admin_path("trim"))
        wait_for("old ledgers deleted on both sides", lambda: all(
            _ledgers(testbed, c, topic)[0] > old[c][0] for c in ("a", "b")), WAIT_S)
        # Traffic: the sync plans again on the new ledger lists and trims its mapping; the
        # mapping query's next batch writes the live row (a batch needs new entries).

        def live_rows() -> list[dict[str, int]]:
            return [r for r in store.read("mappings").to_pylist()
                    if r["kind"] == "live" and r["topic"] == topic]

        def traffic_then_live_row() -> bool:
            send_and_ack(testbed, topic, consumer, 5)
            time.sleep(1)
            return bool(live_rows())

        wait_for("a live row in the mappings table", traffic_then_live_row, WAIT_S)
        testbed.wait_replicated([topic])
        last = last_data_entry(testbed, topic)
        wait_for("b's cursor follows a's after the deletion",
                 lambda: mark_delete(testbed, "b", topic, SUB) >= last, WAIT_S)

    first = {c: _ledgers(testbed, c, topic)[0] for c in ("a", "b")}
    for row in live_rows():
        # No live row takes a ledger still listed for deleted.
        assert row["source_ledger"] is None or row["source_ledger"] <= first["a"], row
        assert row["target_ledger"] is None or row["target_ledger"] <= first["b"], row
    src, tgt = (max(r[f"{side}_ledger"] or 0 for r in live_rows())
                for side in ("source", "target"))
    assert src > old["a"][0] and tgt > old["b"][0], (src, tgt, old)
    before = store.read("mappings").num_rows
    loaded = load_mappings(store, **clusters)[0]
    assert merge_rows(store, before=datetime.now(UTC)) > 0
    rows = [r for r in store.read("mappings").to_pylist() if r["topic"] == topic]
    assert len(rows) < before
    for r in rows:
        if r["kind"] == "segment":
            assert r["source_ledger"] >= src or r["target_ledger"] >= tgt, r
        elif r["kind"] in ("skippable", "foreign", "unpaired", "anchor"):
            assert r["target_ledger"] >= tgt, r
        elif r["kind"] == "unreplicated":
            assert r["source_ledger"] >= src, r
    assert load_mappings(store, **clusters)[0] == loaded  # readers see the same
    nothing_redelivered_on_b(testbed, topic)  # a has acked everything

