"""Markers among acked source entries, asked of the brokers' plugin (a stub broker here;
on the real bed: tests/integration/bed/test_marker_lookup_facts.py): what its answer must
be, and the lookup entry by entry while it cannot be asked."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest

from cursorsync.core.positions import Position
from cursorsync.errors import MalformedAdminOutputError
from cursorsync.pulsar import marker_lookup
from cursorsync.pulsar.cursor_digests import PLUGIN_RETRY_S
from cursorsync.pulsar.marker_lookup import (
    MARKERS_PATH,
    AdminMarkerLookup,
    PluginMarkerLookup,
    plugin_markers,
)
from cursorsync.pulsar.topics import TopicName
from tests.support.admin_stub import Reply, StubAdmin
from tests.support.admin_stub import fast_client as client

TOPIC = "persistent://acme/orders/events-partition-0"
ASKED = [Position(7, 3), Position(7, 4), Position(8, 0)]


def path(entries: str = "7:3-4,8:0") -> str:
    return f"{MARKERS_PATH}?" + urlencode({"topic": TOPIC, "entries": entries})


def answer(markers: list[str], missing: list[str] | None = None, **more: Any) -> dict[str, Any]:
    return {"plugin": "cursorsync", "topic": TOPIC, "markers": markers,
            "missing": missing or [], **more}


def raw_path(p: Position) -> str:
    return TopicName.parse(TOPIC).admin_path(f"ledger/{p.ledger}/entry/{p.entry}")


def test_the_markers_the_plugin_names(admin: StubAdmin) -> None:
    admin.set(path(), Reply(body=answer(["7:4"], ["8:0"])))
    with client(admin.url) as c:
        assert plugin_markers(c, TOPIC, ASKED) == [Position(7, 4)]


@pytest.mark.parametrize(("doc", "why"), [
    ({"topic": TOPIC, "markers": [], "missing": []}, "plugin is None"),
    (answer([], topic="persistent://acme/orders/other"), "the answer is for topic"),
    ({**answer([]), "markers": "7:4"}, "markers: expected a list"),
    ({**answer([]), "missing": None}, "missing: expected a list"),
    (answer(["7:x"]), "'7:x' is not a position"),
    (answer(["9:9"]), "markers: 9:9 was not asked"),
    (answer([], ["1:1"]), "missing: 1:1 was not asked"),
])
def test_anything_else_is_one_error_naming_the_question(admin: StubAdmin, doc: dict[str, Any],
                                                         why: str) -> None:
    admin.set(path(), Reply(body=doc))
    with client(admin.url) as c, pytest.raises(
            MalformedAdminOutputError, match=f"cluster .*: markers among 3 entries of {TOPIC}: "
                                             f".*{why}"):
        plugin_markers(c, TOPIC, ASKED)


def test_a_plugin_that_cannot_answer_is_left_alone_and_entries_read_one_by_one(
        admin: StubAdmin, caplog: pytest.LogCaptureFixture) -> None:
    """The broker has no plugin (a 404 without its mark): each entry's raw read answers,
    the plugin is asked again after PLUGIN_RETRY_S only."""
    for p in ASKED:
        admin.set(raw_path(p), Reply(404, {"reason": "not found"}))
    with client(admin.url) as c:
        lookup = PluginMarkerLookup(c, AdminMarkerLookup(c))
        now = [100.0]
        lookup.clock = lambda: now[0]
        assert lookup(TOPIC, ASKED) == []
        assert lookup(TOPIC, ASKED) == []
        assert lookup.requests_by_kind() == {"plugin-markers": 1, "raw-entry": 6}
        now[0] += PLUGIN_RETRY_S
        admin.set(path(), Reply(body=answer(["7:3", "8:0"])))
        assert lookup(TOPIC, ASKED) == [Position(7, 3), Position(8, 0)]
        assert lookup.requests_by_kind() == {"plugin-markers": 2, "raw-entry": 6}
    warned = [r for r in caplog.records if "broker plugin" in r.getMessage()]
    assert len(warned) == 1


def test_nothing_asked_asks_nothing(admin: StubAdmin) -> None:
    with client(admin.url) as c:
        lookup = PluginMarkerLookup(c, AdminMarkerLookup(c))
        assert lookup(TOPIC, []) == []
        assert lookup.requests_by_kind() == {"plugin-markers": 0, "raw-entry": 0}
    assert admin.requests == []


def test_entries_are_asked_as_runs_and_split_by_entries_and_runs(
        admin: StubAdmin, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request names runs of one ledger's entries (the URL of an id each would pass the
    brokers' header limit); more entries or runs than a request holds go in several."""
    monkeypatch.setattr(marker_lookup, "MARKERS_PER_REQUEST", 4)
    monkeypatch.setattr(marker_lookup, "MARKER_RUNS_PER_REQUEST", 2)
    asked = [Position(7, e) for e in (1, 2, 3, 4, 5, 9)] + [Position(8, 0), Position(9, 2)]
    admin.set(path("7:1-4"), Reply(body=answer(["7:2"])))
    admin.set(path("7:5,7:9"), Reply(body=answer([], ["7:9"])))
    admin.set(path("8:0,9:2"), Reply(body=answer(["9:2"])))
    with client(admin.url) as c:
        lookup = PluginMarkerLookup(c, AdminMarkerLookup(c))
        assert lookup(TOPIC, asked) == [Position(7, 2), Position(9, 2)]
        assert lookup.requests_by_kind() == {"plugin-markers": 3, "raw-entry": 0}
