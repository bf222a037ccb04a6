"""The pulsar-cursors source against the admin stub: polls, stored state, replay, pruning,
the poll interval and the options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cursorsync.errors import ConfigError
from cursorsync.sync.cursors import CursorsOptions, PulsarCursorsStreamReader
from cursorsync.sync.stored_polls import ReplayStateError
from tests.support.admin_stub import StubAdmin
from tests.support.entries import serve_partitioned

# -- pulsar-cursors ---------------------------------------------------------------------


def cursors_reader(admin: StubAdmin, state: Path, **extra: str) -> PulsarCursorsStreamReader:
    opts = {"adminUrl": admin.url, "cluster": "a", "topics": "persistent://acme/orders/events",
            "subscriptions": "svc", "stateDir": str(state), "adminAttempts": "1",
            # The stub serves internalStats only; the topic stats pre-check is tested on
            # the real test bed (test_cursor_polls).
            "internalStatsMaxAgeMs": "0", **extra}
    return PulsarCursorsStreamReader(CursorsOptions.parse(opts))


def test_cursors_poll_store_and_replay(admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path)
    start = r.initialOffset()
    assert start == {"version": 1, "seq": 0}
    it, end = r.read(start)
    rows = list(it)
    assert end == {"version": 1, "seq": 1}
    events = "persistent://acme/orders/events"
    assert [(x[1], x[2], x[3]) for x in rows] == [(events, 0, "svc"), (events, 1, "svc")]
    row = rows[0]
    assert row[4] == "1:4" and row[5] == "[(3:2..3:5],(3:6..3:7]]"
    assert row[6] == [(1, 5), (3, 10)]  # the open ledger's count from lastConfirmedEntry
    assert row[8] == 40 and row[7].tzinfo is not None
    assert row[9] == row[7]  # read in this poll: checked when read
    # The cluster moves on; a replay of (0, 1] still returns what was polled then.
    serve_partitioned(admin, "3:9")
    assert list(r.readBetweenOffsets(start, end)) == rows
    fresh = cursors_reader(admin, tmp_path)  # a restarted driver
    assert list(fresh.readBetweenOffsets(start, end)) == rows
    it2, end2 = fresh.read(end)
    assert [x[4] for x in it2] == ["3:9", "3:9"] and end2["seq"] == 2
    assert len(list(fresh.readBetweenOffsets(start, end2))) == 4
    fresh.commit(end2)  # retention 100 keeps both
    assert len(list(fresh.readBetweenOffsets(start, end2))) == 4
    # A poll stored before rows had a checked_at replays as checked when read.
    stored = json.loads(fresh.store.path(1).read_text())
    for r in stored["rows"]:
        del r["checked_at_us"]
    fresh.store.path(1).write_text(json.dumps(stored))
    assert list(fresh.readBetweenOffsets(start, end)) == rows


def test_cursors_missing_state_and_pruning(admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path, stateRetention="1", subscriptions="*")
    off = r.initialOffset()
    for _ in range(3):
        it, off = r.read(off)
        assert {x[3] for x in it} == {"svc", "other"}  # never the replicator cursor
    r.commit(off)
    with pytest.raises(ReplayStateError, match="poll-0000"):
        list(r.readBetweenOffsets({"version": 1, "seq": 0}, off))
    assert len(list(r.readBetweenOffsets({"version": 1, "seq": 2}, off))) == 4


def test_polls_share_one_admin_connection(admin: StubAdmin, tmp_path: Path) -> None:
    """Every poll asks on the same kept-alive connection: a client per poll would cost a
    TLS context and a connection each time."""
    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path)
    off = r.initialOffset()
    for _ in range(3):
        it, off = r.read(off)
        assert len(list(it)) == 2
    assert len(admin.requests) >= 6 and len(set(admin.client_ports)) == 1


def test_cursors_poll_interval_and_options(admin: StubAdmin, tmp_path: Path) -> None:
    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path, pollIntervalMs="60000")
    _, off = r.read(r.initialOffset())
    it, same = r.read(off)
    assert same == off and list(it) == []
    with pytest.raises(ConfigError, match="stateDir"):
        CursorsOptions.parse({"adminUrl": admin.url, "cluster": "a", "topics": "x",
                              "subscriptions": "s"})
    with pytest.raises(ConfigError, match="subscriptions"):
        CursorsOptions.parse({"adminUrl": admin.url, "cluster": "a", "topics": "x",
                              "stateDir": str(tmp_path)})


def test_failed_polls_are_kept_beside_the_stored_polls_until_one_succeeds(
        admin: StubAdmin, tmp_path: Path) -> None:
    """A poll the admin API fails gives no batch: the polls' health file says since when
    and why, for ``status``; a restarted reader counts on from it; a success clears it."""
    from cursorsync.sync import poll_health
    from tests.support.admin_stub import Reply

    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path)
    off = r.initialOffset()
    _, off = r.read(off)
    ok = poll_health.read(tmp_path)
    assert ok is not None and ok.ok_at is not None and not ok.failing
    served = {path: list(replies) for path, replies in admin.routes.items()}
    for path in served:
        admin.set(path, Reply(503, {"reason": "broker busy"}))
    it, same = r.read(off)
    assert list(it) == [] and same == off
    fresh = cursors_reader(admin, tmp_path)  # a restarted driver
    fresh.read(off)
    failing = poll_health.read(tmp_path)
    assert failing is not None and failing.failing and failing.failures == 2
    assert failing.ok_at == ok.ok_at and failing.failing_since is not None
    assert failing.error is not None
    assert "HTTP 503" in failing.error and "broker busy" in failing.error
    for path, replies in served.items():
        admin.set(path, *replies)
    _, after = fresh.read(off)
    assert after["seq"] == off["seq"] + 1
    healed = poll_health.read(tmp_path)
    assert healed is not None and not healed.failing and healed.failures == 0
    assert healed.ok_at is not None and ok.ok_at is not None and healed.ok_at > ok.ok_at


def test_a_request_brings_a_poll_forward_once_and_no_sooner_than_half_an_interval(
        admin: StubAdmin, tmp_path: Path) -> None:
    """The sync follows the mapping (cursorsync.sync.follow): a poll comes every interval,
    or sooner when the wake file's number grows, but never within half an interval of the
    last poll, and each request brings one poll."""
    from cursorsync import wake
    from cursorsync.sync.follow import FollowMapping

    serve_partitioned(admin, "1:4")
    path = tmp_path / "sync-wake"
    waiting = False
    follow = FollowMapping(path, lambda: waiting)
    r = cursors_reader(admin, tmp_path / "polls", pollIntervalMs="10000", wakeFile=str(path))
    now = 100.0
    r.clock = lambda: now
    _, off = r.read(r.initialOffset())
    assert off["seq"] == 1
    follow.mapping_committed()  # the sync does not wait: no request
    assert wake.requested(path) == 0
    waiting = True
    follow.mapping_committed()
    assert wake.requested(path) == 1
    now = 104.0  # asked, but within half an interval of the last poll
    it, same = r.read(off)
    assert same == off and list(it) == []
    now = 105.0
    it, off = r.read(off)
    assert off["seq"] == 2 and len(list(it)) == 2
    now = 111.0  # the same request brings no second poll
    assert r.read(off)[1] == off
    now = 114.0  # the interval, within its slack
    _, off = r.read(off)
    assert off["seq"] == 3
    # Requests only grow, across a restart of either side.
    assert FollowMapping(path, lambda: True).number == 1
    again = cursors_reader(admin, tmp_path / "polls", pollIntervalMs="10000",
                           wakeFile=str(path))
    again.clock = lambda: now
    _, off2 = again.read(off)  # a fresh reader polls at once
    assert off2["seq"] == 4
    now = 120.0
    assert again.read(off2)[1] == off2  # the old request is not taken again


def test_a_failed_poll_is_tried_again_after_the_interval(admin: StubAdmin,
                                                         tmp_path: Path) -> None:
    """The query's trigger ticks several times per interval: a poll that fails is not
    repeated at every tick."""
    from tests.support.admin_stub import Reply

    serve_partitioned(admin, "1:4")
    r = cursors_reader(admin, tmp_path, pollIntervalMs="10000")
    now = 0.0
    r.clock = lambda: now
    off = r.initialOffset()
    served = {path: list(replies) for path, replies in admin.routes.items()}
    for path in served:
        admin.set(path, Reply(503, {"reason": "broker busy"}))
    now = 50.0
    assert r.read(off)[1] == off
    asked = len(admin.requests)
    now = 55.0
    assert r.read(off)[1] == off and len(admin.requests) == asked
    for path, replies in served.items():
        admin.routes[path] = replies
    now = 60.0
    assert r.read(off)[1]["seq"] == 1
