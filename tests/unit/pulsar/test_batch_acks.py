"""The broker plugin's answer (cursorsync.pulsar.batch_acks): parsing, and asking a stub broker."""

from __future__ import annotations

import contextlib
import copy
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cursorsync.core.positions import Position
from cursorsync.errors import AdminUnavailableError, MalformedAdminOutputError
from cursorsync.pulsar.batch_acks import (
    PLUGIN_PATH,
    BatchAcksNotFoundError,
    BatchAcksPluginAbsentError,
    fetch_batch_acks,
    fetch_every_batch,
    parse_batch_acks,
)
from tests.support.admin_stub import Reply, StubAdmin
from tests.support.admin_stub import fast_client as client

T = "persistent://acme/orders/events-partition-0"
S = "svc"


def ack_set(size: int, acked: set[int]) -> list[int]:
    """Java's BitSet.toLongArray() of the indexes not acked: signed 64-bit words, trailing
    zero words dropped."""
    value = sum(1 << i for i in range(size) if i not in acked)
    words = []
    while value:
        word = value & ((1 << 64) - 1)
        words.append(word - (1 << 64) if word >> 63 else word)
        value >>= 64
    return words


def entry(position: str, size: int, acked: set[int]) -> dict[str, Any]:
    return {"position": position, "batchSize": size, "ackSet": ack_set(size, acked),
            "ackedIndexes": sorted(acked)}


def answer(*entries: dict[str, Any], md: str = "12:3", kept: bool = True) -> dict[str, Any]:
    return {"plugin": "cursorsync", "topic": T, "subscription": S, "markDeletePosition": md,
            "batchIndexAcks": kept, "entries": list(entries), "truncated": False}


def test_an_answer_reads_as_position_to_acked_indexes() -> None:
    got = parse_batch_acks(T, S, answer(entry("12:5", 5, {0, 3, 4}), entry("13:0", 3, {1})))
    assert got.mark_delete == Position(12, 3)
    assert got.batch_index_acks and not got.truncated
    assert got.acked == {Position(12, 5): frozenset({0, 3, 4}), Position(13, 0): frozenset({1})}
    assert [b.size for b in got.batches] == [5, 3]


def test_the_plugins_own_words_for_a_batch_of_five() -> None:
    # As the plugin answered on the test bed: indexes 0, 3 and 4 acked leave bits 1 and 2.
    assert ack_set(5, {0, 3, 4}) == [6]
    doc = answer({"position": "3:0", "batchSize": 5, "ackSet": [6], "ackedIndexes": [0, 3, 4]},
                 md="3:-1")
    assert parse_batch_acks(T, S, doc).acked == {Position(3, 0): frozenset({0, 3, 4})}


def test_a_broker_keeping_no_indexes_says_so() -> None:
    got = parse_batch_acks(T, S, answer(kept=False))
    assert not got.batch_index_acks and got.batches == ()


@given(st.integers(2, 200).flatmap(lambda n: st.tuples(
    st.just(n), st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))))
def test_any_partly_acked_batch_reads_back(case: tuple[int, set[int]]) -> None:
    size, acked = case  # batches past 64 messages take several words, bit 63 negative
    got = parse_batch_acks(T, S, answer(entry("12:5", size, acked)))
    assert got.acked == {Position(12, 5): frozenset(acked)}


BROKEN: list[tuple[str, Any, str]] = [
    ("not an object", [], "expected a JSON object"),
    ("another plugin", {**answer(), "plugin": "other"}, "plugin is 'other'"),
    ("another topic", {**answer(), "topic": T + "x"}, "the answer is for topic"),
    ("another subscription", {**answer(), "subscription": "x"}, "for subscription"),
    ("bad markDelete", {**answer(), "markDeletePosition": "12"}, "markDeletePosition"),
    ("no batchIndexAcks", {**answer(), "batchIndexAcks": 1}, "batchIndexAcks"),
    ("no truncated", {k: v for k, v in answer().items() if k != "truncated"}, "truncated"),
    ("entries not a list", {**answer(), "entries": {}}, "entries: expected a list"),
    ("entries while none kept", answer(entry("12:5", 5, {1}), kept=False), "yet batchIndexAcks"),
    ("entry not an object", answer(5), "entries[0]: expected an object"),  # type: ignore[arg-type]
    ("size one", answer({**entry("12:5", 2, {1}), "batchSize": 1}), "batchSize"),
    ("size a bool", answer({**entry("12:5", 2, {1}), "batchSize": True}), "batchSize"),
    ("words not ints", answer({**entry("12:5", 5, {1}), "ackSet": ["6"]}), "ackSet"),
    ("word too wide", answer({**entry("12:5", 5, {1}), "ackSet": [1 << 64]}), "ackSet"),
    ("indexes unsorted", answer({**entry("12:5", 5, {1, 2}), "ackedIndexes": [2, 1]}),
     "not distinct indexes in order"),
    ("index past size", answer({**entry("12:5", 5, {1}), "ackedIndexes": [5]}),
     "below the batch size 5"),
    ("all acked", answer({**entry("12:5", 5, {1}), "ackedIndexes": [0, 1, 2, 3, 4]}),
     "5 of 5 acked"),
    ("none acked", answer({**entry("12:5", 5, {1}), "ackedIndexes": []}), "0 of 5 acked"),
    ("words disagree", answer({**entry("12:5", 5, {1}), "ackSet": [6]}), "disagrees"),
    ("bit past size", answer({**entry("12:5", 5, {1}), "ackSet": [29 | 64]}), "disagrees"),
    ("at markDelete", answer(entry("12:3", 5, {1})), "at or before the markDeletePosition"),
    ("out of order", answer(entry("12:6", 5, {1}), entry("12:5", 5, {1})), "does not follow"),
]


@pytest.mark.parametrize(("doc", "why"), [(d, w) for _, d, w in BROKEN],
                         ids=[n for n, _, _ in BROKEN])
def test_anything_else_is_one_error_naming_topic_and_subscription(doc: Any, why: str) -> None:
    with pytest.raises(MalformedAdminOutputError) as err:
        parse_batch_acks(T, S, copy.deepcopy(doc))
    assert f"batch acks of subscription {S} on {T}: " in str(err.value)
    assert why in str(err.value)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12))
def test_arbitrary_json_is_refused_or_read_never_crashes(doc: Any) -> None:
    with contextlib.suppress(MalformedAdminOutputError):
        parse_batch_acks(T, S, doc)


@pytest.fixture
def stub(admin: StubAdmin) -> StubAdmin:
    return admin


def path(**extra: Any) -> str:
    return f"{PLUGIN_PATH}?{urlencode({'topic': T, 'subscription': S, **extra})}"


def test_fetch_asks_the_plugin_and_parses(stub: StubAdmin) -> None:
    stub.set(path(limit=10), Reply(body=answer(entry("12:5", 5, {0}))))
    with client(stub.url) as admin:
        got = fetch_batch_acks(admin, T, S, limit=10)
    assert got.acked == {Position(12, 5): frozenset({0})}


def test_every_batch_is_read_a_page_at_a_time(stub: StubAdmin) -> None:
    """Each page after the last position of the one before; the first page's
    markDeletePosition; a batch acked whole between pages is simply not in the next."""
    first = answer(entry("12:5", 5, {0}), entry("12:7", 5, {1}))
    first["truncated"] = True
    second = answer(entry("12:9", 3, {2}), entry("13:0", 2, {0}), md="12:8")
    second["truncated"] = True
    stub.set(path(), Reply(body=first))
    stub.set(path(after="12:7"), Reply(body=second))
    stub.set(path(after="13:0"), Reply(body=answer(md="12:8")))
    with client(stub.url) as admin:
        got = fetch_every_batch(admin, T, S)
    assert got.mark_delete == Position(12, 3) and not got.truncated
    assert got.acked == {Position(12, 5): frozenset({0}), Position(12, 7): frozenset({1}),
                         Position(12, 9): frozenset({2}), Position(13, 0): frozenset({0})}
    assert [p for p, _ in stub.requests] == [path(), path(after="12:7"), path(after="13:0")]


def test_a_plugin_that_ignores_after_gives_its_first_page_truncated(
        stub: StubAdmin, caplog: pytest.LogCaptureFixture) -> None:
    first = answer(entry("12:5", 5, {0}))
    first["truncated"] = True
    stub.set(path(), Reply(body=first))
    stub.set(path(after="12:5"), Reply(body=first))
    with client(stub.url) as admin:
        got = fetch_every_batch(admin, T, S)
    assert got.truncated and got.acked == {Position(12, 5): frozenset({0})}
    assert "ignores the parameter after" in caplog.text


def test_fetch_follows_the_owners_redirect(stub: StubAdmin) -> None:
    owner = path(authoritative="true")
    stub.set(path(), Reply(307, {}, headers={"Location": stub.url + owner}))
    stub.set(owner, Reply(body=answer()))
    with client(stub.url) as admin:
        assert fetch_batch_acks(admin, T, S).batches == ()
    assert [p for p, _ in stub.requests] == [path(), owner]


def test_a_broker_without_the_plugin_is_told_from_an_unknown_subscription(
        stub: StubAdmin) -> None:
    with client(stub.url) as admin, pytest.raises(BatchAcksPluginAbsentError,
                                                  match="no cursorsync plugin loaded"):
        fetch_batch_acks(admin, T, S)  # the stub's 404 is not the plugin's
    stub.set(path(), Reply(404, {"plugin": "cursorsync", "error": "subscription svc not found"}))
    with client(stub.url) as admin, pytest.raises(BatchAcksNotFoundError,
                                                  match="subscription svc not found"):
        fetch_batch_acks(admin, T, S)
    assert len(stub.requests) == 2  # a 404 is not asked again


def test_a_broken_answer_or_a_failing_broker_is_an_admin_error(stub: StubAdmin) -> None:
    stub.set(path(), Reply(raw=b"<html>"))
    with client(stub.url) as admin, pytest.raises(MalformedAdminOutputError, match="svc"):
        fetch_batch_acks(admin, T, S)
    stub.set(path(), Reply(503, {"plugin": "cursorsync", "error": "no owner"}))
    with client(stub.url) as admin, pytest.raises(AdminUnavailableError, match="no owner"):
        fetch_batch_acks(admin, T, S)
