"""What Pulsar does on three clusters in full mesh, pinned on the three-cluster test bed.

The facts behind issue 34 (messages of a third cluster lost after a failover): a
copy of c's message carries c's own position as its stamp on every other cluster,
names c as where it was replicated from, and is not replicated on by whoever
received it; and c's ledger ids fall among a's, so the stamp, read as a position
on a, lands inside a's topic, and on a real entry of a's where a ledger has the same id
on both (the three-cluster workload makes sure some do).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pulsar
import pytest

from cursorsync.core.positions import Position
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.replicated import STAMP

# Facts of the pinned Pulsar on a three-cluster bed of the module's own (about a minute),
# run with CURSORSYNC_SLOW=1; every run checks cursorsync itself on three clusters
# (tests/e2e/test_three_clusters.py).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLUSTERS = ("a", "b", "c")


def raw_entry(bed: TestBed, cluster: str, topic: str, pos: Position) -> httpx.Response:
    path = TopicName.parse(bed.topic(topic)).admin_path(f"ledger/{pos.ledger}/entry/{pos.entry}")
    return httpx.get(bed.admin_url(cluster) + path, timeout=10)


def read_all(bed: TestBed, cluster: str, topic: str) -> list[Any]:
    reader = bed.client(cluster).create_reader(topic, pulsar.MessageId.earliest)
    got = []
    try:
        while reader.has_message_available():
            got.append(reader.read_next(10_000))
    finally:
        reader.close()
    return got


def position(msg: Any) -> Position:
    return at(msg.message_id())


def at(mid: Any) -> Position:
    return Position(mid.ledger_id(), mid.entry_id())


def test_every_cluster_knows_the_other_two_and_replicates_the_namespace_to_all_three(
        three_testbed: TestBed) -> None:
    bed = three_testbed
    for cluster in CLUSTERS:
        assert set(CLUSTERS) <= set(bed.admin_call(cluster, "GET", "/admin/v2/clusters"))
        tenant = bed.admin_call(cluster, "GET", f"/admin/v2/tenants/{bed.config.tenant}")
        assert sorted(tenant["allowedClusters"]) == list(CLUSTERS), (cluster, tenant)
        replication = bed.admin_call(cluster, "GET",
                                     f"/admin/v2/namespaces/{bed.namespace}/replication")
        assert sorted(replication) == list(CLUSTERS), (cluster, replication)


def test_a_message_produced_on_c_reaches_a_and_b_once_stamped_with_c_s_own_position(
        three_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Evidence must know an entry's origin before it reads its stamp: b's copy of c's
    message carries c's ``ledger:entry`` (c's id space) and ``replicated-from: c``, as
    a's copy does; a does not send c's message on to b (b holds one copy, c's own). The
    raw-entry endpoint of 4.0.8 shows properties in one JSON header, ``X-Pulsar-PROPERTY``,
    for unbatched and batched entries alike; no ``X-Pulsar-PROPERTY-<key>`` header."""
    bed = three_testbed
    (t,) = bed.create_topic(topic_name("from-c"))
    c = bed.client("c")
    single = c.create_producer(t, producer_name="c-single", batching_enabled=False)
    on_c = {f"u{i}": at(single.send(b"u%d" % i, properties={"key": f"u{i}"}))
            for i in range(3)}
    batch = c.create_producer(t, producer_name="c-batch", batching_enabled=True,
                              batching_max_messages=3, batching_max_publish_delay_ms=60_000)
    ids: list[Any] = []
    for i in range(3):
        batch.send_async(b"b%d" % i, lambda res, mid: ids.append(mid),
                         properties={"key": f"b{i}"})
    batch.flush()
    for i, mid in enumerate(sorted(ids, key=lambda m: m.batch_index())):
        on_c[f"b{i}"] = at(mid)
    bed.wait_replicated([t], origin=None)
    stamps: dict[str, dict[str, str]] = {}
    for cluster in ("a", "b"):
        got = read_all(bed, cluster, t)
        assert Counter(m.properties()["key"] for m in got) == dict.fromkeys(on_c, 1), cluster
        stamps[cluster] = {}
        for m in got:
            r = raw_entry(bed, cluster, t, position(m))
            assert r.status_code == 200, r.text
            assert r.headers["X-Pulsar-replicated-from"] == "c"
            props = json.loads(r.headers["X-Pulsar-PROPERTY"])
            stamps[cluster][m.properties()["key"]] = props[STAMP]
            assert f"X-Pulsar-PROPERTY-{STAMP}" not in r.headers
        # The stamp is c's own position, not the entry's on this cluster.
        assert stamps[cluster] == {k: str(p) for k, p in on_c.items()}, cluster
    # c's own entries carry neither.
    r = raw_entry(bed, "c", t, on_c["u0"])
    assert "X-Pulsar-replicated-from" not in r.headers
    assert STAMP not in json.loads(r.headers.get("X-Pulsar-PROPERTY", "{}"))


def produce_everywhere(bed: TestBed, parts: list[str], per_cluster: int) -> None:
    """``per_cluster`` unbatched messages (keys ``<cluster>-<i>``) per topic partition on
    each cluster, interleaved, then every cluster's replication caught up."""
    producers = [(bed.client(cl).create_producer(p, batching_enabled=False,
                                                 block_if_queue_full=True), cl)
                 for cl in CLUSTERS for p in parts]
    for i in range(per_cluster):
        for producer, cl in producers:
            producer.send_async(f"{cl}-{i}".encode(), None, properties={"key": f"{cl}-{i}"})
    for producer, _ in producers:
        producer.flush()
        producer.close()
    bed.wait_replicated(parts, origin=None)


def c_stamps_on_b(bed: TestBed, topic: str) -> dict[Position, str]:
    """The stamp of each copy on b of a message c produced -> the message's key."""
    return {Position.parse(m.properties()[STAMP]): m.properties()["key"]
            for m in read_all(bed, "b", topic) if m.properties()["key"].startswith("c-")}


def test_c_s_ledger_ids_fall_among_a_s_so_c_s_stamps_name_positions_inside_a_s_topic(
        three_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """What the bed sets up (testbed.py: c's ledgers start 3 ids later than a's and roll
    every 50 entries, a's every 60; b's start 12 later): each cluster has ledger ids of
    its own, c's start after a's and stay among them for a while, so stamps c wrote,
    read as positions on a, lie between a's first and last entry of the partition."""
    bed = three_testbed
    parts = bed.create_topic(topic_name("mesh"), partitions=2)
    produce_everywhere(bed, parts, 150)
    for p in parts:
        ledgers = {cl: [lg["ledgerId"] for lg in bed.internal_stats(cl, p)["ledgers"]]
                   for cl in CLUSTERS}
        assert len({ledgers[cl][0] for cl in CLUSTERS}) == 3, ledgers
        assert ledgers["a"][0] < ledgers["c"][0] < ledgers["a"][-1] < ledgers["b"][-1], ledgers
        first_on_a, last_on_a = Position(ledgers["a"][0], 0), bed.last_entry("a", p)
        stamps = sorted(c_stamps_on_b(bed, p))
        assert any(first_on_a <= s <= last_on_a for s in stamps), (p, ledgers, stamps[:3])


def test_a_ledger_made_with_the_same_id_on_a_and_c_makes_c_s_stamps_name_a_s_entries(
        three_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """The three-cluster workload's set-up (``TestBed.align_ledger_ids``, then each topic
    partition loaded on a and on c in turn): the partitions' first ledgers have the same
    id on a and c, so each stamp c writes on its first 50 entries names an entry a holds
    in the same partition. Which message a holds there depends on how the copies
    interleaved: another one than the stamped message, or c's copy itself where a and c
    took the copies in the same order (so every stamp may look right); either way a
    position on a the stamp does not vouch for."""
    bed = three_testbed
    tries = []
    for attempt in range(3):
        bed.align_ledger_ids("c", "a")
        parts = bed.create_topic(topic_name(f"aligned-{attempt}"), partitions=2)
        first = {p: {cl: bed.internal_stats(cl, p)["ledgers"][0]["ledgerId"] for cl in CLUSTERS}
                 for p in parts}
        assert all(f["a"] == f["c"] != f["b"] for f in first.values()), first
        produce_everywhere(bed, parts, 15)  # 45 entries a partition: one ledger on every cluster
        shared = {p: {s: k for s, k in c_stamps_on_b(bed, p).items() if s.ledger == first[p]["a"]}
                  for p in parts}
        if all(len(stamps) == 15 for stamps in shared.values()):
            break
        # Once, in a CI run on a loaded machine, c wrote none of them in the shared ledger
        # (it had moved on to another before the workload; why is not pinned): set it up
        # again, keeping what c's ledgers were for the failure message.
        tries.append({p: (first[p], len(shared[p]),
                          [lg["ledgerId"] for lg in bed.internal_stats("c", p)["ledgers"]])
                      for p in parts})
    else:
        pytest.fail(f"c's entries never stayed in the ledger id a shares: {tries}")
    for p in parts:
        stamps = shared[p]
        for stamp, key in stamps.items():
            r = raw_entry(bed, "a", p, stamp)
            assert r.status_code == 200, (p, stamp, key, r.text)  # a holds an entry there
            assert json.loads(r.headers["X-Pulsar-PROPERTY"])["key"]
