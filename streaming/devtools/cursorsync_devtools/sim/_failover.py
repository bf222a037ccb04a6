"""Fail consumers over from A to B and count, per message, what each strategy gets wrong.

Two strategies run on the same history:

* **cursorsync**: every sync interval the source cursor is read, translated
  with :func:`cursorsync.core.translate.translate` against the mapping known at that
  moment, guarded by :func:`cursorsync.core.translate.check_safe`, and acked on B
  ``sync_lag_ms`` later. Plans apply cumulatively, as the real sync loop does.
* **builtin**: Pulsar's replicated subscriptions (see :mod:`._partition`).

At failover every deliverable target entry not acked on B's cursor is
redelivered. The counts come from the per-message truth of A's consumers and
B's cursor, never from the translator's own bookkeeping:

* duplicates: redelivered messages that A had acked at the failover instant;
* partial_batch_duplicates: those of them whose batch was only partly acked;
* losses: messages A had not acked whose target entry B's cursor has acked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import numpy.typing as npt

from cursorsync.core.cursor import CursorState, fold
from cursorsync.core.guard import check_safe
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.ranges import RangeSet
from cursorsync.core.translate import translate
from cursorsync_devtools.sim._partition import PartitionState, simulate_partition
from cursorsync_devtools.sim._production import produce
from cursorsync_devtools.sim._topics import KIND_FOREIGN, REPLICATED
from cursorsync_devtools.sim._workload import Workload


@dataclass(frozen=True)
class Simulation:
    """A whole run: the workload, the failover instant and every partition's raw history."""

    workload: Workload
    failover_ms: int
    partitions: tuple[PartitionState, ...]


def simulate(workload: Workload) -> Simulation:
    """Generate the history of every partition (deterministic in ``workload.seed``)."""
    w = workload
    n = w.partitions
    per = [w.messages // n + (1 if p < w.messages % n else 0) for p in range(n)]
    seeds = [np.random.SeedSequence([w.seed, p]).spawn(5) for p in range(n)]
    prods = [produce(w, per[p], np.random.default_rng(seeds[p][0])) for p in range(n)]
    failover = w.failover_ms
    if failover is None:
        failover = max(1, int(0.8 * min(pr.end_ms for pr in prods)))
    horizon = max(failover, max(pr.end_ms for pr in prods)) + w.marker_interval_ms
    parts = tuple(simulate_partition(w, p, prods[p], seeds[p][1:], horizon) for p in range(n))
    return Simulation(w, failover, parts)


# ----------------------------------------------------------------------- reports


@dataclass(frozen=True)
class StrategyCounts:
    """Per-message outcome of one strategy at failover (sums over partitions)."""

    messages_total: int  #: messages produced on A by the failover instant
    acked_on_source: int  #: of those, acked on A
    on_target: int  #: messages whose entry had been replicated to B by then
    redelivered: int  #: messages B delivers after the switch (from A)
    duplicates: int
    #: Duplicates in batches A had only partly acked (entry-level: unacked).
    partial_batch_duplicates: int
    #: Other duplicates whose entry became fully acked on A, or reached B, after cursorsync's
    #: last applied sync (for builtin: relative to the same instant, for comparison).
    duplicates_after_last_sync: int
    #: The rest: acked on A in time but not carried over (stale snapshots, missing evidence).
    duplicates_unexplained: int
    losses: int
    #: Messages produced on B, acked on B's cursor although nobody consumed them there.
    foreign_skipped: int
    target_mark_delete: tuple[str, ...]  #: per partition, B's cursor at failover
    target_individual_ranges: tuple[int, ...]


@dataclass(frozen=True)
class SyncStats:
    """What the cursorsync loop did before the failover."""

    syncs: int = 0
    entries_acked: int = 0
    #: Entries a plan wanted to ack that check_safe refused (must stay 0).
    unsafe_entries_refused: int = 0
    skippable_acked_entries: int = 0
    rewound_entries: int = 0
    unmapped_acked_entries_last: int = 0
    partial_batches_unacked_last: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    last_sync_ms: int = -1
    #: Syncs where the plan's markDeletePosition differs from what B's broker folds.
    plan_vs_broker_mark_delete_mismatches: int = 0


@dataclass(frozen=True)
class BuiltinStats:
    snapshots_started: int
    snapshots_completed: int
    snapshots_timed_out: int
    snapshots_evicted: int
    updates_written: int
    updates_applied_on_target: int


@dataclass(frozen=True)
class FailoverReport:
    """The comparison ``run_failover`` returns; ``to_dict()`` is JSON-ready."""

    workload: Workload
    failover_ms: int
    messages_unreplicated: int  #: source messages that are never replicated
    messages_in_flight: int  #: replicable messages not yet on B at failover
    cursorsync: StrategyCounts
    builtin: StrategyCounts
    sync: SyncStats
    builtin_stats: BuiltinStats

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["workload"] = self.workload.to_dict()
        return _jsonable(d)  # type: ignore[return-value]


def _jsonable(v: object) -> object:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


# ------------------------------------------------------------------ strategies


def run_cursorsync(sim: Simulation, part: PartitionState) -> tuple[RangeSet, dict[str, int],
                                                                  dict[str, int]]:
    """Run the sync loop up to failover; return B's acked positions and the loop's stats."""
    w = sim.workload
    T = sim.failover_ms
    broker_acked = RangeSet()
    plan_state: CursorState | None = None
    previous_source: CursorState | None = None
    stats = dict(syncs=0, entries_acked=0, unsafe=0, skippable=0, rewound=0, unmapped_last=0,
                 partial_last=0, last_sync_ms=-1, md_mismatch=0)
    outcomes: dict[str, int] = {}
    s = w.sync_interval_ms
    while s + w.sync_lag_ms <= T:
        tgt_ledgers = part.target.ledgers_at(s)
        broker_state = _broker_cursor(part, broker_acked, tgt_ledgers)
        if w.target_state_from == "broker" or plan_state is None:
            target = broker_state
        else:
            target = CursorState(plan_state.mark_delete, plan_state.individually_deleted,
                                 tgt_ledgers)
        source = part.source_cursor(s)
        mapping = part.mapping(s, evidence_drop=w.evidence_drop, lag_ms=w.mapping_lag_ms,
                               map_markers=w.map_markers, skippable_from=w.skippable_from)
        plan = translate(source, mapping, target, previous_source=previous_source,
                         partially_acked=part.partially_acked(s))
        refused = check_safe(plan, source, mapping, target)
        send = plan.to_ack - refused
        if w.target_ack_mode == "cumulative":
            cum, rest = plan.split(cumulative=True)
            sent = (RangeSet.up_to(cum) if cum is not None else RangeSet()) | (rest - refused)
        else:
            sent = send
        stats["entries_acked"] += (sent - broker_acked).count_entries(tgt_ledgers)
        broker_acked = broker_acked | sent
        plan_state = CursorState(plan.mark_delete, plan.individually_deleted, tgt_ledgers)
        after = _broker_cursor(part, broker_acked, tgt_ledgers)
        if after.mark_delete != plan.mark_delete:
            stats["md_mismatch"] += 1
        previous_source = source
        stats["syncs"] += 1
        stats["unsafe"] += refused.count_entries(tgt_ledgers)
        stats["skippable"] += plan.skippable_acked_entries
        stats["rewound"] += plan.rewound_entries
        stats["unmapped_last"] = plan.unmapped_acked_entries
        stats["partial_last"] = plan.partial_batches_unacked
        stats["last_sync_ms"] = s
        outcomes[plan.outcome] = outcomes.get(plan.outcome, 0) + 1
        s += w.sync_interval_ms
    return broker_acked, stats, outcomes


def _broker_cursor(part: PartitionState, acked: RangeSet, ledgers: Ledgers) -> CursorState:
    """B's cursor as its broker folds the acks it received."""
    md, idm = fold(part.target.fresh_position(), acked, ledgers)
    return CursorState(md, idm, ledgers)


def count_failover(part: PartitionState, at_ms: int, target_acked: npt.NDArray[np.bool_],
                   *, observed_ms: int = -1, known_ms: int = -1) -> dict[str, int]:
    """Per-message duplicates and losses for one partition, from the truth on both sides.

    ``target_acked``: per target entry, whether B's cursor has it acked.
    ``observed_ms``: when the source cursor was last read (cursorsync's last
    applied sync) and ``known_ms`` how far the mapping had read B then.
    Duplicates whose entry became fully acked on A after ``observed_ms``, or
    whose target copy was written after ``known_ms``, are counted in
    ``duplicates_after_last_sync``; duplicates neither there nor in a partial
    batch in ``duplicates_unexplained``.
    """
    src, tgt = part.source, part.target
    n_src = src.written_by(at_ms)
    n_tgt = tgt.written_by(at_ms)
    msg_entry = part.messages.entry
    produced = msg_entry < n_src
    acked_msg = part.acked_messages(at_ms) & produced
    # Per message: its entry's target copy, if it exists on B by now.
    peer = src.peer[msg_entry]
    on_b = produced & (peer >= 0) & (peer < n_tgt)
    pad = len(tgt)  # messages not on B index one padding slot
    peer_c = np.where(on_b, peer, pad)
    b_acked = on_b & np.append(target_acked, False)[peer_c]
    redelivered = on_b & ~b_acked
    dup = redelivered & acked_msg
    loss = on_b & b_acked & ~acked_msg
    # Partial batches at entry level: some but not all messages of the entry acked.
    entry_acked = np.bincount(msg_entry, weights=acked_msg, minlength=len(src))
    partial_entry = (entry_acked > 0) & (entry_acked < src.msg_count)
    entry_ack = part.source_entry_ack_ms[msg_entry]
    landed = np.append(tgt.write_ms, np.iinfo(np.int64).max)[peer_c]
    late = dup & ~partial_entry[msg_entry] & ((entry_ack > observed_ms) | (landed > known_ms))
    replicable = produced & (src.reason[msg_entry] == REPLICATED)
    foreign = (tgt.kind[:n_tgt] == KIND_FOREIGN) & target_acked[:n_tgt]
    return dict(
        messages_total=int(produced.sum()),
        acked_on_source=int(acked_msg.sum()),
        on_target=int(on_b.sum()),
        redelivered=int(redelivered.sum()),
        duplicates=int(dup.sum()),
        partial_batch_duplicates=int((dup & partial_entry[msg_entry]).sum()),
        duplicates_after_last_sync=int(late.sum()),
        duplicates_unexplained=int((dup & ~partial_entry[msg_entry] & ~late).sum()),
        losses=int(loss.sum()),
        foreign_skipped=int(tgt.msg_count[:n_tgt][foreign].sum()),
        unreplicated=int((produced & (src.reason[msg_entry] != REPLICATED)).sum()),
        in_flight=int((replicable & ~on_b).sum()),
    )


def _sum_counts(rows: list[dict[str, int]], md: list[str], ranges: list[int]) -> StrategyCounts:
    def total(k: str) -> int:
        return sum(r[k] for r in rows)

    return StrategyCounts(
        messages_total=total("messages_total"), acked_on_source=total("acked_on_source"),
        on_target=total("on_target"), redelivered=total("redelivered"),
        duplicates=total("duplicates"),
        partial_batch_duplicates=total("partial_batch_duplicates"),
        duplicates_after_last_sync=total("duplicates_after_last_sync"),
        duplicates_unexplained=total("duplicates_unexplained"), losses=total("losses"),
        foreign_skipped=total("foreign_skipped"), target_mark_delete=tuple(md),
        target_individual_ranges=tuple(ranges))


def run_failover(workload: Workload) -> FailoverReport:
    """Simulate, run both strategies to the failover instant, and count per message."""
    sim = simulate(workload)
    return failover_report(sim)


def failover_report(sim: Simulation) -> FailoverReport:
    """The report for an already simulated history."""
    T = sim.failover_ms
    cs_rows, bi_rows = [], []
    cs_md, cs_ranges, bi_md = [], [], []
    agg: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    updates_applied = 0
    for part in sim.partitions:
        tgt = part.target
        ledgers = tgt.ledgers_at(T)
        acked, stats, outs = run_cursorsync(sim, part)
        for k, v in stats.items():
            if k.endswith("_last") or k == "last_sync_ms":
                agg[k] = max(agg.get(k, -1), v) if k == "last_sync_ms" else agg.get(k, 0) + v
            else:
                agg[k] = agg.get(k, 0) + v
        for k, v in outs.items():
            outcomes[k] = outcomes.get(k, 0) + v
        in_acked = acked.contains_arrays(tgt.ledger, tgt.entry)
        seen = dict(observed_ms=stats["last_sync_ms"],
                    known_ms=stats["last_sync_ms"] - sim.workload.mapping_lag_ms)
        cs_rows.append(count_failover(part, T, in_acked, **seen))
        cursor = _broker_cursor(part, acked, ledgers)
        cs_md.append(str(cursor.mark_delete))
        cs_ranges.append(len(cursor.individually_deleted))
        # Built-in: B's markDeletePosition is the newest UPDATE that arrived.
        through = part.builtin.target_acked_through(T)
        bi_acked = np.arange(len(tgt)) <= through
        bi_rows.append(count_failover(part, T, bi_acked, **seen))
        bi_md.append(str(part.builtin_target_mark_delete(T)))
        updates_applied += int((part.builtin.update_arrival_ms <= T).sum())
    b = [p.builtin for p in sim.partitions]
    return FailoverReport(
        workload=sim.workload,
        failover_ms=T,
        messages_unreplicated=sum(r["unreplicated"] for r in cs_rows),
        messages_in_flight=sum(r["in_flight"] for r in cs_rows),
        cursorsync=_sum_counts(cs_rows, cs_md, cs_ranges),
        builtin=_sum_counts(bi_rows, bi_md, [0] * len(bi_md)),
        sync=SyncStats(
            syncs=agg["syncs"], entries_acked=agg["entries_acked"],
            unsafe_entries_refused=agg["unsafe"], skippable_acked_entries=agg["skippable"],
            rewound_entries=agg["rewound"], unmapped_acked_entries_last=agg["unmapped_last"],
            partial_batches_unacked_last=agg["partial_last"], outcomes=outcomes,
            last_sync_ms=agg["last_sync_ms"],
            plan_vs_broker_mark_delete_mismatches=agg["md_mismatch"]),
        builtin_stats=BuiltinStats(
            snapshots_started=sum(x.snapshots_started for x in b),
            snapshots_completed=sum(x.snapshots_completed for x in b),
            snapshots_timed_out=sum(x.snapshots_timed_out for x in b),
            snapshots_evicted=sum(x.snapshots_evicted for x in b),
            updates_written=sum(x.updates_written for x in b),
            updates_applied_on_target=updates_applied),
    )

