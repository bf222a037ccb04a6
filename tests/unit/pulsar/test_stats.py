"""Parsing admin JSON shaped exactly like Pulsar's (PersistentTopicInternalStats et al.)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import AdminError, MalformedAdminOutputError
from cursorsync.pulsar.stats import (
    parse_internal_stats,
    parse_json,
    parse_partitioned_internal_stats,
    parse_partitions,
    parse_topic_list,
)

TOPIC = "persistent://acme/orders/events-partition-0"

# As the broker writes it: the open (last) ledger reports entries 0 and size 0;
# its live count is in currentLedgerEntries / lastConfirmedEntry.
INTERNAL_STATS: dict[str, Any] = {
    "entriesAddedCounter": 1620,
    "numberOfEntries": 1620,
    "totalSize": 1940512,
    "currentLedgerEntries": 120,
    "currentLedgerSize": 143880,
    "lastLedgerCreatedTimestamp": "2026-11-20T10:15:02.441Z",
    "waitingCursorsCount": 1,
    "pendingAddEntriesCount": 0,
    "lastConfirmedEntry": "612:119",
    "state": "LedgerOpened",
    "ledgers": [
        {"ledgerId": 590, "entries": 1000, "size": 1198211, "offloaded": False,
         "underReplicated": False},
        {"ledgerId": 601, "entries": 500, "size": 598421, "offloaded": False,
         "underReplicated": False},
        {"ledgerId": 612, "entries": 0, "size": 0, "offloaded": False,
         "underReplicated": False},
    ],
    "cursors": {
        "orders-svc": {
            "markDeletePosition": "601:41",
            "readPosition": "612:120",
            "waitingReadOp": True,
            "pendingReadOps": 0,
            "messagesConsumedCounter": 1580,
            "cursorLedger": 633,
            "cursorLedgerLastEntry": 77,
            "individuallyDeletedMessages": "[(601:42..601:99], (601:120..612:3],(612:7..612:9]]",
            "lastLedgerSwitchTimestamp": "2026-11-20T10:15:02.512Z",
            "state": "Open",
            "active": True,
            "numberOfEntriesSinceFirstNotAckedMessage": 1079,
            "totalNonContiguousDeletedMessagesRange": 3,
            "subscriptionHavePendingRead": True,
            "subscriptionHavePendingReplayRead": False,
            "properties": {},
        },
        "pulsar.repl.cluster-b": {
            "markDeletePosition": "612:118",
            "readPosition": "612:120",
            "waitingReadOp": True,
            "pendingReadOps": 0,
            "messagesConsumedCounter": 1620,
            "cursorLedger": -1,
            "cursorLedgerLastEntry": -1,
            "individuallyDeletedMessages": "[]",
            "lastLedgerSwitchTimestamp": "2026-11-20T10:15:02.512Z",
            "state": "NoLedger",
            "active": True,
            "numberOfEntriesSinceFirstNotAckedMessage": 2,
            "totalNonContiguousDeletedMessagesRange": 0,
            "subscriptionHavePendingRead": True,
            "subscriptionHavePendingReplayRead": False,
            "properties": {},
        },
        "audit": {
            "markDeletePosition": "590:-1",
            "readPosition": "590:0",
            "waitingReadOp": False,
            "pendingReadOps": 0,
            "messagesConsumedCounter": 0,
            "cursorLedger": -1,
            "cursorLedgerLastEntry": -1,
            "individuallyDeletedMessages": "[]",
            "lastLedgerSwitchTimestamp": "2026-11-20T10:15:02.512Z",
            "state": "NoLedger",
            "active": False,
            "numberOfEntriesSinceFirstNotAckedMessage": 1,
            "totalNonContiguousDeletedMessagesRange": 0,
            "subscriptionHavePendingRead": False,
            "subscriptionHavePendingReplayRead": False,
            "properties": {"#pulsar.internal.replicated.subscription": 1},
        },
    },
    "schemaLedgers": [],
    "compactedLedger": {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False,
                        "underReplicated": False},
}


def test_internal_stats_open_ledger_count_from_last_confirmed_entry() -> None:
    s = parse_internal_stats(TOPIC, copy.deepcopy(INTERNAL_STATS))
    assert s.ledgers.ids.tolist() == [590, 601, 612]
    assert s.ledgers.entries.tolist() == [1000, 500, 120]
    assert s.last_confirmed_entry == Position(612, 119)
    assert s.entries_added_counter == 1620
    assert s.state == "LedgerOpened"


def test_open_ledger_falls_back_to_current_ledger_entries() -> None:
    doc = copy.deepcopy(INTERNAL_STATS)
    # Just rolled over: lastConfirmedEntry is still the previous ledger's last entry.
    doc["lastConfirmedEntry"] = "601:499"
    doc["currentLedgerEntries"] = 0
    s = parse_internal_stats(TOPIC, doc)
    assert s.ledgers.entries.tolist() == [1000, 500, 0]


def test_subscriptions_and_replicators_are_separated() -> None:
    s = parse_internal_stats(TOPIC, copy.deepcopy(INTERNAL_STATS))
    assert sorted(s.subscriptions) == ["audit", "orders-svc"]
    assert list(s.replicators) == ["pulsar.repl.cluster-b"]
    sub = s.subscriptions["orders-svc"]
    assert sub.state.mark_delete == Position(601, 41)
    assert sub.state.individually_deleted == RangeSet.of(
        ("601:42", "601:99"), ("601:120", "612:3"), ("612:7", "612:9"))
    # Ranges written with ", " parse the same and format like the broker.
    assert str(sub.state.individually_deleted) == (
        "[(601:42..601:99],(601:120..612:3],(612:7..612:9]]")
    assert sub.state.ledgers is s.ledgers
    assert sub.read_position == Position(612, 120)
    assert sub.messages_consumed_counter == 1580
    assert s.subscriptions["audit"].state.mark_delete == Position(590, -1)
    assert s.subscriptions["audit"].properties == {"#pulsar.internal.replicated.subscription": 1}


def test_partitioned_internal_stats() -> None:
    p1 = copy.deepcopy(INTERNAL_STATS)
    p1["lastConfirmedEntry"] = "700:4"
    p1["ledgers"] = [{"ledgerId": 700, "entries": 0, "size": 0, "offloaded": False}]
    p1["cursors"] = {}
    doc = {
        "metadata": {"partitions": 2},
        "partitions": {
            "persistent://acme/orders/events-partition-0": copy.deepcopy(INTERNAL_STATS),
            "persistent://acme/orders/events-partition-1": p1,
        },
    }
    ps = parse_partitioned_internal_stats("persistent://acme/orders/events", doc)
    assert ps.partitions == 2
    assert sorted(ps.stats) == [f"persistent://acme/orders/events-partition-{i}" for i in (0, 1)]
    assert ps.stats["persistent://acme/orders/events-partition-1"].ledgers.entries.tolist() == [5]


def test_empty_topic_and_missing_idm() -> None:
    doc = {"entriesAddedCounter": 0, "lastConfirmedEntry": "5:-1", "ledgers": [
        {"ledgerId": 5, "entries": 0, "size": 0, "offloaded": False}],
        "cursors": {"s": {"markDeletePosition": "5:-1", "readPosition": "5:0"}}}
    s = parse_internal_stats(TOPIC, doc)
    assert s.ledgers.entries.tolist() == [0]
    assert s.subscriptions["s"].state.individually_deleted == RangeSet()


def test_a_read_position_written_with_its_ack_set_is_read() -> None:
    """Pulsar 4.0.8 writes the read position of a cursor whose consumer seeks or acks by
    message id (the probe's) with its ack set: ``7326:1 (ackSet is null)``."""
    doc = {"entriesAddedCounter": 2, "lastConfirmedEntry": "7326:1", "ledgers": [
        {"ledgerId": 7326, "entries": 0, "size": 0, "offloaded": False}],
        "cursors": {"cursorsync-probe": {"markDeletePosition": "7326:0",
                                         "readPosition": "7326:1 (ackSet is null)"}}}
    s = parse_internal_stats(TOPIC, doc)
    assert s.subscriptions["cursorsync-probe"].read_position == Position(7326, 1)
    doc["cursors"]["cursorsync-probe"]["readPosition"] = "7326:1 (something else)"
    with pytest.raises(MalformedAdminOutputError, match="readPosition"):
        parse_internal_stats(TOPIC, doc)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.pop("ledgers"), "ledgers"),
    (lambda d: d.pop("lastConfirmedEntry"), "lastConfirmedEntry"),
    (lambda d: d.update(lastConfirmedEntry="612-119"), "lastConfirmedEntry"),
    (lambda d: d["ledgers"][0].pop("ledgerId"), "ledgers[0].ledgerId"),
    (lambda d: d["ledgers"][1].update(entries="500"), "ledgers[1].entries"),
    (lambda d: d["cursors"]["orders-svc"].pop("markDeletePosition"),
     "cursors.orders-svc.markDeletePosition"),
    (lambda d: d["cursors"]["orders-svc"].update(individuallyDeletedMessages="[(1:2..]"),
     "cursors.orders-svc.individuallyDeletedMessages"),
    (lambda d: d.update(cursors=[]), "cursors"),
    # A subscription name that would not show on one line is quoted.
    (lambda d: d["cursors"].update({"a\nb": {}}), "cursors.'a\\nb'.markDeletePosition"),
])
def test_malformed_fields_name_topic_and_field(mutate: Any, field: str) -> None:
    doc = copy.deepcopy(INTERNAL_STATS)
    mutate(doc)
    with pytest.raises(AdminError) as ei:
        parse_internal_stats(TOPIC, doc)
    assert TOPIC in str(ei.value)
    assert field in str(ei.value)


def test_partitions_and_topic_lists() -> None:
    assert parse_partitions("persistent://a/b/c", {"partitions": 3}) == 3
    assert parse_partitions("persistent://a/b/c", {"partitions": 0}) == 0
    with pytest.raises(AdminError, match="partitions"):
        parse_partitions("persistent://a/b/c", {"partition": 3})
    with pytest.raises(AdminError, match="negative"):
        parse_partitions("persistent://a/b/c", {"partitions": -1})
    names = ["persistent://a/b/x", "persistent://a/b/y-partition-0"]
    assert parse_topic_list("a/b", names) == names
    with pytest.raises(AdminError, match="a/b"):
        parse_topic_list("a/b", {"topics": names})


def test_malformed_json_names_what() -> None:
    with pytest.raises(AdminError, match="internalStats of x"):
        parse_json("internalStats of x", "{not json")
    assert parse_json("x", json.dumps({"a": 1})) == {"a": 1}


def test_partitioned_missing_metadata() -> None:
    with pytest.raises(AdminError, match="metadata"):
        parse_partitioned_internal_stats("persistent://acme/orders/events", {"partitions": {}})


def test_creation_date_from_internal_info() -> None:
    from datetime import UTC, datetime

    from cursorsync.pulsar.stats import parse_creation_date

    doc = {"version": 39, "creationDate": "2026-11-25T06:59:13.775Z", "ledgers": []}
    assert parse_creation_date("persistent://t/n/x", doc) == datetime(
        2026, 11, 25, 6, 59, 13, 775000, tzinfo=UTC)
    for bad, says in [({}, "field creationDate is missing"),
                      ({"creationDate": 5}, "field creationDate has an unexpected type"),
                      ({"creationDate": "yesterday"}, "creationDate is not an ISO 8601 time"),
                      ([], "response is not a JSON object")]:
        with pytest.raises(MalformedAdminOutputError, match=says):
            parse_creation_date("persistent://t/n/x", bad)
