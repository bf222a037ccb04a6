"""The idle cursors the sync sink keeps in columns between batches: a step fed through the
store decides, sends and reads exactly what a step that keeps every cursor itself does;
the rows it leaves out are the repeats of idle plans, nothing else."""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.cursor import CursorState
from cursorsync.core.guard import SafePlan
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.packed import PackedMappings
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.pulsar.emitter import EmitResult
from cursorsync.sync.idle_store import IdleStore
from cursorsync.sync.observed import Observations, poll_rows
from cursorsync.sync.plans import IDLE_TARGET_READ_EVERY, decode_plan, encode_plan
from cursorsync.sync.sink import history_due
from cursorsync.sync.step import StepSettings, SyncStep
from cursorsync.tables.spill import Spill, SpillError

KEYS = [PartitionKey("persistent://t/n/orders", p) for p in range(3)]
SUBS = ("billing", "audit")
CURSORS = [(k, s) for k in KEYS for s in SUBS]
MAPPING = TopicMapping(SegmentSet.of([Segment(5, 0, 7, 0, 10)]))
T0 = datetime(2026, 11, 26, tzinfo=UTC)
ROWS_EVERY = 3


@dataclass
class _Emitter:
    sent: list[tuple[str, str, str]] = field(default_factory=list)

    def apply(self, topic: str, subscription: str, safe: SafePlan, *, cumulative: bool,
              ledgers: Ledgers | None = None) -> EmitResult:
        self.sent.append((topic, subscription, str(safe.plan.to_ack)))
        return EmitResult(safe.plan.to_ack.count_entries(ledgers), None, 1)


def _source(md: int, hole: bool) -> CursorState:
    idm = RangeSet.parse("[(5:6..5:7]]") if hole and md < 6 else RangeSet()
    return CursorState(Position(5, md), idm, Ledgers.of([(5, 10)]))


def _target(md: int) -> CursorState:
    return CursorState(Position(7, md), RangeSet(), Ledgers.of([(7, 10)]))


class _Pipeline:
    """A step, its reads and sends counted; with the store in front of it or not."""

    def __init__(self, *, store: bool, spill: Spill | None = None) -> None:
        self.targets: dict[tuple[str, str], CursorState] = {}
        self.reads = 0
        self.emitter = _Emitter()
        self.step = SyncStep(StepSettings(), self.emitter, self._read)
        self.parse = Observations()
        self.store = IdleStore(spill) if store else None

    def _read(self, topic: str, subscription: str) -> CursorState:
        self.reads += 1
        return self.targets[topic, subscription]

    def run(self, rows: pa.Table, mappings: PackedMappings, batch_id: int,
            halted: set[tuple[PartitionKey, str]], *, bulk: bool | None = None,
            fail: bool = False) -> tuple[list[SyncRecord], int]:
        """A batch; ``fail``: it fails once the idle cursors are handed back, before the
        step runs."""
        self.step.halted_keys = set(halted)
        if self.store is None:
            return self.step.run(self.parse(rows), mappings).records, 0
        split = self.store.split(rows, mappings, self.step,
                                 bulk=batch_id > 0 if bulk is None else bulk,
                                 batch_id=batch_id, rows_every=ROWS_EVERY)
        obs = self.parse(split.rest)
        self.store.restore(split, obs, self.step)
        if fail:
            return [], 0
        records = self.step.run(obs, mappings).records
        self.parse.forget(self.store.keep(self.step, split.rest, obs))
        assert sum(len(v) for v in split.lags.values()) == split.repeated
        return records, split.repeated


_cursor_batch = st.fixed_dictionaries({
    "polled": st.integers(0, 5).map(lambda n: n != 0),
    "twice": st.integers(0, 9).map(lambda n: n == 0),
    "source": st.sampled_from([3, 9]),
    "hole": st.booleans(),
    "target": st.sampled_from([3, 9, 9, 9, -1]),
    "halted": st.integers(0, 7).map(lambda n: n == 0),
})
_batch = st.tuples(st.lists(_cursor_batch, min_size=len(CURSORS), max_size=len(CURSORS)),
                   st.sets(st.sampled_from(KEYS), max_size=1), st.booleans())


@settings(max_examples=100, deadline=None)
@given(st.lists(_batch, min_size=1, max_size=3 * IDLE_TARGET_READ_EVERY), st.booleans())
def test_the_store_leaves_out_only_repeats_of_idle_plans(batches: list, spilled: bool,
                                                         ) -> None:
    """With its rows and the mappings on the heap or mapped from files; new mappings
    fresh or settled."""
    spill = Spill() if spilled else None
    plain, stored = _Pipeline(store=False), _Pipeline(store=True, spill=spill)
    mappings = PackedMappings.of(dict.fromkeys(KEYS, MAPPING), spill)
    for batch_id, (cursors, moved_mappings, settle) in enumerate(batches):
        for key in moved_mappings:
            mappings.put(key, MAPPING)  # the same rows again: a new version
        if settle:
            mappings.settle(always=True)
        at = T0 + timedelta(seconds=batch_id)
        obs: list[ObservedCursor] = []
        halted = set()
        for (key, sub), c in zip(CURSORS, cursors, strict=True):
            target = _target(c["target"])
            for p in (plain, stored):
                p.targets[key.concrete_topic(), sub] = target
            if c["halted"]:
                halted.add((key, sub))
            if not c["polled"]:
                continue
            obs.append(ObservedCursor(key, sub, _source(c["source"], c["hole"]), at))
            if c["twice"]:  # an older row of the same cursor in the same batch
                obs.append(ObservedCursor(key, sub, _source(3, False), at - timedelta(
                    milliseconds=500)))
        rows = poll_rows(obs, "A")
        want, _ = plain.run(rows, mappings, batch_id, halted)
        got, repeated = stored.run(rows, mappings, batch_id, halted)
        by_key = {(r.key, r.subscription): r for r in want}
        assert len(got) + repeated == len(want)
        for r in got:
            w = by_key.pop((r.key, r.subscription))
            assert (r.plan, r.acks_sent, r.result, r.repeated) == (
                w.plan, w.acks_sent, w.result, w.repeated)
        # What the store repeated in bulk, the plain step repeated too: an idle plan,
        # nothing sent, rows not due.
        assert all(w.repeated and w.acks_sent == 0 and w.result == "emitted"
                   for w in by_key.values())
        # And its rows are not due in this batch: the sink writes all it must.
        assert not any(history_due(w.key, w.subscription, batch_id, ROWS_EVERY)
                       for w in by_key.values())
        assert stored.emitter.sent == plain.emitter.sent
        assert stored.reads == plain.reads
        assert stored.step.kept.target_reads_skipped == plain.step.kept.target_reads_skipped


def test_a_long_idle_run_is_repeated_in_bulk_but_for_target_reads_and_rows_due() -> None:
    p = _Pipeline(store=True)
    mappings = PackedMappings.of(dict.fromkeys(KEYS, MAPPING))
    for key, sub in CURSORS:
        p.targets[key.concrete_topic(), sub] = _target(9)
    repeated = []
    for batch_id in range(2 * IDLE_TARGET_READ_EVERY):
        at = T0 + timedelta(seconds=batch_id)
        rows = poll_rows([ObservedCursor(k, s, _source(9, False), at) for k, s in CURSORS])
        _, n = p.run(rows, mappings, batch_id, set())
        repeated.append(n)
    assert repeated[0] == 0 and len(p.store or []) == len(CURSORS)
    # Each cursor goes back to the step once in IDLE_TARGET_READ_EVERY batches for a read of
    # its target, and once in ROWS_EVERY for its rows: most batches repeat most in bulk.
    assert 0 < sum(repeated) < len(CURSORS) * (len(repeated) - 1)
    assert p.reads <= len(CURSORS) * 3


@pytest.mark.parametrize("spilled", [False, True])
def test_a_spilled_store_keeps_its_rows_off_arrows_heap(spilled: bool) -> None:
    """Mapped from files, the idle rows are none of Arrow's allocations; on the heap,
    they are."""
    p = _Pipeline(store=True, spill=Spill() if spilled else None)
    mappings = PackedMappings.of(dict.fromkeys(KEYS, MAPPING))
    for key, sub in CURSORS:
        p.targets[key.concrete_topic(), sub] = _target(9)
    for batch_id in range(2):
        rows = poll_rows([ObservedCursor(k, s, _source(9, False), T0) for k, s in CURSORS])
        p.run(rows, mappings, batch_id, set())
    del rows
    gc.collect()
    assert p.store is not None and len(p.store) == len(CURSORS) and p.store.nbytes > 0
    with_store = pa.total_allocated_bytes()
    p.store = None
    gc.collect()
    freed = with_store - pa.total_allocated_bytes()
    assert (freed == 0) if spilled else (freed > 0)


def test_a_keep_whose_spill_fails_leaves_the_store_as_it_was() -> None:
    """The rows it would have kept are lost to it (their cursors are planned afresh, as
    after a start), never half kept."""

    class Failing(Spill):
        fail = False

        def table(self, table: pa.Table) -> pa.Table:
            if self.fail:
                raise SpillError("no room")
            return super().table(table)

    spill = Failing()
    p = _Pipeline(store=True, spill=spill)
    mappings = PackedMappings.of(dict.fromkeys(KEYS, MAPPING))
    for key, sub in CURSORS:
        p.targets[key.concrete_topic(), sub] = _target(9)
    rows = poll_rows([ObservedCursor(k, s, _source(9, False), T0) for k, s in CURSORS[:3]])
    p.run(rows, mappings, 0, set())
    assert p.store is not None and len(p.store) == 3
    before = p.store.nbytes
    spill.fail = True
    rows = poll_rows([ObservedCursor(k, s, _source(9, False), T0) for k, s in CURSORS])
    with pytest.raises(SpillError):
        p.run(rows, mappings, 1, set(), bulk=False)
    assert len(p.store) == 3 and p.store.nbytes == before


def test_a_packed_idle_plan_reads_back_as_the_lean_plan() -> None:
    p = _Pipeline(store=False)
    p.targets[KEYS[0].concrete_topic(), "billing"] = CursorState(
        Position(7, 4), RangeSet.parse("[(7:6..7:7]]"), Ledgers.of([(7, 10)]))
    mappings = PackedMappings.of({KEYS[0]: MAPPING})
    rows = poll_rows([ObservedCursor(KEYS[0], "billing", _source(4, True), T0)])
    (record,), _ = p.run(rows, mappings, 0, set())
    assert not record.plan.to_ack and len(record.plan.individually_deleted)
    assert decode_plan(encode_plan(record.plan)) == record.plan


def _stepped_beside_plain(change: Callable[[SyncStep], None],
                          ) -> tuple[set[tuple[PartitionKey, str]], set[tuple[PartitionKey, str]],
                                     int, int]:
    """Every cursor idle after a first batch; the second batch split as it is and with
    ``change`` made to (a copy of) the step: the cursors each split hands to the step, and
    how many rows each repeats in bulk."""
    p = _Pipeline(store=True)
    mappings = PackedMappings.of(dict.fromkeys(KEYS, MAPPING))
    for key, sub in CURSORS:
        p.targets[key.concrete_topic(), sub] = _target(9)

    def poll(batch_id: int) -> pa.Table:
        at = T0 + timedelta(seconds=batch_id)
        return poll_rows([ObservedCursor(k, s, _source(9, False), at) for k, s in CURSORS])

    p.run(poll(0), mappings, 0, set())
    assert p.store is not None and len(p.store) == len(CURSORS)
    changed = copy.deepcopy(p)
    change(changed.step)
    assert changed.store is not None
    plain = p.store.split(poll(1), mappings, p.step, bulk=True, batch_id=1, rows_every=10**9)
    split = changed.store.split(poll(1), mappings, changed.step, bulk=True, batch_id=1,
                                rows_every=10**9)
    return ({(o.key, o.subscription) for o in Observations()(plain.rest)},
            {(o.key, o.subscription) for o in Observations()(split.rest)},
            plain.repeated, split.repeated)


def test_a_cursor_whose_partition_has_markers_found_goes_back_to_the_step() -> None:
    def mark(step: SyncStep) -> None:
        step.lookups.cache.markers[KEYS[0]] = RangeSet.parse("[(5:9..5:10]]")

    # The same batch, but for the markers: KEYS[0]'s cursors go back to the step.
    plain, stepped, plain_repeated, repeated = _stepped_beside_plain(mark)
    assert stepped == plain | {(KEYS[0], s) for s in SUBS}
    assert repeated == len(CURSORS) - len(stepped) < plain_repeated


def test_a_cursor_whose_batches_moved_goes_back_to_the_step() -> None:
    """The source's plugin says a cursor's partly acked batches changed: its row, the
    same as its idle row, is not repeated in bulk but handed to the step."""
    def move(step: SyncStep) -> None:
        step.batches_moved = frozenset({CURSORS[0]})

    plain, stepped, plain_repeated, repeated = _stepped_beside_plain(move)
    assert stepped == plain | {CURSORS[0]}
    assert repeated == plain_repeated - 1


def test_a_batch_that_fails_after_the_hand_back_loses_no_idle_cursor() -> None:
    """The cursors handed back stay the step's; the next batch (not following a written
    one, so nothing in bulk) decides them as a step that never had the store does."""
    plain, stored = _Pipeline(store=False), _Pipeline(store=True)
    mappings = PackedMappings.of(dict.fromkeys(KEYS, MAPPING))
    for p in (plain, stored):
        for key, sub in CURSORS:
            p.targets[key.concrete_topic(), sub] = _target(9)

    def poll(batch_id: int, md: int = 9, keys: list[PartitionKey] = KEYS) -> pa.Table:
        at = T0 + timedelta(seconds=batch_id)
        return poll_rows([ObservedCursor(k, s, _source(md if k == KEYS[1] else 9, False), at)
                          for k, s in CURSORS if k in keys])

    for b in range(4):
        plain.run(poll(b), mappings, b, set())
        stored.run(poll(b), mappings, b, set())
    # Every idle cursor goes back to the step, and the batch fails.
    stored.run(poll(4), mappings, 4, set(), bulk=False, fail=True)
    assert stored.store is not None
    for b in (4, 5, 6):
        # The batch again, without KEYS[2]'s rows this time; KEYS[1]'s source moves back
        # in batch 5: a rewind, halted by both.
        rows = poll(b, 3 if b == 5 else 9, KEYS[:2] if b == 4 else KEYS)
        want, _ = plain.run(rows, mappings, b, set(), bulk=b != 4)
        got, repeated = stored.run(rows, mappings, b, set(), bulk=b != 4)
        assert [(r.key, r.subscription, r.plan, r.result) for r in got] == [
            (r.key, r.subscription, r.plan, r.result) for r in want
            if (r.key, r.subscription) in {(g.key, g.subscription) for g in got}]
        assert len(got) + repeated == len(want)
        keys = stored.store._columns.keys.to_pylist()
        assert len(keys) == len(set(keys))
        if b == 5:
            assert {r.result for r in got if r.key == KEYS[1]} == {"halted"}
    assert stored.emitter.sent == plain.emitter.sent and stored.reads == plain.reads
