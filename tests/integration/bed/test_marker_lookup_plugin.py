"""The broker plugin's markers answer (``GET /cursorsync/markers``) against the admin API's
raw entries, one request each, on the real test bed (Pulsar 4.0.8 with the plugin)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cursorsync.core.positions import Position
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.marker_lookup import AdminMarkerLookup, PluginMarkerLookup
from cursorsync_devtools.testbed import TestBed
from tests.support.replicated import send_with_snapshots
from tests.support.skipped_ids import raw_headers, stored

pytestmark = pytest.mark.integration


def test_the_plugin_names_the_markers_the_raw_entries_show(
        index_testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Messages with replicated subscriptions' snapshot markers between them: the plugin
    names exactly the entries whose raw entry carries a marker type, in one request; ids
    the topic does not hold (past the last entry, in no ledger of it) are not markers."""
    bed = index_testbed
    (t,) = bed.create_topic(topic_name("markers"))
    sub = send_with_snapshots(bed.client("a"), t, 4)
    held = stored(bed, "a", t)
    last = held[-1]
    asked = [*held, Position(last.ledger, last.entry + 1), Position(last.ledger + 1000, 0)]
    with AdminClient(AdminSettings.from_urls(bed.admin_url("a"), cluster="a")) as admin:
        raw = AdminMarkerLookup(admin)
        plugin = PluginMarkerLookup(admin, AdminMarkerLookup(admin))
        from_plugin = plugin(t, asked)
        from_raw = raw(t, held)
    want = [p for p in held if "X-Pulsar-marker-type" in raw_headers(bed, "a", t, p)]
    assert len(want) >= 3 and len(want) < len(held), (want, held)  # messages and markers
    assert from_plugin == from_raw == want
    assert plugin.requests_by_kind() == {"plugin-marker": 1, "raw-entry": 0}
    sub.close()
