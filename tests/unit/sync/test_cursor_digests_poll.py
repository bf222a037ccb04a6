"""A source poll that asks the source brokers' cursorsync plugin which partitions moved
(``cursorDigests``), against the admin stub: only the partitions whose digests differ from
what their last read showed are read again, with no race between the answer and the read."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from cursorsync.core.positions import Position, parse_range_bounds
from cursorsync.pulsar.cursor_digests import acks_digest
from cursorsync.sync.cursors import CursorsOptions, PulsarCursorsStreamReader
from tests.support.admin_stub import BASE, Reply, StubAdmin, stats_doc

TOPIC = "persistent://acme/orders/events"
PLUGIN = "/cursorsync/cursors?namespace=acme%2Forders"
NO_BATCHES = "9e3779b97f4a7c15"


def state(md: str, idm: str = "[]", lce: str = "3:9") -> dict[str, Any]:
    return stats_doc(lce, [(3, 0)], {"svc": (md, idm)}, counter=10)


def told(doc: dict[str, Any]) -> dict[str, Any]:
    """What the plugin says of a partition whose internalStats are ``doc``."""
    c = doc["cursors"]["svc"]
    lce = Position.parse(doc["lastConfirmedEntry"])
    return {"ledgers": f"{doc['numberOfEntries']}:{doc['totalSize']}:{lce.ledger}:{lce.entry}",
            "cursors": {"svc": {"acks": acks_digest(Position.parse(c["markDeletePosition"]),
                                                    parse_range_bounds(
                                                        c["individuallyDeletedMessages"])),
                                "batches": NO_BATCHES}}}


def answer(admin: StubAdmin, topics: dict[int, dict[str, Any]], *,
           brokers: tuple[str, ...] = ()) -> Reply:
    here = urlsplit(admin.url).netloc
    return Reply(body={"plugin": "cursorsync", "broker": here, "brokers": [here, *brokers],
                       "namespace": "acme/orders",
                       "topics": [{"topic": f"{TOPIC}-partition-{i}", **t}
                                  for i, t in sorted(topics.items())]})


def serve(admin: StubAdmin, docs: dict[int, dict[str, Any]]) -> None:
    """Two partitions' internalStats, one by one and together."""
    admin.set(BASE + "/partitions", Reply(body={"partitions": len(docs)}))
    for i, d in docs.items():
        admin.set(f"{BASE}-partition-{i}/internalStats", Reply(body=d))
    admin.set(BASE + "/partitioned-internalStats", Reply(body={
        "metadata": {"partitions": len(docs)},
        "partitions": {f"{TOPIC}-partition-{i}": d for i, d in docs.items()}}))


def reader(admin: StubAdmin, tmp_path: Path) -> PulsarCursorsStreamReader:
    return PulsarCursorsStreamReader(CursorsOptions.parse({
        "adminUrl": admin.url, "cluster": "a", "topics": TOPIC, "subscriptions": "svc",
        "stateDir": str(tmp_path), "adminAttempts": "1", "internalStatsMaxAgeMs": "600000",
        "cursorDigests": "true"}))


def reads(admin: StubAdmin, since: int) -> list[str]:
    return sorted(p for p, _ in admin.requests[since:] if "nternalStats" in p)


def test_only_the_partitions_whose_digests_moved_are_read(admin: StubAdmin,
                                                         tmp_path: Path) -> None:
    docs = {0: state("3:4"), 1: state("3:2", "[(3:3..3:5]]")}
    serve(admin, docs)
    admin.set(PLUGIN, answer(admin, {i: told(d) for i, d in docs.items()}))
    r = reader(admin, tmp_path)
    first = r.poll()
    assert r.partitions_read == 2 and len(first) == 2
    n = len(admin.requests)
    again = r.poll()
    assert reads(admin, n) == [] and r.partitions_unchanged == 2
    assert [row[:6] for row in again] == [row[:6] for row in first]
    assert not any("stats?" in p or p.endswith("/stats") for p, _ in admin.requests)
    # An ack on partition 1: its digest moves, it alone is read.
    docs[1] = state("3:2", "[(3:3..3:6]]")
    serve(admin, docs)
    admin.set(PLUGIN, answer(admin, {i: told(d) for i, d in docs.items()}))
    n = len(admin.requests)
    rows = r.poll()
    assert reads(admin, n) == [f"{BASE}-partition-1/internalStats"]
    assert [row[5] for row in rows if row[2] == 1] == ["[(3:3..3:6]]"]
    # A batch-index ack: only the batches digest moves.
    moved = told(docs[0])
    moved["cursors"]["svc"]["batches"] = "0123456789abcdef"
    admin.set(PLUGIN, answer(admin, {0: moved, 1: told(docs[1])}))
    n = len(admin.requests)
    r.poll()
    assert reads(admin, n) == [f"{BASE}-partition-0/internalStats"]


def test_what_is_remembered_is_what_was_read_not_what_was_told(admin: StubAdmin,
                                                               tmp_path: Path) -> None:
    """The plugin answers before the read; an ack in between is in the read. What the poll
    keeps for the partition is the read's own digest: the answer it read after says the
    state read, and an answer that goes back to the first (a reset) is read again."""
    before, after = state("3:4"), state("3:6")
    serve(admin, {0: after, 1: after})
    admin.set(PLUGIN, answer(admin, {0: told(before), 1: told(before)}))
    r = reader(admin, tmp_path)
    r.poll()
    admin.set(PLUGIN, answer(admin, {0: told(after), 1: told(after)}))
    n = len(admin.requests)
    r.poll()
    assert reads(admin, n) == [] and r.partitions_unchanged == 2
    serve(admin, {0: before, 1: after})
    admin.set(PLUGIN, answer(admin, {0: told(before), 1: told(after)}))
    n = len(admin.requests)
    rows = r.poll()
    assert reads(admin, n) == [f"{BASE}-partition-0/internalStats"]
    assert sorted((row[2], row[4]) for row in rows) == [(0, "3:4"), (1, "3:6")]


def test_a_partition_no_broker_lists_or_two_list_is_read_every_poll(
        admin: StubAdmin, tmp_path: Path) -> None:
    docs = {0: state("3:4"), 1: state("3:4")}
    serve(admin, docs)
    # The stub is also "localhost:port": the other broker it lists answers the same, so
    # both brokers list both partitions; partition 1 is listed by nobody in the first.
    here = urlsplit(admin.url)
    other = f"localhost:{here.port}"
    admin.set(PLUGIN, answer(admin, {0: told(docs[0])}, brokers=(other,)))
    r = reader(admin, tmp_path)
    r.poll()
    for _ in range(2):
        n = len(admin.requests)
        r.poll()
        # Both stale, so read in one request (the width rule of sync.cursors).
        assert reads(admin, n) == [BASE + "/partitioned-internalStats"]
        assert r.partitions_read == 2 and r.partitions_unchanged == 0


def test_without_the_plugin_the_topic_stats_are_asked(admin: StubAdmin, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    docs = {0: state("3:4"), 1: state("3:4")}
    serve(admin, docs)
    sub = {"msgBacklog": 0, "lastAckedTimestamp": 1, "lastMarkDeleteAdvancedTimestamp": 1,
           "nonContiguousDeletedMessagesRanges": 0, "totalMsgExpired": 0}
    stats = {"msgInCounter": 10, "storageSize": 0, "subscriptions": {"svc": sub}}
    admin.set(BASE + "/partitioned-stats?getPreciseBacklog=false&subscriptionBacklogSize=false"
              "&getEarliestTimeInBacklog=false&excludePublishers=true&excludeConsumers=true"
              "&perPartition=true",
              Reply(body={"partitions": {f"{TOPIC}-partition-{i}": stats for i in docs}}))
    r = reader(admin, tmp_path)
    with caplog.at_level(logging.WARNING):
        rows = r.poll()
    assert sorted((row[2], row[4]) for row in rows) == [(0, "3:4"), (1, "3:4")]
    assert "no cursor digests from its brokers' plugin" in caplog.text
    assert "no cursorsync plugin loaded" in caplog.text
    caplog.clear()
    n = len(admin.requests)
    with caplog.at_level(logging.INFO):
        r.poll()  # the stats say nothing moved
    assert reads(admin, n) == [] and r.partitions_unchanged == 2
    assert any("partitioned-stats" in p for p, _ in admin.requests[n:])
    # Said once, not every poll; and said again when the plugin answers.
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    admin.set(PLUGIN, answer(admin, {i: told(d) for i, d in docs.items()}))
    with caplog.at_level(logging.INFO):
        r.poll()
    assert "answers the cursor digests again" in caplog.text


def plugin_stats(doc: dict[str, Any], *, counts: bool = True) -> dict[str, Any]:
    """What the plugin writes as ``stats`` of a partition whose internalStats are ``doc``
    (an older plugin wrote no entry count and size)."""
    out = {"lastConfirmedEntry": doc["lastConfirmedEntry"],
           "ledgers": [{"ledgerId": x["ledgerId"], "entries": x["entries"]}
                       for x in doc["ledgers"]],
           "cursors": {s: {k: c[k] for k in ("markDeletePosition",
                                             "individuallyDeletedMessages")}
                       for s, c in doc["cursors"].items()}}
    return {"numberOfEntries": doc["numberOfEntries"], "totalSize": doc["totalSize"],
            **out} if counts else out


def test_many_moved_partitions_are_read_from_the_plugin_in_one_request(
        admin: StubAdmin, tmp_path: Path) -> None:
    """Ten partitions move at once: the plugin's stats answer for eight; one it gives without
    the entry count (an older plugin) and one it does not list are read one by one. What
    the poll remembers of the eight is their own digest, so the next poll, told the same,
    reads nothing; their rows are what internalStats would have given."""
    docs = {i: state(f"3:{i}", "[(3:5..3:7]]" if i % 2 else "[]") for i in range(10)}
    serve(admin, docs)
    admin.set(PLUGIN, answer(admin, {i: told(d) for i, d in docs.items()}))
    with_stats = {i: {**told(d), "stats": plugin_stats(d, counts=i != 8)}
                  for i, d in docs.items() if i != 9}
    admin.set(PLUGIN + "&stats=true", answer(admin, with_stats))
    r = reader(admin, tmp_path)
    rows = r.poll()
    assert reads(admin, 0) == [f"{BASE}-partition-8/internalStats",
                               f"{BASE}-partition-9/internalStats"]
    assert r.plugin_reads == 1 and r.partitions_read == 10
    assert sorted((row[2], row[4], row[5]) for row in rows) == [
        (i, f"3:{i}", "[(3:5..3:7]]" if i % 2 else "[]") for i in range(10)]
    assert {row[6] == [(3, 10)] for row in rows} == {True}  # the open ledger: lce's count
    n = len(admin.requests)
    r.poll()
    assert reads(admin, n) == [] and r.partitions_unchanged == 10 and r.plugin_reads == 1
