"""Which acked source entries are markers, asked of the real test bed (Pulsar 4.0.8) two
ways: the admin API's raw entry read, one request per entry (``AdminMarkerLookup``), and
cursorsync's broker plugin, one request per partition (``PluginMarkerLookup``). Both are
compared with the raw entries' own marker header, over markers of replicated
subscriptions, the chunks of chunked messages, plain messages and ids the topic does not
store."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import httpx
import pytest

from cursorsync.core.positions import Position
from cursorsync.pulsar import marker_lookup
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.marker_lookup import AdminMarkerLookup, PluginMarkerLookup
from cursorsync_devtools.testbed import TestBed
from tests.support.skipped_ids import markers_chunks_and_messages, raw_headers, stored

pytestmark = [pytest.mark.integration, pytest.mark.shares("index_testbed")]


@pytest.fixture
def admin_a(index_testbed: TestBed) -> Iterator[AdminClient]:
    admin = AdminClient(AdminSettings.from_urls(index_testbed.admin_url("a"), cluster="a"))
    yield admin
    admin.close()


def _asked(bed: TestBed, topic: str) -> tuple[list[Position], set[Position]]:
    """Every stored entry of ``topic`` on a, and the markers among them by their raw
    entries' header."""
    entries = stored(bed, "a", topic)
    markers = {p for p in entries if "X-Pulsar-marker-type" in raw_headers(bed, "a", topic, p)}
    return entries, markers


def _absent(entries: list[Position]) -> list[Position]:
    """Ids the topic does not store: far past its last entry (its brokers still write a
    marker or two after it), in a ledger it never had, and before its first entry."""
    last = entries[-1]
    return [Position(last.ledger, last.entry + 10_000), Position(last.ledger + 10_000, 0),
            Position(entries[0].ledger, -1)]


def test_the_plugin_names_the_markers_the_raw_entries_name_in_one_request(
        index_testbed: TestBed, admin_a: AdminClient, topic_name: Callable[[str], str]) -> None:
    (topic,) = index_testbed.create_topic(topic_name("markers"))
    markers_chunks_and_messages(index_testbed, topic, updates=True)
    asked, markers = _asked(index_testbed, topic)
    # Markers of snapshots and of the acked message's update, chunks and messages.
    assert len(markers) >= 3 and len(asked) - len(markers) >= 3 + 2 * 2 + 1
    by_entry = AdminMarkerLookup(admin_a)
    plugin = PluginMarkerLookup(admin_a, AdminMarkerLookup(admin_a))
    assert set(by_entry(topic, asked)) == markers
    # The ids it does not store are no markers, and named missing.
    assert set(plugin(topic, asked + _absent(asked))) == markers
    assert plugin.requests_by_kind() == {"plugin-markers": 1, "raw-entry": 0}
    assert by_entry.requests_by_kind() == {"raw-entry": len(asked)}


def test_more_entries_than_a_request_holds_are_asked_in_several(
        index_testbed: TestBed, admin_a: AdminClient, topic_name: Callable[[str], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (topic,) = index_testbed.create_topic(topic_name("markers-split"))
    markers_chunks_and_messages(index_testbed, topic)
    asked, markers = _asked(index_testbed, topic)
    monkeypatch.setattr(marker_lookup, "MARKERS_PER_REQUEST", 4)
    plugin = PluginMarkerLookup(admin_a, AdminMarkerLookup(admin_a))
    asked += _absent(asked)
    assert set(plugin(topic, asked)) == markers
    assert plugin.requests_by_kind() == {"plugin-markers": -(-len(asked) // 4), "raw-entry": 0}


def test_the_plugin_refuses_a_malformed_or_oversized_question(
        index_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    (topic,) = index_testbed.create_topic(topic_name("markers-bad"))
    url = index_testbed.admin_url("a") + "/cursorsync/markers"
    for entries, why in (("12:x", "entries 12:x: expected a position ledger:entry"),
                         ("12:4-x", "entries 12:4-x: expected ledger:first-last"),
                         ("12:4-2", "entries 12:4-2: the run ends before it begins"),
                         ("1:0-999,2:0", "at most 1000 a request")):
        bad = httpx.get(url, params={"topic": topic, "entries": entries}, timeout=10)
        assert bad.status_code == 400 and why in bad.json()["error"], (entries, bad.text)
    none = httpx.get(url, params={"topic": topic}, timeout=10)
    assert none.status_code == 400 and "entries is required" in none.json()["error"]


def test_without_the_plugin_the_lookup_reads_entry_by_entry_and_says_so(
        testbed: TestBed, topic_name: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    (topic,) = testbed.create_topic(topic_name("markers-no-plugin"))
    markers_chunks_and_messages(testbed, topic)
    asked, markers = _asked(testbed, topic)
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("a"), cluster="a")) as admin:
        plugin = PluginMarkerLookup(admin, AdminMarkerLookup(admin))
        with caplog.at_level(logging.WARNING):
            assert set(plugin(topic, asked)) == markers
            assert set(plugin(topic, asked)) == markers  # left alone: no second warning
    assert plugin.requests_by_kind() == {"plugin-markers": 1, "raw-entry": 2 * len(asked)}
    warned = [r.getMessage() for r in caplog.records if "broker plugin" in r.getMessage()]
    assert len(warned) == 1 and "a raw entry read per entry" in warned[0], warned
