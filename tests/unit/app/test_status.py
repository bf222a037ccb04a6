"""Read-only status and lookup queries over a delta-rs store built with the row helpers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cursorsync.app.lookup import lookup
from cursorsync.app.render import (
    format_table,
    lookup_json,
    render_lookup_table,
    render_status_table,
    status_json,
)
from cursorsync.app.status import (
    TablesNotFoundError,
    partition_key,
    subscription_status,
    subscription_summaries,
)
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import BuiltinUpdate, ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Runs, Segment, SegmentSet, TopicMapping
from cursorsync.errors import ConfigError
from cursorsync.tables import TableStore, open_store
from cursorsync.tables.rows import (
    builtin_update_rows,
    cursor_state_rows,
    mapping_rows,
    sync_progress_rows,
)

T0 = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
ORDERS = "persistent://public/default/orders"
PAYMENTS = "persistent://public/default/payments"
CLUSTERS = {"source_cluster": "A", "target_cluster": "B"}


def _plan(md: str, *, unmapped: int = 0, rewound: int = 0, outcome: str = "exact") -> AckPlan:
    return AckPlan(
        mark_delete=Position.parse(md), individually_deleted=RangeSet(), to_ack=RangeSet(),
        previous_mark_delete=Position(0, -1), unmapped_acked_entries=unmapped,
        rewound_entries=rewound, partial_batches_unacked=0, skippable_acked_entries=0,
        outcome=outcome,  # type: ignore[arg-type]
    )


def _sync(key: PartitionKey, sub: str, plan: AckPlan, at: datetime, lag_ms: int,
          *, dry_run: bool = False) -> SyncRecord:
    return SyncRecord(key, sub, plan, acks_sent=1, dry_run=dry_run,
                      source_observed_at=at - timedelta(milliseconds=lag_ms), emitted_at=at)


@pytest.fixture
def store(tmp_path: Path) -> TableStore:
    """orders (not partitioned; billing, audit) and payments (2 partitions; ledger)."""
    s = open_store("delta-rs", str(tmp_path / "tables"))
    orders = PartitionKey(ORDERS, -1)
    pay0, pay1 = PartitionKey(PAYMENTS, 0), PartitionKey(PAYMENTS, 1)
    kw = {**CLUSTERS, "written_at": T0}
    # Two batches of mapping rows for orders: they union (the second continues the first).
    s.append("mappings", mapping_rows(orders, TopicMapping(
        SegmentSet.of([Segment(10, 0, 50, 0, 100, "position-property"),
                       Segment(12, 0, 51, 0, 20, "identity")]),
        skippable=Runs.of((50, 100, 1)), unreplicated=Runs.of((11, 0, 3)),
    ), **kw), app_id="mapping", batch_id=0)
    s.append("mappings", mapping_rows(orders, TopicMapping(
        SegmentSet.of([Segment(12, 20, 51, 20, 30, "identity")])), **kw),
        app_id="mapping", batch_id=1)
    s.append("mappings", mapping_rows(pay0, TopicMapping(
        SegmentSet.of([Segment(7, 0, 9, 0, 40)])), **kw), app_id="mapping", batch_id=2)
    s.append("mappings", mapping_rows(pay1, TopicMapping(
        SegmentSet.of([Segment(8, 0, 9, 100, 5)])), **kw), app_id="mapping", batch_id=3)

    observed = [
        ObservedCursor(orders, "billing",
                       CursorState.parse("10:49", "[(10:50..10:60],(12:3..12:9]]"), T0),
        ObservedCursor(orders, "billing", CursorState.parse("12:9"), T0 + timedelta(seconds=5)),
        ObservedCursor(orders, "audit", CursorState.parse("10:5", "[(10:7..10:8]]"), T0),
        ObservedCursor(pay0, "ledger", CursorState.parse("7:30"), T0),
        ObservedCursor(pay1, "ledger", CursorState.parse("8:1"), T0),
    ]
    s.append("cursor_states", cursor_state_rows(observed[:3], **CLUSTERS),
             app_id="sync", batch_id=0)
    s.append("cursor_states", cursor_state_rows(observed[3:], **CLUSTERS),
             app_id="sync", batch_id=1)
    records = [
        _sync(orders, "billing", _plan("50:49", unmapped=4, outcome="partial"),
              T0 + timedelta(seconds=1), 900),
        _sync(orders, "billing", _plan("51:9"), T0 + timedelta(seconds=6), 400),
        _sync(orders, "audit", _plan("50:5"), T0 + timedelta(seconds=2), 1500, dry_run=True),
        _sync(pay0, "ledger", _plan("9:30", unmapped=2, rewound=1), T0 + timedelta(seconds=3),
              700),
    ]
    # Written out of time order on purpose: "latest" is by emitted_at, not by batch.
    s.append("sync_progress", sync_progress_rows(records[1:], **CLUSTERS),
             app_id="sync", batch_id=0)
    s.append("sync_progress", sync_progress_rows(records[:1], **CLUSTERS),
             app_id="sync", batch_id=1)
    return s


def test_status_joins_latest_progress_cursor_and_coverage(store: TableStore) -> None:
    rows = subscription_status(store)
    assert [(r.topic, r.partition, r.subscription) for r in rows] == [
        (ORDERS, -1, "audit"), (ORDERS, -1, "billing"),
        (PAYMENTS, 0, "ledger"), (PAYMENTS, 1, "ledger"),
    ]
    audit, billing, pay0, pay1 = rows
    # billing: the later cursor (12:9, no ranges) and the later sync (51:9), not batch order.
    assert billing.source_mark_delete == Position(12, 9) and billing.source_ranges == 0
    assert billing.observed_at == T0 + timedelta(seconds=5)
    assert billing.target_mark_delete == Position(51, 9)
    assert (billing.outcome, billing.unmapped_acked_entries, billing.lag_ms) == ("exact", 0, 400)
    assert billing.emitted_at == T0 + timedelta(seconds=6) and billing.dry_run is False
    # orders' two mapping batches unioned: 100 + 20 + 30 entries, two segments after joining.
    assert (billing.segments, billing.mapped_entries) == (2, 150)
    assert billing.last_mapped_source == Position(12, 49)
    assert audit.source_ranges == 1 and audit.dry_run is True
    assert (audit.source_cluster, audit.target_cluster) == ("A", "B")
    assert (pay0.unmapped_acked_entries, pay0.rewound_entries) == (2, 1)
    assert pay0.last_mapped_source == Position(7, 39)
    # payments-1: a cursor state but no sync yet.
    assert pay1.source_mark_delete == Position(8, 1)
    assert pay1.target_mark_delete is None and pay1.emitted_at is None and pay1.outcome is None
    assert (pay1.segments, pay1.mapped_entries) == (1, 5)


def test_status_filters_by_topic_partition_and_subscription(store: TableStore) -> None:
    assert {r.partition for r in subscription_status(store, topic=PAYMENTS)} == {0, 1}
    one = subscription_status(store, topic=f"{PAYMENTS}-partition-1")
    assert [(r.partition, r.segments) for r in one] == [(1, 1)]
    assert [r.subscription for r in subscription_status(store, subscription="audit")] == ["audit"]
    short = subscription_status(store, topic="orders", subscription="billing")
    assert [(r.topic, r.subscription) for r in short] == [(ORDERS, "billing")]
    assert subscription_status(store, source_cluster="C") == []


def test_summaries_aggregate_per_subscription(store: TableStore) -> None:
    by_sub = {s.subscription: s for s in subscription_summaries(subscription_status(store))}
    assert sorted(by_sub) == ["audit", "billing", "ledger"]
    ledger = by_sub["ledger"]
    assert (ledger.partitions, ledger.never_synced) == (2, 1)
    assert (ledger.unmapped_acked_entries, ledger.rewound_entries) == (2, 1)
    assert ledger.max_lag_ms == 700 and ledger.oldest_sync == T0 + timedelta(seconds=3)
    assert by_sub["audit"].dry_run and not by_sub["billing"].dry_run


def test_status_renders_as_aligned_table_and_json(store: TableStore) -> None:
    rows = subscription_status(store)
    text = render_status_table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["TOPIC", "SUBSCRIPTION", "SOURCE_MD"]
    # Every column starts at the same offset on every line of the first table.
    sub_col = lines[0].index("SUBSCRIPTION")
    assert all(line[sub_col - 2 : sub_col] == "  " for line in lines[1:5])
    assert f"{PAYMENTS}-partition-1" in text and "dry-run (exact planned)" in text
    assert "2026-03-04T05:06:13Z" in text  # billing's latest sync, to the second
    assert "SUBSCRIPTION" in lines[6] and "NEVER_SYNCED" in lines[6]

    data = json.loads(status_json(rows))
    assert [s["subscription"] for s in data["subscriptions"]] == ["audit", "billing", "ledger"]
    billing = data["partitions"][1]
    assert billing["target_mark_delete"] == "51:9" and billing["source_mark_delete"] == "12:9"
    assert billing["emitted_at"] == "2026-03-04T05:06:13Z"
    assert data["partitions"][3]["target_mark_delete"] is None
    assert render_status_table([]).startswith("no subscriptions recorded")


def test_a_dry_run_is_never_shown_as_an_outcome_of_a_sync(store: TableStore) -> None:
    """A partition the job only planned for says dry-run where a failover checks the
    outcome, with the plan's own outcome beside it; the others say what was done."""
    rows = subscription_status(store)
    dry = [r for r in rows if r.dry_run]
    assert dry and all(r.outcome == "dry-run" and r.planned_outcome == "exact" for r in dry)
    assert all(r.outcome == r.planned_outcome for r in rows if r.dry_run is False)
    data = json.loads(status_json(rows))
    assert {p["outcome"] for p in data["partitions"] if p["dry_run"]} == {"dry-run"}


def test_status_without_tables_names_the_path(tmp_path: Path) -> None:
    empty = open_store("delta-rs", str(tmp_path / "nowhere"))
    with pytest.raises(TablesNotFoundError, match="nowhere"):
        subscription_status(empty)
    with pytest.raises(TablesNotFoundError, match="no mappings table"):
        lookup(empty, ORDERS, Position(1, 1))


def test_lookup_exact(store: TableStore) -> None:
    r = lookup(store, ORDERS, Position(12, 25))
    assert r.outcome == "exact" and r.target == Position(51, 25)
    assert r.evidence == "identity"
    assert r.segment == Segment(12, 0, 51, 0, 50, "identity")
    assert lookup(store, ORDERS, Position(10, 0)).target == Position(50, 0)
    assert lookup(store, ORDERS, Position(10, 99)).target == Position(50, 99)
    p = lookup(store, f"{PAYMENTS}-partition-1", Position(8, 4))
    assert (p.partition, p.target) == (1, Position(9, 104))
    assert lookup(store, PAYMENTS, Position(7, 3), partition=0).target == Position(9, 3)


def test_lookup_unmapped_names_the_nearest_mapped_positions(store: TableStore) -> None:
    gap = lookup(store, ORDERS, Position(11, 7))
    assert gap.outcome == "unmapped" and gap.target is None
    assert (gap.mapped_before, gap.mapped_after) == (Position(10, 99), Position(12, 0))
    assert "between mapped source positions 10:99 and 12:0" in gap.reason
    never = lookup(store, ORDERS, Position(11, 1))
    assert "never replicated" in never.reason
    beyond = lookup(store, ORDERS, Position(12, 50))
    assert (beyond.mapped_before, beyond.mapped_after) == (Position(12, 49), None)
    assert "not mapped yet" in beyond.reason
    first = lookup(store, ORDERS, Position(9, 3))
    assert (first.mapped_before, first.mapped_after) == (None, Position(10, 0))


def test_lookup_names_every_copy_a_replicator_sent_again(tmp_path: Path) -> None:
    s = open_store("delta-rs", str(tmp_path / "copies"))
    key = PartitionKey(ORDERS, -1)
    s.append("mappings", mapping_rows(key, TopicMapping(SegmentSet.of([
        Segment(3, 0, 17, 0, 10), Segment(3, 1, 17, 10, 20)])), **CLUSTERS, written_at=T0),
        app_id="mapping", batch_id=0)
    r = lookup(s, ORDERS, Position(3, 4))
    assert r.outcome == "exact" and r.copies == (Position(17, 4), Position(17, 13))
    assert r.target == Position(17, 4) and r.segment == Segment(3, 0, 17, 0, 10)
    fields = dict(line.split(None, 1) for line in render_lookup_table(r).splitlines())
    assert fields["copies"].strip() == "17:4, 17:13"
    assert json.loads(lookup_json(r))["copies"] == ["17:4", "17:13"]
    beyond = lookup(s, ORDERS, Position(3, 21))
    assert (beyond.outcome, beyond.mapped_before, beyond.mapped_after) == (
        "unmapped", Position(3, 20), None)


def test_lookup_unknown_topic_hints_at_partitions(store: TableStore) -> None:
    r = lookup(store, PAYMENTS, Position(7, 1))
    assert r.outcome == "unknown-topic" and r.known_partitions == (0, 1)
    assert "partitioned" in r.reason and "-partition-N" in r.reason
    assert lookup(store, f"{ORDERS}-partition-0", Position(10, 1)).outcome == "unknown-topic"
    missing = lookup(store, "persistent://t/ns/nothing", Position(1, 1))
    assert missing.outcome == "unknown-topic" and missing.known_partitions == ()
    assert lookup(store, ORDERS, Position(10, 1), **{"source_cluster": "Z"}).outcome == (
        "unknown-topic")


def test_lookup_renders(store: TableStore) -> None:
    text = render_lookup_table(lookup(store, ORDERS, Position(12, 25)))
    fields = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
    assert fields["outcome"].strip() == "exact" and fields["target"].strip() == "51:25"
    assert fields["evidence"].strip() == "identity"
    data = json.loads(lookup_json(lookup(store, ORDERS, Position(11, 7))))
    assert data["outcome"] == "unmapped" and data["target"] is None
    assert (data["mapped_before"], data["mapped_after"]) == ("10:99", "12:0")
    assert data["partition_topic"] == ORDERS


def test_partition_key_parses_topic_names() -> None:
    assert partition_key(f"{PAYMENTS}-partition-3") == PartitionKey(PAYMENTS, 3)
    assert partition_key("payments") == PartitionKey(PAYMENTS, -1)
    assert partition_key("public/default/payments", 2) == PartitionKey(PAYMENTS, 2)
    with pytest.raises(ConfigError, match="names partition 3 but partition 1"):
        partition_key(f"{PAYMENTS}-partition-3", 1)
    with pytest.raises(ConfigError, match="persistent"):
        partition_key("non-persistent://public/default/x")


def test_format_table_aligns_columns() -> None:
    out = format_table(("A", "NUMBER"), [("xy", 1), ("z", 12345), ("w", None)], right=(1,))
    assert out.splitlines() == ["A   NUMBER", "xy       1", "z    12345", "w        -"]


def test_status_shows_the_builtin_position_beside_cursorsyncs(store: TableStore) -> None:
    """The newest UPDATE marker (by its position on the target) per subscription is where
    Pulsar's own replicated subscription moved it; subscriptions it never named show none."""
    orders = PartitionKey(ORDERS, -1)
    updates = [BuiltinUpdate(orders, "billing", Position(51, 2), Position(51, 5)),
               BuiltinUpdate(orders, "billing", Position(51, 7), Position(51, 9)),
               BuiltinUpdate(orders, "billing", Position(50, 90), Position(50, 95)),
               BuiltinUpdate(orders, "other", Position(51, 8), Position(51, 10))]
    store.append("builtin_updates", builtin_update_rows(updates, **CLUSTERS, written_at=T0),
                 app_id="mapping", batch_id=0)
    rows = {r.subscription: r for r in subscription_status(store, topic=ORDERS)}
    assert rows["billing"].builtin_mark_delete == Position(51, 7)
    assert rows["audit"].builtin_mark_delete is None
    assert "other" not in rows
    assert "BUILTIN_MD" in render_status_table(list(rows.values()))
    assert json.loads(status_json([rows["billing"]]))["partitions"][0][
        "builtin_mark_delete"] == "51:7"


def test_readiness_names_every_reason_a_partition_is_not_ready() -> None:
    """The failover gate per partition: ready only when its last sync was an exact one
    (no dry run), nothing acked on the source waits unmapped, and it is recent."""
    from cursorsync.app.readiness import readiness
    from cursorsync.app.status import StatusRow

    now = T0 + timedelta(minutes=10)

    def row(sub: str, **kw: object) -> StatusRow:
        base: dict[str, object] = {"outcome": "exact", "planned_outcome": "exact",
                                   "unmapped_acked_entries": 0, "dry_run": False,
                                   "emitted_at": now - timedelta(seconds=30)}
        return StatusRow(topic=ORDERS, partition=0, subscription=sub, source_cluster="A",
                         target_cluster="B", **{**base, **kw})  # type: ignore[arg-type]

    gate = readiness([
        row("ok"),
        row("never", outcome=None, emitted_at=None),
        row("dry", outcome="dry-run", dry_run=True),
        row("partial", outcome="partial", unmapped_acked_entries=12),
        row("halted", outcome="halted"),
        row("stale", emitted_at=now - timedelta(seconds=301)),
    ], now, max_age_s=300)
    reasons = {p.row.subscription: p.reasons for p in gate.partitions}
    assert reasons == {
        "ok": (),
        "never": ("never synced",),
        "dry": ("dry run: nothing acked on the target",),
        "partial": ("last sync partial", "12 source-acked entries unmapped"),
        "halted": ("last sync halted",),
        "stale": ("last synced 301 s ago (more than 300 s)",),
    }
    assert not gate.ready
    assert gate.not_ready() == {"ok": 0, "never": 1, "dry": 1, "partial": 1, "halted": 1,
                                "stale": 1}
    assert readiness([row("ok")], now, max_age_s=300).ready
    assert not readiness([], now, max_age_s=300).ready


def test_failing_source_polls_are_shown_and_hold_the_failover_gate(store: TableStore) -> None:
    """The source's cursor polls failing (their health file beside the stored polls) is a
    warning under the status tables, a field of its JSON, and a blocker of ``--ready``."""
    from cursorsync.app.readiness import readiness
    from cursorsync.app.render import render_polls, render_readiness
    from cursorsync.sync.poll_health import PollHealth

    rows = subscription_status(store)
    polls = PollHealth(ok_at=T0).failed(T0 + timedelta(seconds=9), "cluster A: timed out")
    polls = polls.failed(T0 + timedelta(seconds=19), "cluster A: timed out again")
    assert render_polls(PollHealth(ok_at=T0)) is None and render_polls(None) is None
    warning = render_polls(polls)
    assert warning is not None and "2026-03-04T05:06:16+00:00 (2 in a row)" in warning
    assert warning.endswith("timed out again")
    data = json.loads(status_json(rows, polls))
    assert data["source_polls"]["failures"] == 2
    assert json.loads(status_json(rows))["source_polls"] is None
    ok_rows = [r for r in rows if r.emitted_at is not None and r.outcome == "exact"
               and not r.unmapped_acked_entries and not r.dry_run]
    now = max(r.emitted_at for r in ok_rows if r.emitted_at)
    assert readiness(ok_rows, now, 3600).ready
    assert readiness(ok_rows, now, 3600, PollHealth(ok_at=T0)).ready
    gate = readiness(ok_rows, now, 3600, polls)
    assert not gate.ready and gate.blockers and gate.to_dict()["blockers"] == list(gate.blockers)
    assert render_readiness(gate).startswith("NOT READY: the source's cursor polls fail since")
