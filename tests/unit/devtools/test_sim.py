"""The two-cluster simulator: determinism, faithfulness to the Pulsar model, failover counts."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cursorsync.core.cursor import CursorState, fold
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import holes
from cursorsync_devtools.sim import (
    KIND_DATA,
    KIND_FOREIGN,
    KIND_MARKER,
    SNAPSHOT,
    SNAPSHOT_REQUEST,
    SNAPSHOT_RESPONSE,
    UPDATE,
    PartitionState,
    Workload,
    run_failover,
    simulate,
)
from cursorsync_devtools.sim._failover import count_failover

T = TypeVar("T")

# Small, fast histories; the default workload is exercised once for its timing budget.
SMALL = dict(messages=3000, hole_lifetime_ms=4000, backlog_bursts=((2000, 3000),),
             ledger_entries_a=(40, 120), ledger_entries_b=(30, 100))


def small(**kw: object) -> Workload:
    return Workload(**{**SMALL, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sim_small():  # type: ignore[no-untyped-def]
    return simulate(small(seed=3, partitions=2, foreign_rate_per_s=5.0, unreplicated_rate=0.05))


def entry_truth_cursor(part: PartitionState, at_ms: int) -> tuple[Position, set[Position]]:
    """The cursor from first principles: markDelete before the first unacked entry, the rest."""
    n = part.source.written_by(at_ms)
    acked = part.source_acked_entries(at_ms)[:n]
    unacked = np.flatnonzero(~acked)
    first = int(unacked[0]) if len(unacked) else n
    md = part.source.fresh_position() if first == 0 else part.source.position(first - 1)
    rest = {part.source.position(i) for i in range(first, n) if acked[i]}
    return md, rest


# ------------------------------------------------------------------ determinism


def test_same_seed_same_report_and_different_seed_differs() -> None:
    a = run_failover(small(seed=11)).to_dict()
    b = run_failover(small(seed=11)).to_dict()
    c = run_failover(small(seed=12)).to_dict()
    assert a == b
    assert a != c
    json.dumps(a)  # JSON-ready


def test_default_workload_is_fast_and_shows_the_point() -> None:
    # In a fresh interpreter so the timing includes imports and nothing cached.
    code = ("import time; t=time.perf_counter(); from cursorsync_devtools.sim import *; "
            "r=run_failover(Workload()); print(time.perf_counter()-t); "
            "import json; print(json.dumps(r.to_dict()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    elapsed, report = float(out[0]), json.loads(out[1])
    assert elapsed < 5.0
    cs, bi = report["cursorsync"], report["builtin"]
    assert cs["losses"] == 0 and bi["losses"] == 0
    assert bi["duplicates"] > 10 * cs["duplicates"]
    # What cursorsync redelivers: partial batches, plus acks after the last applied sync.
    assert cs["partial_batch_duplicates"] > 0
    assert report["sync"]["unsafe_entries_refused"] == 0
    assert report["builtin_stats"]["snapshots_timed_out"] > 0  # the backlog burst


# ------------------------------------------------------------- the simulated topics


def test_ledgers_roll_over_on_both_sides_at_different_sizes(sim_small) -> None:  # type: ignore[no-untyped-def]
    w = sim_small.workload
    for part in sim_small.partitions:
        for log, (lo, hi) in ((part.source, w.ledger_entries_a), (part.target, w.ledger_entries_b)):
            ids, counts = np.unique(log.ledger, return_counts=True)
            assert len(ids) >= 3, log.name
            assert (counts[:-1] >= lo).all() and (counts[:-1] <= hi).all()
            assert len(set(counts[:-1].tolist())) > 1  # sizes drawn per ledger
            assert (np.diff(ids) >= 1).all() and (np.diff(ids) > 1).any()  # sparse ids
            # Entry ids restart at 0 in every ledger and count up by one.
            for lid in ids[:3]:
                e = log.entry[log.ledger == lid]
                assert e.tolist() == list(range(len(e)))
        # The two clusters roll over at different points.
        src_ends = np.unique(part.source.ledger, return_counts=True)[1][:-1].tolist()
        tgt_ends = np.unique(part.target.ledger, return_counts=True)[1][:-1].tolist()
        assert src_ends != tgt_ends


def test_replication_is_one_entry_per_entry_in_order_with_same_batches(sim_small) -> None:  # type: ignore[no-untyped-def]
    for part in sim_small.partitions:
        src, tgt = part.source, part.target
        rep = np.flatnonzero(src.peer >= 0)
        assert (np.diff(src.peer[rep]) > 0).all()  # order preserved
        assert (tgt.peer[src.peer[rep]] == rep).all()  # links agree both ways
        assert (tgt.msg_count[src.peer[rep]] == src.msg_count[rep]).all()
        assert (tgt.write_ms[src.peer[rep]] >= src.write_ms[rep]).all()
        # Unreplicated entries (other origin, replicate_to, TTL, local markers) never reach B.
        assert (src.peer[src.reason != 0] == -1).all()
        assert ((src.kind == KIND_DATA) & (src.reason != 0)).any()
        assert (tgt.kind == KIND_FOREIGN).any()


def test_markers_in_both_topics_never_delivered_and_acked_on_source(sim_small) -> None:  # type: ignore[no-untyped-def]
    T = sim_small.failover_ms
    for part in sim_small.partitions:
        for log in (part.source, part.target):
            types = set(log.marker_type[log.kind == KIND_MARKER].tolist())
            assert {SNAPSHOT_REQUEST, SNAPSHOT_RESPONSE, SNAPSHOT} <= types, log.name
            assert (log.msg_count[log.kind == KIND_MARKER] == 0).all()
        # No message lives in a marker entry: consumers never receive them.
        assert (part.source.kind[part.messages.entry] == KIND_DATA).all()
        deliverable = part.target_deliverable(T)
        assert not deliverable[part.target.kind == KIND_MARKER].any()
        # The source dispatcher acks markers: every marker read by T is acked at entry level.
        n = part.source.written_by(T - part.consumer_delay_ms)
        marker = np.flatnonzero(part.source.kind[:n] == KIND_MARKER)
        assert part.source_acked_entries(T)[marker].all()
        # A reader of B sees holes exactly where markers sit (except at ledger tails).
        seen = part.target.kind != KIND_MARKER
        found = holes(part.target.ledger[seen], part.target.entry[seen]).ranges()
        markers = {part.target.position(i) for i in np.flatnonzero(~seen)}
        assert set(found.iter_entries()) <= markers
        assert len(set(found.iter_entries())) > len(markers) // 2


def test_source_cursor_is_the_broker_fold_and_round_trips_through_strings(sim_small) -> None:  # type: ignore[no-untyped-def]
    part = sim_small.partitions[0]
    holes_seen = 0
    for at in range(500, sim_small.failover_ms, 1700):
        cur = part.source_cursor(at)
        md, rest = entry_truth_cursor(part, at)
        assert cur.mark_delete == md
        assert set(cur.individually_deleted.iter_entries(cur.ledgers)) == rest
        holes_seen += len(cur.individually_deleted)
        parsed = CursorState.parse(str(cur.mark_delete), str(cur.individually_deleted),
                                   cur.ledgers)
        assert parsed.mark_delete == cur.mark_delete
        assert parsed.individually_deleted == cur.individually_deleted
        assert str(parsed.individually_deleted) == str(cur.individually_deleted)
        # Past a real entry, the core fold agrees with the broker rule.
        if md != part.source.fresh_position():
            assert fold(cur.mark_delete, cur.individually_deleted, cur.ledgers) == (
                cur.mark_delete, cur.individually_deleted)
    assert holes_seen > 0  # long-lived holes do show up as individual ranges


def test_partial_batches_are_unacked_entries_with_acked_messages(sim_small) -> None:  # type: ignore[no-untyped-def]
    part = sim_small.partitions[1]
    at = sim_small.failover_ms
    partial = part.partially_acked(at)
    assert partial
    acked_entries = part.source_acked_entries(at)
    acked_msgs = part.acked_messages(at)
    for pos in list(partial.iter_entries(part.source.ledgers_at(at)))[:20]:
        i = int(np.flatnonzero((part.source.ledger == pos.ledger)
                               & (part.source.entry == pos.entry))[0])
        s, n = part.source.msg_start[i], part.source.msg_count[i]
        assert 0 < acked_msgs[s:s + n].sum() < n
        assert not acked_entries[i]
    ids = part.message_ids()
    assert len(ids) == len(part.messages.entry)
    assert {m.partition for m in ids} == {1}
    assert any(m.batch_index > 0 for m in ids) and any(m.batch_index == -1 for m in ids)


def test_fold_handles_a_fresh_cursor() -> None:
    """The simulator folds both brokers' cursors with the core fold: pin the cases it needs."""
    ledgers = Ledgers.of([(5, 10), (9, 4)])
    fresh = Position(5, -1)
    assert fold(fresh, RangeSet.of(("5:2", "5:4")), ledgers) == (
        fresh, RangeSet.of(("5:2", "5:4")))
    assert fold(fresh, RangeSet.of(("5:-1", "5:4")), ledgers) == (
        Position(5, 4), RangeSet())
    assert fold(fresh, RangeSet.of(("5:-1", "5:9"), ("9:-1", "9:1")), ledgers) == (
        Position(9, 1), RangeSet())
    assert fold(Position(5, 1), RangeSet.of(("5:1", "5:3"), ("5:5", "5:6")), ledgers) == (
        Position(5, 3), RangeSet.of(("5:5", "5:6")))


# --------------------------------------------------------------------- failover


@pytest.mark.parametrize("seed", range(12))
def test_cursorsync_never_loses_across_seeds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = small(
        seed=seed,
        partitions=int(rng.integers(1, 4)),
        hole_probability=float(rng.choice([0.0, 0.01, 0.05])),
        partial_batch_probability=float(rng.choice([0.0, 0.1])),
        cumulative_ack_probability=float(rng.choice([0.0, 0.02])),
        foreign_rate_per_s=float(rng.choice([0.0, 10.0])),
        unreplicated_rate=float(rng.choice([0.0, 0.05])),
        sync_interval_ms=int(rng.choice([300, 1000])),
        mapping_lag_ms=int(rng.choice([0, 400])),
        evidence_drop=float(rng.choice([0.0, 0.2])),
        map_markers=bool(rng.integers(0, 2)),
        skippable_from="markers" if seed % 2 else "reader-holes",
        target_state_from="plan" if seed % 3 else "broker",
    )
    r = run_failover(w)
    assert r.cursorsync.losses == 0
    assert r.cursorsync.foreign_skipped == 0
    assert r.sync.unsafe_entries_refused == 0
    assert r.builtin.losses == 0
    assert r.cursorsync.messages_total == r.builtin.messages_total > 0
    if w.evidence_drop == 0:
        # Progress: with every replicated entry's evidence, each duplicate is a partial batch
        # or was acked on A (or reached B) after the last applied sync.
        assert r.cursorsync.duplicates_unexplained == 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), drop=st.floats(0.0, 0.9), lag=st.integers(0, 3000),
       holes_p=st.floats(0.0, 0.05))
def test_missing_or_late_evidence_only_adds_duplicates(seed: int, drop: float, lag: int,
                                                        holes_p: float) -> None:
    base = small(seed=seed, messages=1500, hole_probability=holes_p)
    full = run_failover(base)
    worse = run_failover(small(seed=seed, messages=1500, hole_probability=holes_p,
                               evidence_drop=drop, mapping_lag_ms=lag))
    assert worse.cursorsync.losses == 0
    assert worse.cursorsync.duplicates >= full.cursorsync.duplicates
    # Same history: the built-in path is unaffected.
    assert (worse.builtin.duplicates, worse.builtin.losses, worse.builtin.redelivered) == (
        full.builtin.duplicates, full.builtin.losses, full.builtin.redelivered)


def test_missing_evidence_duplicates_grow_with_the_drop_rate() -> None:
    dups = [run_failover(small(seed=5, evidence_drop=d)).cursorsync for d in (0.0, 0.3, 0.8)]
    assert [c.losses for c in dups] == [0, 0, 0]
    assert dups[0].duplicates < dups[1].duplicates < dups[2].duplicates
    assert dups[0].duplicates_unexplained == 0 < dups[1].duplicates_unexplained


def test_builtin_redelivers_far_more_with_holes() -> None:
    w = small(seed=8, messages=8000, hole_probability=0.01, hole_lifetime_ms=15_000,
              partial_batch_probability=0.005, backlog_bursts=())
    r = run_failover(w)
    assert r.builtin.duplicates > 5 * max(1, r.cursorsync.duplicates)
    assert r.cursorsync.losses == r.builtin.losses == 0
    # cursorsync's duplicates are partial batches and what was acked after the last sync.
    c = r.cursorsync
    assert c.duplicates == c.partial_batch_duplicates + c.duplicates_after_last_sync
    assert c.duplicates_unexplained == 0
    acked_after = sum(
        int(((p.messages.ack_ms > r.sync.last_sync_ms) & (p.messages.ack_ms <= r.failover_ms))
            .sum()) for p in simulate(w).partitions)
    assert 0 < c.duplicates_after_last_sync <= acked_after
    assert r.builtin.duplicates_unexplained > 0.8 * r.builtin.duplicates


def test_builtin_stalls_while_the_target_is_backlogged() -> None:
    calm = run_failover(small(seed=2, hole_probability=0.0, backlog_bursts=()))
    burst = run_failover(small(seed=2, hole_probability=0.0,
                               backlog_bursts=((1000, 40_000),), failover_ms=5000))
    assert calm.builtin_stats.snapshots_timed_out == 0
    assert calm.builtin_stats.updates_applied_on_target > 0
    part = simulate(small(seed=2, hole_probability=0.0, backlog_bursts=())).partitions[0]
    for log in (part.source, part.target):  # UPDATE markers are written on A, replicated to B
        assert UPDATE in set(log.marker_type[log.kind == KIND_MARKER].tolist())
    assert burst.builtin_stats.updates_applied_on_target == 0
    assert burst.messages_in_flight > 0  # not on B yet: neither duplicate nor loss
    assert burst.cursorsync.losses == burst.builtin.losses == 0


def test_partitioned_workload() -> None:
    r = run_failover(small(seed=4, partitions=4, messages=6000))
    assert len(r.cursorsync.target_mark_delete) == 4
    assert r.cursorsync.messages_total > 0.7 * 6000
    assert r.cursorsync.losses == 0
    sim = simulate(small(seed=4, partitions=4, messages=6000))
    assert [p.partition for p in sim.partitions] == [0, 1, 2, 3]
    # Partitions are independent managed ledgers with their own ledger ids.
    firsts = [int(p.source.ledger[0]) for p in sim.partitions]
    assert len(set(firsts)) == 4


def test_counting_is_per_message_truth(sim_small) -> None:  # type: ignore[no-untyped-def]
    """Ack every target entry: losses = replicated messages A has not acked, per message."""
    part = sim_small.partitions[0]
    T = sim_small.failover_ms
    everything = np.ones(len(part.target), bool)
    c = count_failover(part, T, everything)
    assert c["duplicates"] == 0 and c["redelivered"] == 0
    assert c["losses"] == c["on_target"] - int(
        (part.acked_messages(T) & (part.source.peer[part.messages.entry] >= 0)
         & (part.source.peer[part.messages.entry] < part.target.written_by(T))).sum())
    nothing = count_failover(part, T, np.zeros(len(part.target), bool))
    assert nothing["losses"] == 0 and nothing["redelivered"] == nothing["on_target"]


def test_invalid_workload_names_the_knob() -> None:
    with pytest.raises(ValueError, match="evidence_drop"):
        Workload(evidence_drop=1.5)
    with pytest.raises(ValueError, match=r"skippable_from.*valid values"):
        Workload(skippable_from="everything")  # type: ignore[arg-type]


def test_cumulative_target_acks_never_lose() -> None:
    """Exclusive/Failover subscriptions ack cumulatively to the plan's markDeletePosition.

    Regression: before core commit 236bc8d, fold jumped a fresh target cursor
    (L:-1) over unacked leading entries, and this workload lost a message.
    """
    for seed in (4, 5):
        w = Workload(seed=seed, messages=3000, hole_probability=0.05, foreign_rate_per_s=0.0,
                     backlog_bursts=(), target_ack_mode="cumulative")
        r = run_failover(w)
        assert r.cursorsync.losses == 0
        assert r.sync.plan_vs_broker_mark_delete_mismatches == 0
    r = run_failover(small(seed=1, foreign_rate_per_s=10.0, target_ack_mode="cumulative"))
    assert r.cursorsync.losses == 0 and r.cursorsync.foreign_skipped == 0


def random_workload(seed: int) -> Workload:
    """Every knob at once, drawn from a seed: tiny ledgers, bursts, lags, lost evidence."""
    rng = np.random.default_rng(1000 + seed)

    def pick(*xs: T) -> T:
        return xs[int(rng.integers(len(xs)))]

    return Workload(
        seed=seed, messages=int(rng.integers(200, 2500)), partitions=int(rng.integers(1, 4)),
        ledger_entries_a=(int(rng.integers(1, 30)), 60),
        ledger_entries_b=(int(rng.integers(1, 30)), 60),
        batch_probability=float(rng.random()), hole_probability=float(pick(0.0, 0.01, 0.1)),
        hole_lifetime_ms=int(rng.integers(100, 20_000)),
        partial_batch_probability=float(pick(0.0, 0.3)),
        cumulative_ack_probability=float(pick(0.0, 0.05)),
        foreign_rate_per_s=float(pick(0.0, 20.0)),
        unreplicated_rate=float(pick(0.0, 0.2)),
        sync_interval_ms=int(rng.integers(50, 2000)), sync_lag_ms=int(rng.integers(0, 500)),
        mapping_lag_ms=int(pick(0, 300)),
        evidence_drop=float(pick(0.0, 0.5)),
        map_markers=bool(rng.integers(2)),
        skippable_from=pick("markers", "reader-holes"),
        target_ack_mode=pick("individual", "cumulative"),
        target_state_from=pick("plan", "broker"),
        marker_interval_ms=int(rng.integers(50, 2000)),
        replication_lag_ms=int(rng.integers(0, 500)),
        backlog_bursts=((int(rng.integers(0, 5000)), int(rng.integers(0, 40_000))),),
        snapshot_cache_size=int(rng.integers(1, 12)),
    )


def test_random_configurations_keep_every_invariant() -> None:
    for seed in range(40):
        w = random_workload(seed)
        r = run_failover(w)
        c = r.cursorsync
        assert c.losses == 0, w
        assert c.foreign_skipped == 0, w
        assert r.sync.unsafe_entries_refused == 0, w
        assert r.sync.plan_vs_broker_mark_delete_mismatches == 0, w
        assert r.builtin.losses == 0, w
        if w.evidence_drop == 0:
            assert c.duplicates_unexplained == 0, w


def test_simulator_imports_no_spark_pulsar_delta_or_prometheus() -> None:
    code = ("import sys, cursorsync_devtools.sim; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyspark', 'pulsar', 'deltalake', 'delta', 'prometheus_client')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
