"""``cursorsync-dev bench replay``: a kept run's sync batches again, on the driver alone.

``bench partitions --work-dir DIR`` keeps each run's tables. This replays the sync batches
they recorded through the real :class:`~cursorsync.sync.step.SyncStep` (translate, guard;
dry run, nothing sent), each batch with:

* the source cursors its ``cursor_states`` rows hold, as observed then;
* the mappings as written by then: every ``mappings`` row written at or before the
  batch's newest observation;
* each target cursor as the batches before left it: the markDeletePosition of its last
  ``sync_progress`` row, and the ranges those rows acked past it. No broker holds the run
  any more, so the target's ledger list is the one the mappings name, each ledger's entry
  count the largest its segments reach.

It prints the step's seconds per batch and per cursor planned, without the brokers, the
Spark queries and the mapping builder that shared the job's driver, so that a change to
the step is measured on a real run's cursors and mappings in seconds. A second pass under
cProfile says which parts of the step the time goes to, as shares of its time (the
profiler's overhead inflates the seconds, much less the shares).
"""

from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.app.status import partition_key
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.packed import PackedMappings
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.errors import ConfigError
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.tables import open_store
from cursorsync.tables.rows import cursor_states, topic_mappings

#: The step's parts whose share of its time is printed: (name, the function's file and name
#: as cProfile knows them).
PARTS = (
    ("plan", "sync/step.py", "_plan"),
    ("judge_gaps", "sync/marker_lookups.py", "judged"),
    ("translate", "core/translate.py", "translate"),
    ("translate:unmapped", "core/translate.py", "_unmapped"),
    ("translate:skippable", "core/translate.py", "_ack_skippable"),
    ("translate:fold", "core/cursor.py", "fold"),
    ("translate:mapped", "core/translate.py", "safe_target_acks"),
    ("guard", "core/guard.py", "guard"),
)

Key = tuple[PartitionKey, str]


def bench_replay(tables: str, *, first: int | None = None, last: int | None = None
                 ) -> dict[str, Any]:
    """Replay the sync batches ``first``..``last`` (default: all) of the run whose tables
    are at ``tables``, once timed and once profiled."""
    run = _Run.load(tables)
    ids = [b for b in run.batch_ids if (first is None or b >= first)
           and (last is None or b <= last)]
    if not ids:
        raise ConfigError(f"{tables}: no sync batch in {first}..{last} "
                          f"(the run has {run.batch_ids[:1]}..{run.batch_ids[-1:]})")
    batches = run.replay(ids)
    profile = cProfile.Profile()
    run.replay(ids, profile)
    shares = _shares(profile)
    planned = sum(b["cursors"] for b in batches)
    step_s = sum(b["step_seconds"] for b in batches)
    return {
        "tables": tables, "batches": len(batches), "first_batch": ids[0], "last_batch": ids[-1],
        "cursors_planned": planned, "step_seconds": round(step_s, 3),
        "translate_seconds": round(sum(b["translate_seconds"] for b in batches), 3),
        "milliseconds_per_cursor": round(1000 * step_s / planned, 3) if planned else None,
        "slowest_batch_seconds": max(b["step_seconds"] for b in batches),
        "share_of_step_by_part": shares,
        "per_batch": batches,
    }


class _Run:
    """A kept run's tables, read once, and the replay's state."""

    def __init__(self, mappings: pa.Table, states: pa.Table, progress: pa.Table) -> None:
        self.mappings, self.states, self.progress = mappings, states, progress
        self.batch_ids = sorted(set(states.column("batch_id").to_pylist()))

    @classmethod
    def load(cls, tables: str) -> _Run:
        if not Path(tables).is_dir():
            raise ConfigError(f"{tables}: not a directory (give a run's tables, as "
                              f"`bench partitions --work-dir DIR` keeps them: DIR/<run>/tables)")
        store = open_store("delta-rs", tables)
        missing = [t for t in ("mappings", "cursor_states", "sync_progress")
                   if not store.exists(t)]
        if missing:
            raise ConfigError(f"{tables}: no {', '.join(missing)} table: not a run's tables")
        return cls(store.read("mappings"), store.read("cursor_states"),
                   store.read("sync_progress"))

    def replay(self, ids: list[int], profile: cProfile.Profile | None = None
               ) -> list[dict[str, Any]]:
        targets: dict[Key, CursorState] = {}
        step = SyncStep(StepSettings(dry_run=True), None, lambda topic, sub: None)
        packed = PackedMappings()
        ledgers: dict[PartitionKey, Ledgers] = {}
        loaded_upto = None
        out = []
        for b in ids:
            obs = cursor_states(self.states.filter(pc.equal(self.states.column("batch_id"), b)))
            upto = max(o.observed_at for o in obs)
            packed.next_batch()
            new = self.mappings.filter(pc.less_equal(self.mappings.column("written_at"),
                                                     pa.scalar(upto, pa.timestamp("us", "UTC"))))
            if loaded_upto is not None:
                new = new.filter(pc.greater(new.column("written_at"),
                                            pa.scalar(loaded_upto, pa.timestamp("us", "UTC"))))
            loaded_upto = upto
            for key, mapping in topic_mappings(new).items():
                packed.merge(key, mapping)
                ledgers[key] = _target_ledgers(packed[key].segments.rows, ledgers.get(key))
            packed.settle()
            step.read_targets = _reader(targets, ledgers)
            t0 = time.perf_counter()
            if profile is not None:
                profile.enable()
            result = step.run(obs, packed)
            if profile is not None:
                profile.disable()
            seconds = time.perf_counter() - t0
            out.append({"batch_id": b, "cursors": len(obs), "step_seconds": round(seconds, 3),
                        "translate_seconds": round(result.translate_seconds, 3),
                        "acks_planned_entries": sum(r.plan.to_ack.count_entries()
                                                    for r in result.records)})
            self._after(b, targets)
        return out

    def _after(self, b: int, targets: dict[Key, CursorState]) -> None:
        """The target cursors as batch ``b``'s recorded plans left them."""
        rows = self.progress.filter(pc.equal(self.progress.column("batch_id"), b)).to_pylist()
        for r in rows:
            key = (PartitionKey(r["topic"], r["partition"]), r["subscription"])
            md = Position(r["target_mark_delete_ledger"], r["target_mark_delete_entry"])
            was = targets.get(key)
            acked = RangeSet.parse(r["acked_ranges"]) | (
                was.individually_deleted if was is not None else RangeSet())
            targets[key] = CursorState(md, acked.after(md))


def _target_ledgers(rows: Any, was: Ledgers | None) -> Ledgers:
    """The target ledgers the segments name, each with the entries they reach (at least as
    many as before)."""
    counts = dict(zip(was.ids.tolist(), was.entries.tolist(), strict=True)) if was else {}
    for ledger, entry, n in zip(rows[:, 2].tolist(), rows[:, 3].tolist(), rows[:, 4].tolist(),
                                strict=True):
        counts[ledger] = max(counts.get(ledger, 0), entry + n)
    return Ledgers.of(counts.items())


def _reader(targets: dict[Key, CursorState], ledgers: dict[PartitionKey, Ledgers]) -> Any:
    def read_targets(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], CursorState]:
        out = {}
        for topic, sub in pairs:
            key = partition_key(topic)
            was = targets.get((key, sub), CursorState(Position(-1, -1)))
            out[topic, sub] = CursorState(was.mark_delete, was.individually_deleted,
                                          ledgers.get(key))
        return out
    return read_targets


def _shares(profile: cProfile.Profile) -> dict[str, float]:
    """Each part's cumulative time as a share of the step's (its ``run``)."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    cumulative: dict[tuple[str, str], float] = {}
    for (path, _, name), (_, _, _, ct, _) in stats.items():
        for suffix in {p[1] for p in PARTS} | {"sync/step.py"}:
            if path.endswith(suffix):
                cumulative[suffix, name] = cumulative.get((suffix, name), 0.0) + ct
    whole = cumulative.get(("sync/step.py", "run"), 0.0)
    return {part: round(cumulative.get((path, fn), 0.0) / whole, 3) if whole else 0.0
            for part, path, fn in PARTS}
