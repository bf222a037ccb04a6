"""Snapshot markers on the real test bed: a snapshot pairs the position of b's response on a
with b's position."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from cursorsync.core.positions import Position
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.markers import (
    Marker,
    Snapshot,
    SnapshotRequest,
    SnapshotResponse,
    SubscriptionUpdate,
    parse_marker,
)
from cursorsync_devtools.testbed import TestBed
from tests.support.replicated import send_with_snapshots, source_positions_on_b
from tests.support.waiting import wait_for

# --------------------------------------------------------------------------- real Pulsar


def all_entries(bed: TestBed, cluster: str, topic: str) -> list[Position]:
    st_ = bed.internal_stats(cluster, topic)
    last = Position.parse(st_["lastConfirmedEntry"])
    out = []
    for lg in st_["ledgers"]:
        n = lg["entries"] if lg["ledgerId"] != last.ledger else last.entry + 1
        out += [Position(lg["ledgerId"], e) for e in range(n)]
    return out


def markers_on(admin: AdminClient, bed: TestBed, cluster: str, topic: str
               ) -> dict[Position, Marker]:
    """Every marker stored in the topic on ``cluster``, by position, through the admin client."""
    found: dict[Position, Marker] = {}
    for pos in all_entries(bed, cluster, topic):
        raw = admin.raw_entry(topic, pos.ledger, pos.entry)
        assert raw is not None, pos
        if raw.is_marker:
            assert raw.marker_type is not None and raw.body is not None, (pos, raw)
            marker = parse_marker(raw.marker_type, raw.body,
                                  where=f"entry {pos} of {topic} on cluster {cluster}")
            assert marker is not None, (pos, raw)
            found[pos] = marker
    return found


@pytest.mark.integration
def test_a_snapshot_pairs_the_position_of_b_s_response_on_a_with_b_s_position(
        testbed: TestBed, topic_name: Callable[[str], str]) -> None:
    """Snapshot evidence: on Pulsar 4.0 a SNAPSHOT on a is an anchor pair. ``local`` is
    where b's RESPONSE landed on a; ``clusters['b']`` is the position b named in it, at or
    after b's copy of the REQUEST; everything b holds up to there that came from a came
    from before ``local``. Acks on a reach b as UPDATE markers naming the b side of one of
    a's snapshots; an id past the open ledger's last entry is None with ``past_end_ok``."""
    (t,) = testbed.create_topic(topic_name("anchors"))
    sub = send_with_snapshots(testbed.client("a"), t, 4)
    with AdminClient(AdminSettings.from_urls(testbed.admin_url("a"), cluster="a")) as admin_a, \
            AdminClient(AdminSettings.from_urls(testbed.admin_url("b"), cluster="b")) as admin_b:
        on_a = markers_on(admin_a, testbed, "a", t)  # first: b then holds all they name
        on_b = markers_on(admin_b, testbed, "b", t)
        from_a = source_positions_on_b(testbed, t)
        snapshots = [m for m in on_a.values() if isinstance(m, Snapshot)]
        assert snapshots, on_a
        # b holds the subscription too and takes snapshots of its own: a answers them, so
        # a's topic also holds REQUESTs from b and RESPONSEs naming a.
        from_b = {m.snapshot_id for m in on_a.values()
                  if isinstance(m, SnapshotRequest) and m.source_cluster == "b"}
        for m in on_a.values():
            if isinstance(m, SnapshotResponse):
                assert m.cluster == "b" or (m.cluster == "a" and m.snapshot_id in from_b), m
        requests_on_b = {m.snapshot_id: pos for pos, m in on_b.items()
                         if isinstance(m, SnapshotRequest)}
        for snap in snapshots:
            assert set(snap.clusters) == {"b"}, snap
            at_b = snap.clusters["b"]
            assert on_a.get(snap.local) == SnapshotResponse(snap.snapshot_id, "b", at_b), (
                snap, on_a)
            assert snap.snapshot_id in requests_on_b, (snap, on_b)
            assert requests_on_b[snap.snapshot_id] <= at_b, (snap, on_b)
            assert on_b[requests_on_b[snap.snapshot_id]] == SnapshotRequest(
                snap.snapshot_id, "a")
            covered = {b: src for b, src in from_a.items() if b <= at_b}
            assert all(src < snap.local for src in covered.values()), (snap, covered)

        for _ in range(4):
            sub.acknowledge(sub.receive(10_000))

        def updates() -> list[SubscriptionUpdate]:
            return [m for m in markers_on(admin_b, testbed, "b", t).values()
                    if isinstance(m, SubscriptionUpdate)]

        got = wait_for("an UPDATE marker on b", updates, timeout_s=60)
        assert all(u.subscription == "rs" and set(u.clusters) == {"b"} for u in got), got
        anchors_b = {m.clusters["b"] for m in markers_on(admin_a, testbed, "a", t).values()
                     if isinstance(m, Snapshot)}
        assert all(u.clusters["b"] in anchors_b for u in got), (got, anchors_b)

        last = testbed.last_entry("b", t)
        t0 = time.monotonic()
        assert admin_b.raw_entry(t, last.ledger, last.entry + 1000, past_end_ok=True) is None
        assert time.monotonic() - t0 < 5
    sub.close()
