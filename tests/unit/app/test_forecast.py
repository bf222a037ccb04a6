"""The redelivery forecast: its figures from cursor states, mappings and entry facts, how
they add up, render, and what ``status --forecast`` says without broker access."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import cursorsync.app.cli as cli
import cursorsync.app.forecast as forecast_module
from cursorsync.app.forecast import (
    NOTHING,
    EntryFacts,
    Figure,
    PartitionForecast,
    Sources,
    by_subscription,
    partition_forecast,
    questions,
)
from cursorsync.app.forecast_read import forecast
from cursorsync.app.render import forecast_cell, forecast_json, render_forecast
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH
from cursorsync.app.status import StatusRow, subscription_status
from cursorsync.core.batches import PartialBatch
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.tables import TableStore, open_store
from cursorsync.tables.rows import cursor_state_rows, mapping_rows, sync_progress_rows
from tests.support.admin_stub import Reply, StubAdmin

T0 = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
ORDERS = "persistent://public/default/orders"
LEDGERS = Ledgers.of([(1, 20)])
P = Position.parse


def _row(**kw: Any) -> StatusRow:
    base: dict[str, Any] = dict(topic=ORDERS, partition=-1, subscription="billing",
                                source_cluster="a", target_cluster="b", outcome="partial",
                                unmapped_acked_entries=5, emitted_at=T0, dry_run=False)
    return StatusRow(**{**base, **kw})


def _world() -> tuple[Sources, dict[Position, EntryFacts]]:
    """Source ledger 1 of 20 entries; 1:0..1:4 mapped. At the last sync 1:0..1:9 were
    acked (1:5..1:9 unmapped); now 1:0..1:12 and 1:15, the last entry 1:19."""
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 5, 0, 5)]))
    src = Sources(last=CursorState(P("1:9"), RangeSet(), LEDGERS), mapping=mapping,
                  now=CursorState(P("1:12"), RangeSet.parse("[(1:14..1:15]]"), LEDGERS),
                  last_entry=P("1:19"))
    facts = {
        # acked at the last sync, unmapped: a marker, a two-chunk message, a batch of 3, one
        P("1:5"): EntryFacts(marker=True), P("1:6"): EntryFacts(chunk=(0, 2)),
        P("1:7"): EntryFacts(chunk=(1, 2)), P("1:8"): EntryFacts(messages=3),
        P("1:9"): EntryFacts(),
        # acked since: a batch of 2, a marker, one message, one message
        P("1:10"): EntryFacts(messages=2), P("1:11"): EntryFacts(marker=True),
        P("1:12"): EntryFacts(), P("1:15"): EntryFacts(),
        # unacked now: batches of 5 and 2, single messages, a marker, a chunk
        P("1:13"): EntryFacts(messages=5), P("1:14"): EntryFacts(), P("1:16"): EntryFacts(),
        P("1:17"): EntryFacts(marker=True), P("1:18"): EntryFacts(chunk=(0, 3)),
        P("1:19"): EntryFacts(messages=2),
    }
    return src, facts


def test_each_cause_is_counted_from_the_entries_read() -> None:
    src, facts = _world()
    q = questions(src)
    assert q.count(q.unmapped) == 5 and q.count(q.since) == 4 and q.count(q.unacked) == 6
    f = partition_forecast(_row(), src, q, facts)
    assert f.source_read
    c = f.causes
    assert c["acked_unmapped"] == Figure(2, 4, "exact")  # 1:8 (3) and 1:9 (1)
    assert c["chunks"] == Figure(2, 1, "exact")  # one message in two chunk entries
    assert c["acked_since_sync"] == Figure(3, 4, "exact")  # 1:10 (2), 1:12, 1:15
    partial = c["partial_batches"]
    assert (partial.entries, partial.messages, partial.basis) == (2, 4 + 1, "bound")
    assert "batch-index" in partial.why and "on the source too" in partial.why
    total = f.total
    assert (total.messages, total.basis) == (4 + 1 + 4 + 5, "bound")


@pytest.mark.parametrize(("index_acks", "says"), [
    (False, "comes again on the source too (its brokers keep no batch-index acks)"),
    (True, "would not come again on the source: its brokers keep batch-index acks"),
    (None, "unless its brokers keep batch-index acks"),
])
def test_partial_batches_say_what_a_restart_on_the_source_would_deliver(
        index_acks: bool | None, says: str) -> None:
    """The same bound either way (the acked indexes are not readable); whether they are a
    gap of cursorsync's or come again on the source as well depends on the source's
    brokers keeping batch-index acks."""
    src, facts = _world()
    partial = partition_forecast(_row(), src, questions(src), facts,
                                 index_acks=index_acks).causes["partial_batches"]
    assert (partial.messages, partial.basis) == (4 + 1, "bound")
    assert says in partial.why


def _batches_world(**kw: Any) -> Sources:
    """1:0..1:19 mapped to 5:0..5:19; unacked now from 1:13 on. The source's plugin says
    1:13 (5 messages) has indexes 0 and 2 acked, 1:19 (2) index 1; the target's says 5:13
    has index 0 acked, and the target acks 5:19 whole."""
    src, _ = _world()
    mapping = TopicMapping(SegmentSet.of([Segment(1, 0, 5, 0, 20)]))
    batches = (PartialBatch(P("1:13"), 5, frozenset({0, 2})),
               PartialBatch(P("1:19"), 2, frozenset({1})))
    base = replace(src, mapping=mapping, source_batches=batches,
                   target_batches={P("5:13"): PartialBatch(P("5:13"), 5, frozenset({0}))},
                   target_acked=RangeSet.parse("[(5:18..5:19]]"))
    return replace(base, **kw)


def test_partial_batches_read_on_both_clusters_are_exact() -> None:
    """With the source's brokers keeping batch indexes and the plugin read on both
    clusters: each index acked on the source whose target copy is not acked, whole or at
    that index, comes again; nothing else does."""
    src, facts = _batches_world(), _world()[1]
    partial = partition_forecast(_row(), src, questions(src), facts,
                                 index_acks=True).causes["partial_batches"]
    assert partial == Figure(1, 1, "exact")  # 1:13's index 2


def test_partial_batches_without_the_target_s_indexes_are_a_bound_of_the_source_s() -> None:
    src, facts = _batches_world(target_batches=None, target_acked=None), _world()[1]
    partial = partition_forecast(_row(), src, questions(src), facts,
                                 index_acks=True).causes["partial_batches"]
    assert (partial.entries, partial.messages, partial.basis) == (2, 3, "bound")
    assert "target's batch indexes not read" in partial.why


def test_an_unmapped_partial_batch_comes_again_whole_and_no_batches_is_nothing() -> None:
    src, facts = _batches_world(mapping=_world()[0].mapping), _world()[1]
    partial = partition_forecast(_row(), src, questions(src), facts,
                                 index_acks=True).causes["partial_batches"]
    assert partial == Figure(2, 3, "exact")


def test_unacked_batches_the_brokers_list_no_indexes_of_are_a_bound() -> None:
    """A consumer acking without batch-index acks (the clients' default) leaves the broker
    no record of a batch's acked messages: an unacked batch the plugin does not list may
    hold acked messages all the same, at most every one but one."""
    facts = _world()[1]
    none = _batches_world(source_batches=())
    partial = partition_forecast(_row(), none, questions(none), facts,
                                 index_acks=True).causes["partial_batches"]
    assert (partial.entries, partial.messages, partial.basis) == (2, 4 + 1, "bound")
    assert "without batch-index acks" in partial.why
    one = _batches_world(source_batches=(PartialBatch(P("1:13"), 5, frozenset({0, 2})),))
    partial = partition_forecast(_row(), one, questions(one), facts,
                                 index_acks=True).causes["partial_batches"]
    # 1:13's index 2, read; 1:19 (two messages), not listed: at most one.
    assert (partial.entries, partial.messages, partial.basis) == (2, 1 + 1, "bound")


def test_batches_read_are_not_used_where_the_brokers_keep_no_batch_indexes() -> None:
    src, facts = _batches_world(), _world()[1]
    for index_acks in (False, None):
        partial = partition_forecast(_row(), src, questions(src), facts,
                                     index_acks=index_acks).causes["partial_batches"]
        assert (partial.messages, partial.basis) == (4 + 1, "bound")


def test_the_brokers_batch_index_setting_is_read_and_unknown_without_rights(
        admin: StubAdmin) -> None:
    from cursorsync.app.forecast_read import batch_index_acks
    from cursorsync.pulsar.admin import AdminClient, AdminSettings

    path = "/admin/v2/brokers/configuration/runtime"
    admin.set(path, Reply(body={"acknowledgmentAtBatchIndexLevelEnabled": "true"}),
              Reply(body={"acknowledgmentAtBatchIndexLevelEnabled": "false"}),
              Reply(403, {"reason": "Only super-user can access this resource"}))
    with AdminClient(AdminSettings.from_urls(admin.url, attempts=1)) as client:
        assert [batch_index_acks(client) for _ in range(3)] == [True, False, None]


def test_a_chunked_message_acked_in_part_is_a_bound_of_one_per_chunk_entry() -> None:
    src, facts = _world()
    facts[P("1:7")] = EntryFacts(chunk=(1, 3))  # its last chunk is not among the acked
    f = partition_forecast(_row(), src, questions(src), facts)
    chunks = f.causes["chunks"]
    assert (chunks.entries, chunks.messages, chunks.basis) == (2, 2, "bound")


def test_without_the_source_the_live_causes_are_unknown_and_say_why() -> None:
    src, _ = _world()
    src = replace(src, now=None, last_entry=None, not_read="source not read: refused")
    f = partition_forecast(_row(), src, questions(src), {})
    c = f.causes
    assert not f.source_read
    assert c["acked_since_sync"].basis == "unknown"
    assert c["acked_since_sync"].why == (
        "acks since the last observation: unknown (source not read: refused)")
    # The unmapped entries are known from the tables; their messages are not.
    assert (c["acked_unmapped"].entries, c["acked_unmapped"].messages) == (5, None)
    assert c["acked_unmapped"].basis == "unknown"
    assert "source not read: refused" in c["acked_unmapped"].why
    assert c["partial_batches"].basis == c["chunks"].basis == "unknown"
    assert f.total.basis == "unknown" and f.total.messages is None


def test_entries_not_read_make_a_figure_unknown_with_what_was_read_as_its_floor() -> None:
    src, facts = _world()
    del facts[P("1:9")]
    f = partition_forecast(_row(), src, questions(src), facts)
    unmapped = f.causes["acked_unmapped"]
    assert (unmapped.basis, unmapped.entries, unmapped.at_least) == ("unknown", 5, 3)
    assert forecast_cell(unmapped) == ">=3"


def test_many_partitions_unread_say_why_once_and_add_their_entries() -> None:
    # At a thousand partitions the read budget runs out in most of them: the subscription's
    # figure says the reason once, not once per partition, and counts every entry.
    src, facts = _world()
    del facts[P("1:9")]
    parts = [partition_forecast(_row(partition=i), src, questions(src), facts)
             for i in range(50)]
    [sub] = by_subscription(parts)
    unmapped = sub.causes["acked_unmapped"]
    assert (unmapped.basis, unmapped.entries, unmapped.at_least) == ("unknown", 250, 150)
    assert unmapped.why == ("not every entry read (at most 4096 a forecast; or a read "
                            "failed: see the log)")
    assert sub.causes["chunks"].why.count("not every entry read") == 1


def test_a_question_larger_than_the_lookup_budget_is_not_listed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    src, facts = _world()
    monkeypatch.setattr(forecast_module, "FORECAST_LOOKUPS", 5)
    q = questions(src)
    assert q.listed(q.unacked) is None and q.listed(q.unmapped) is not None
    f = partition_forecast(_row(), src, q, facts)
    assert f.causes["partial_batches"].basis == "unknown"
    assert "at most 5 a forecast" in f.causes["partial_batches"].why
    assert f.causes["acked_unmapped"].basis == "exact"


@pytest.mark.parametrize(("row", "why"), [
    (_row(dry_run=True), "dry-run"),
    (_row(emitted_at=None), "never synced"),
    (_row(outcome="failed"), "not sent (failed)"),
])
def test_a_last_sync_that_says_nothing_of_the_target_leaves_it_unknown(
        row: StatusRow, why: str) -> None:
    src, facts = _world()
    f = partition_forecast(row, src, questions(src), facts)
    assert f.causes["acked_unmapped"].basis == "unknown"
    assert why in f.causes["acked_unmapped"].why
    assert f.causes["chunks"].basis == "unknown"


def test_a_partition_without_segments_is_unknown_not_nothing() -> None:
    """Snapshot anchors alone map no entry: what they did not carry is not counted."""
    src, facts = _world()
    src = replace(src, mapping=TopicMapping(SegmentSet.of([])))
    f = partition_forecast(_row(unmapped_acked_entries=0), src, questions(src), facts)
    assert f.causes["acked_unmapped"].basis == "unknown"
    assert "snapshot anchors" in f.causes["acked_unmapped"].why
    assert f.causes["acked_since_sync"] == Figure(3, 4, "exact")


def test_figures_add_up_to_the_worst_basis() -> None:
    exact, bound = Figure(2, 4, "exact"), Figure(1, 3, "bound", "b")
    assert exact + NOTHING == exact
    assert exact + bound == Figure(3, 7, "bound", "b")
    unknown = Figure(None, None, "unknown", "u", at_least=2)
    assert exact + unknown == Figure(None, None, "unknown", "u", at_least=6)
    assert exact.covers(4) and not exact.covers(3)
    assert bound.covers(3) and bound.covers(0) and not bound.covers(4)
    assert unknown.covers(2) and not unknown.covers(1)


def test_subscriptions_add_their_partitions_and_render() -> None:
    src, facts = _world()
    q = questions(src)
    one = partition_forecast(_row(), src, q, facts)
    unread = replace(src, now=None, last_entry=None)
    two = partition_forecast(_row(partition=1), unread, questions(unread), {})
    lone = PartitionForecast(_row(subscription="audit"),
                             {c: NOTHING for c in one.causes}, True)
    subs = by_subscription([one, two, lone])
    assert [(s.subscription, s.partitions) for s in subs] == [("audit", 1), ("billing", 2)]
    assert subs[0].total == NOTHING
    billing = subs[1].causes
    assert billing["chunks"].basis == billing["acked_since_sync"].basis == "unknown"
    unmapped = billing["acked_unmapped"]
    assert (unmapped.entries, unmapped.basis, unmapped.at_least) == (2 + 5, "unknown", 4)
    text = render_forecast([one, two, lone])
    lines = text.splitlines()
    assert lines[2].split() == ["TOPIC", "SUBSCRIPTION", "ACKED_UNMAPPED", "ACKED_SINCE_SYNC",
                                "PARTIAL_BATCHES", "CHUNKS", "TOTAL"]
    assert lines[3].split() == [ORDERS, "billing", "4", "4", "<=5", "1", "<=14"]
    assert "why:" in lines and any("partial_batches: the broker" in x for x in lines)
    data = json.loads(forecast_json([one, two, lone]))
    assert data["partitions"][0]["causes"]["partial_batches"] == {
        "entries": 2, "messages": 5, "basis": "bound", "at_least": None,
        "why": one.causes["partial_batches"].why}
    assert data["subscriptions"][1]["total"]["basis"] == "unknown"
    assert render_forecast([]).startswith("no subscriptions recorded")


# ------------------------------------------------------------------ from the tables


@pytest.fixture
def store(tmp_path: Path) -> TableStore:
    """orders: source 1:0..1:9 mapped to 5:0..5:9, acked to 1:14 at the last sync (1:10..1:14
    unmapped); a later cursor row than an earlier one."""
    s = open_store("delta-rs", str(tmp_path / "tables"))
    key = PartitionKey(ORDERS, -1)
    clusters = {"source_cluster": "a", "target_cluster": "b"}
    s.append("mappings", mapping_rows(key, TopicMapping(SegmentSet.of(
        [Segment(1, 0, 5, 0, 10)])), source_cluster="a", target_cluster="b", written_at=T0),
        app_id="m", batch_id=0)
    s.append("cursor_states", cursor_state_rows([
        ObservedCursor(key, "billing", CursorState(P("1:3"), RangeSet(), LEDGERS), T0),
        ObservedCursor(key, "billing", CursorState(P("1:14"), RangeSet(), LEDGERS),
                       T0.replace(second=9)),
    ], **clusters), app_id="s", batch_id=0)
    plan = AckPlan(P("5:9"), RangeSet(), RangeSet.parse("[(5:-1..5:9]]"), P("5:-1"), 5, 0, 0,
                   0, "partial")  # type: ignore[arg-type]
    s.append("sync_progress", sync_progress_rows(
        [SyncRecord(key, "billing", plan, 1, False, T0, T0)], **clusters),
        app_id="s", batch_id=0)
    return s


def test_from_the_tables_alone_the_unmapped_entries_are_counted(store: TableStore) -> None:
    rows = subscription_status(store)
    [f] = forecast(store, rows)
    assert not f.source_read
    unmapped = f.causes["acked_unmapped"]
    assert (unmapped.entries, unmapped.basis, unmapped.why) == (
        5, "unknown", "messages per entry not read (no broker access)")
    assert f.causes["acked_since_sync"].why.startswith("acks since the last observation")


@pytest.mark.parametrize(("planned_from_second", "unmapped", "outcome"), [
    (9, 0, "exact"), (8, 0, "exact"), (9, 5, "partial"),
    (9, 0, "unknown"),  # no segment: the sync counted nothing, it found none unmapped
])
def test_a_last_sync_that_left_nothing_unmapped_needs_no_reads(
        store: TableStore, planned_from_second: int, unmapped: int, outcome: str) -> None:
    # The sync explains acked entries the tables' mapping does not (markers it looked up on
    # the source): when it counted none unmapped, planning from the newest source state
    # recorded (observed at second 9) or one known current since, nothing is to be read.
    key = PartitionKey(ORDERS, -1)
    plan = AckPlan(P("5:9"), RangeSet(), RangeSet(), P("5:9"), unmapped, 0, 0, 0,
                   outcome)  # type: ignore[arg-type]
    store.append("sync_progress", sync_progress_rows(
        [SyncRecord(key, "billing", plan, 0, False, T0.replace(second=planned_from_second),
                    T0.replace(second=10))], source_cluster="a", target_cluster="b"),
        app_id="s", batch_id=1)
    [row] = subscription_status(store)
    src = Sources(last=CursorState(P("1:14"), RangeSet(), LEDGERS),
                  mapping=TopicMapping(SegmentSet.of([Segment(1, 0, 5, 0, 10)])))
    q = questions(src, row)
    [f] = forecast(store, [row])
    # Without the state's ledger list the sync's count was a floor: it settles nothing.
    unlisted = replace(src, last=CursorState(P("1:14"), RangeSet(), None))
    assert questions(unlisted, row).unmapped != RangeSet()
    if (planned_from_second, outcome) == (9, "exact"):
        assert q.unmapped == RangeSet() and q.count(q.unmapped) == 0
        assert f.causes["acked_unmapped"] == Figure(0, 0, "exact")
    else:  # an older state, entries left unmapped, or none counted: from the tables
        assert q.count(q.unmapped) == 5
        assert (f.causes["acked_unmapped"].entries,
                f.causes["acked_unmapped"].basis) == (5, "unknown")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_status_forecast_without_broker_access_says_what_is_unknown(
        store: TableStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())
    url = f"http://127.0.0.1:{_closed_port()}"
    for side in ("source", "target"):
        data["clusters"][side].update(admin_url=url, service_url="pulsar://127.0.0.1:1",
                                      request_timeout_s=1)
    data["topics"] = [{"topic": ORDERS, "subscriptions": ["billing"]}]
    data["tables"]["path"] = str(tmp_path / "tables")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    runner = CliRunner()
    out = runner.invoke(cli.app, ["status", "-c", str(path), "--forecast", "--json"])
    assert out.exit_code == 0, out.output
    part = json.loads(out.stdout)["partitions"][0]
    assert part["source_read"] is False
    since = part["causes"]["acked_since_sync"]
    assert since["basis"] == "unknown" and "unreachable" in since["why"]
    assert part["causes"]["acked_unmapped"]["entries"] == 5
    text = runner.invoke(cli.app, ["status", "-c", str(path), "--forecast"])
    assert text.exit_code == 0 and "ACKED_SINCE_SYNC" in text.stdout
    both = runner.invoke(cli.app, ["status", "-c", str(path), "--forecast", "--ready"])
    assert both.exit_code == 2 and "not both" in both.stderr
