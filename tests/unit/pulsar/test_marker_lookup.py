"""Which entries are markers (cursorsync.pulsar.marker_lookup): one raw-entry request each,
or many per request from the brokers' plugin, asked of a stub broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from cursorsync.core.positions import Position
from cursorsync.errors import MalformedAdminOutputError
from cursorsync.pulsar.cursor_digests import PLUGIN_RETRY_S
from cursorsync.pulsar.marker_lookup import (
    MARKERS_PATH,
    MARKERS_PER_REQUEST,
    AdminMarkerLookup,
    PluginMarkerLookup,
    parse_markers,
)
from tests.support.admin_stub import Reply, StubAdmin
from tests.support.admin_stub import fast_client as client

T = "persistent://acme/orders/events-partition-0"
P = Position.parse


def answer(markers: list[str], missing: list[str] = (), topic: str = T) -> dict[str, Any]:
    return {"plugin": "cursorsync", "topic": topic, "markers": list(markers),
            "missing": list(missing)}


def path(*entries: str) -> str:
    return f"{MARKERS_PATH}?{urlencode([('topic', T), *(('entry', e) for e in entries)])}"


def test_an_answer_gives_the_markers_in_the_order_asked() -> None:
    """Entries held that are not markers are in neither list."""
    asked = [P("3:1"), P("3:2"), P("3:3"), P("1:0")]
    assert parse_markers(T, asked, answer(["3:3", "3:1"], ["1:0"])) == [P("3:1"), P("3:3")]


@pytest.mark.parametrize(("doc", "why"), [
    (answer(["3:1", "3:9"]), "entry 3:9 answered, not asked"),
    (answer(["3:1", "3:2"], ["3:2"]), "entry 3:2 answered both a marker and missing"),
    (answer(["3:x"], ["3:2"]), "markers: '3:x' is not ledger:entry"),
    ({**answer([], ["3:1", "3:2"]), "missing": "3:1"}, "missing: expected a list"),
    (answer(["3:1", "3:2"], topic=T + "x"), "the answer is for topic"),
    ({**answer(["3:1", "3:2"]), "plugin": None}, "plugin is None"),
])
def test_anything_else_is_one_error_naming_the_topic(doc: Any, why: str) -> None:
    with pytest.raises(MalformedAdminOutputError, match=f"markers of {T}: .*{why}"):
        parse_markers(T, [P("3:1"), P("3:2")], doc)


@pytest.fixture
def stub() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


def raw(marker: bool) -> Reply:
    """A raw-entry answer: an empty entry, with a marker type or without."""
    headers = {"X-Pulsar-num-batch-message": "1"}
    if marker:
        headers["X-Pulsar-marker-type"] = "10"
    return Reply(raw=b"", headers=headers)


def test_the_plugin_answers_many_entries_per_request(stub: StubAdmin) -> None:
    entries = [f"4:{i}" for i in range(MARKERS_PER_REQUEST + 5)]
    stub.set(path(*entries[:MARKERS_PER_REQUEST]), Reply(body=answer(
        entries[:2], entries[2:MARKERS_PER_REQUEST])))
    stub.set(path(*entries[MARKERS_PER_REQUEST:]), Reply(body=answer(
        [entries[-1]], entries[MARKERS_PER_REQUEST:-1])))
    with client(stub.url) as admin:
        lookup = PluginMarkerLookup(admin, AdminMarkerLookup(admin))
        got = lookup(T, [P(e) for e in entries])
    assert got == [P("4:0"), P("4:1"), P(entries[-1])]
    assert lookup.requests_by_kind() == {"plugin-marker": 2, "raw-entry": 0}


def test_without_the_plugin_each_entry_is_a_raw_entry_request_for_a_while(
        stub: StubAdmin, caplog: pytest.LogCaptureFixture) -> None:
    base = "/admin/v2/persistent/acme/orders/events-partition-0/ledger/4/entry"
    stub.set(f"{base}/0", raw(True))
    stub.set(f"{base}/1", raw(False))
    with client(stub.url) as admin:
        lookup = PluginMarkerLookup(admin, AdminMarkerLookup(admin))
        now = [0.0]
        lookup.clock = lambda: now[0]
        assert lookup(T, [P("4:0"), P("4:1")]) == [P("4:0")]  # 404 without the mark
        assert "one raw-entry request per entry for the next" in caplog.text
        assert lookup(T, [P("4:0")]) == [P("4:0")]
        assert sum(1 for p, _ in stub.requests if p.startswith(MARKERS_PATH)) == 1
        now[0] += PLUGIN_RETRY_S
        stub.set(path("4:0"), Reply(body=answer([], ["4:0"])))
        assert lookup(T, [P("4:0")]) == []
    assert lookup.requests_by_kind() == {"plugin-marker": 1, "raw-entry": 3}


def test_a_topic_the_plugin_does_not_know_is_asked_entry_by_entry_that_once(
        stub: StubAdmin) -> None:
    """The plugin's own 404 for a topic (deleted, or being made): the raw entries say what
    the admin API says of it; the plugin is asked again next time."""
    stub.set(path("4:0"), Reply(404, {"plugin": "cursorsync", "error": "topic not found"}),
             Reply(body=answer(["4:0"])))
    with client(stub.url) as admin:
        lookup = PluginMarkerLookup(admin, AdminMarkerLookup(admin))
        assert lookup(T, [P("4:0")]) == []  # no raw entry either: not a marker
        assert lookup(T, [P("4:0")]) == [P("4:0")]
    assert lookup.requests_by_kind() == {"plugin-marker": 1, "raw-entry": 1}
