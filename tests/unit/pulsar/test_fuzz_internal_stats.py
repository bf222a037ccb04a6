"""internalStats JSON fuzzed: the fields read, any mutation or random body one error naming
the field, and the admin client turning malformed bodies into that one error."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cursorsync.core.positions import (
    Position,
    format_range_bounds,
)
from cursorsync.core.ranges import RangeSet
from cursorsync.errors import MalformedAdminOutputError
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.stats import (
    parse_internal_stats,
    parse_json,
    parse_partitioned_internal_stats,
)
from cursorsync.pulsar.topics import TopicName
from tests.support.admin_stub import Reply, StubAdmin
from tests.support.fuzzing import FUZZ, _get, paths, render, set_path

# ------------------------------------------------------------------------ internalStats JSON


TOPIC = TopicName.parse("persistent://acme/orders/events-partition-0")
IDS = st.integers(0, 2**62)


@st.composite
def range_text(draw: st.DrawFn) -> str:
    ledger = draw(IDS)
    starts = sorted(draw(st.sets(st.integers(-1, 10_000), max_size=5)))
    rows = [(ledger, s, ledger, s + draw(st.integers(1, 3))) for s in starts]
    return format_range_bounds(np.array(rows, dtype=np.int64).reshape(-1, 4))


@st.composite
def cursor_docs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "markDeletePosition": str(Position(draw(IDS), draw(st.integers(-1, 2**62)))),
        "individuallyDeletedMessages": draw(range_text()),
        "messagesConsumedCounter": draw(st.integers(0, 2**62)),
    }
    if draw(st.booleans()):
        doc["readPosition"] = str(Position(draw(IDS), draw(st.integers(0, 2**62))))
    if draw(st.booleans()):
        doc["properties"] = draw(st.dictionaries(st.text(max_size=8), st.integers(0, 9),
                                                 max_size=2))
    return doc


@st.composite
def internal_stats_docs(draw: st.DrawFn) -> dict[str, Any]:
    ids = sorted(draw(st.sets(IDS, min_size=0, max_size=5)))
    ledgers = [{"ledgerId": i, "entries": draw(st.integers(0, 10**6)), "size": 0}
               for i in ids]
    if ledgers:
        ledgers[-1]["entries"] = 0
    pick_listed = bool(ids) and draw(st.booleans())
    lce_ledger = draw(st.sampled_from(ids)) if pick_listed else draw(IDS)
    names = draw(st.sets(st.sampled_from(["orders-svc", "audit", "a b", "pulsar.repl.b",
                                          "pulsar.repl.c"]), max_size=4))
    return {
        "entriesAddedCounter": draw(st.integers(0, 2**62)),
        "currentLedgerEntries": draw(st.integers(0, 10**6)),
        "lastConfirmedEntry": str(Position(lce_ledger, draw(st.integers(-1, 10**6)))),
        "state": draw(st.sampled_from(["LedgerOpened", "ClosedLedger"])),
        "ledgers": draw(st.permutations(ledgers)),
        "cursors": {n: draw(cursor_docs()) for n in sorted(names)},
    }


@FUZZ
@given(internal_stats_docs())
def test_internal_stats_from_json_have_the_fields(doc: dict[str, Any]) -> None:
    stats = parse_internal_stats(TOPIC, parse_json("internalStats", json.dumps(doc).encode()))
    lce = Position.parse(doc["lastConfirmedEntry"])
    assert stats.last_confirmed_entry == lce
    assert stats.entries_added_counter == doc["entriesAddedCounter"]
    rows = sorted((r["ledgerId"], r["entries"]) for r in doc["ledgers"])
    if rows:
        live = lce.entry + 1 if lce.ledger == rows[-1][0] else doc["currentLedgerEntries"]
        rows[-1] = (rows[-1][0], max(rows[-1][1], live))
    assert stats.ledgers.ids.tolist() == [r[0] for r in rows]
    assert stats.ledgers.entries.tolist() == [r[1] for r in rows]
    assert set(stats.subscriptions) | set(stats.replicators) == set(doc["cursors"])
    assert all(n.startswith("pulsar.repl.") for n in stats.replicators)
    for name, cs in {**stats.subscriptions, **stats.replicators}.items():
        cdoc = doc["cursors"][name]
        assert cs.state.mark_delete == Position.parse(cdoc["markDeletePosition"])
        assert cs.state.individually_deleted == RangeSet.parse(cdoc["individuallyDeletedMessages"])
        assert cs.individually_deleted_text == cdoc["individuallyDeletedMessages"]
        assert cs.messages_consumed_counter == cdoc["messagesConsumedCounter"]
        assert cs.read_position == (Position.parse(cdoc["readPosition"])
                                    if "readPosition" in cdoc else None)
        assert cs.properties == cdoc.get("properties", {})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6,
)

#: Numbers a Java long field must not hold, and wrong types.
bad_numbers = st.sampled_from([-1, -(2**63) - 1, 2**63, 2**64, 10**30, 1.5, True, "7", None])


def check_admin_error(err: MalformedAdminOutputError, path: tuple[str | int, ...]) -> None:
    """The error names the topic and the field, down to the part of ``path`` it reads."""
    message = str(err)
    assert str(TOPIC) in message, message
    assert "\n" not in message
    prefixes = [render(path[:k]) for k in range(len(path), 0, -1)]
    assert any(p in message for p in prefixes), (path, message)


@FUZZ
@given(internal_stats_docs(), st.data())
def test_internal_stats_mutated_raise_malformed_naming_the_field(
        doc: dict[str, Any], data: st.DataObject) -> None:
    all_paths = list(paths(doc))
    assume(all_paths)
    path = data.draw(st.sampled_from(all_paths), label="path")
    action = data.draw(st.sampled_from(["type", "number", "delete"]), label="action")
    mutated = copy.deepcopy(doc)
    if action == "delete":
        set_path(mutated, path, None, delete=True)
    else:
        value = data.draw(json_values if action == "type" else bad_numbers, label="value")
        set_path(mutated, path, value)
    text = json.dumps(mutated)
    try:
        parse_internal_stats(TOPIC, parse_json("internalStats", text))
    except MalformedAdminOutputError as err:
        check_admin_error(err, path)


READ_FIELDS = {"lastConfirmedEntry", "ledgers", "ledgerId", "entries", "currentLedgerEntries",
               "entriesAddedCounter", "cursors", "markDeletePosition",
               "individuallyDeletedMessages", "readPosition", "messagesConsumedCounter",
               "properties", "state"}


@FUZZ
@given(internal_stats_docs(), st.data())
def test_internal_stats_wrong_type_in_a_read_field_is_named_exactly(
        doc: dict[str, Any], data: st.DataObject) -> None:
    lce = Position.parse(doc["lastConfirmedEntry"])
    reads_current = bool(doc["ledgers"]) and lce.ledger != max(
        r["ledgerId"] for r in doc["ledgers"])
    read = [p for p in paths(doc) if p[-1] in READ_FIELDS and not (
        len(p) == 2 and p[0] == "cursors") and (reads_current or p != ("currentLedgerEntries",))]
    assume(read)
    path = data.draw(st.sampled_from(read), label="path")
    value = data.draw(st.sampled_from([[], {}, 1.5, True, [1], {"a": 1}, "x:y", 2**64]),
                      label="value")
    current = _get(doc, path)
    assume(type(value) is not type(current) and not (value == {} and path[-1] == "properties"))
    mutated = copy.deepcopy(doc)
    set_path(mutated, path, value)
    with pytest.raises(MalformedAdminOutputError) as info:
        parse_internal_stats(TOPIC, mutated)
    assert render(path) in str(info.value), (path, str(info.value))


@FUZZ
@given(st.one_of(st.binary(max_size=80), st.text(max_size=80).map(str.encode),
                 json_values.map(lambda v: json.dumps(v).encode())))
def test_internal_stats_random_bodies(body: bytes) -> None:
    try:
        doc = parse_json("internalStats of t", body)
    except MalformedAdminOutputError as err:
        assert "internalStats of t" in str(err)
        return
    try:
        parse_internal_stats(TOPIC, doc)
    except MalformedAdminOutputError as err:
        assert str(TOPIC) in str(err)


def test_deeply_nested_json_is_malformed_not_a_recursion_error() -> None:
    with pytest.raises(MalformedAdminOutputError, match="internalStats of t"):
        parse_json("internalStats of t", b"[" * 100_000)


@FUZZ
@given(st.dictionaries(st.text(max_size=30), json_values, max_size=3),
       st.one_of(json_values, st.fixed_dictionaries({"partitions": json_values})))
def test_partitioned_internal_stats_random_shapes(parts: dict[str, Any], meta: Any) -> None:
    base = "persistent://acme/orders/events"
    try:
        parse_partitioned_internal_stats(base, {"metadata": meta, "partitions": parts})
    except MalformedAdminOutputError as err:
        assert base in str(err) or any(k and k in str(err) for k in parts), str(err)


@pytest.fixture(scope="module")
def stub() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=60),
                 internal_stats_docs().map(lambda d: json.dumps(d)[:-3].encode()),
                 json_values.map(lambda v: json.dumps(v).encode())))
def test_admin_client_turns_malformed_bodies_into_one_error(stub: StubAdmin, body: bytes) -> None:
    stub.set(TOPIC.admin_path("internalStats"), Reply(200, raw=body))
    with AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as client:
        try:
            client.internal_stats(TOPIC)
        except MalformedAdminOutputError as err:
            assert str(TOPIC) in str(err)
