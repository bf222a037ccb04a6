"""A hole check that follows the target reads (``evidence.holes: probe``): it is given every
skipped id of a batch at once and hears how far each partition was read."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.builder import HOLE_CHECKS_PER_BATCH, BuilderSettings, MappingBuilder
from cursorsync.mapping.skipped_ids import Defers, FollowsReads
from tests.unit.mapping.test_hole_check import KEY, target_rows


class Following:
    """Claims every even id; records what it was asked and told."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.read: list[dict[PartitionKey, Position]] = []

    def __call__(self, candidates: Mapping[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        ids = [(lg, e) for runs in candidates.values() for lg, first, n in runs.rows.tolist()
               for e in range(first, first + n)]
        self.asked.append(len(ids))
        even = [(lg, e) for lg, e in ids if e % 2 == 0]
        return {KEY: Runs.from_positions([lg for lg, _ in even], [e for _, e in even])}

    def read_to(self, positions: Mapping[PartitionKey, Position]) -> None:
        self.read.append(dict(positions))


def test_every_skipped_id_is_asked_at_once_and_the_reads_reported() -> None:
    check = Following()
    assert isinstance(check, FollowsReads)
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    gap = 3 * HOLE_CHECKS_PER_BATCH
    outcome = b.process(target_rows([0, gap + 1]))
    # A per-id check gets HOLE_CHECKS_PER_BATCH ids a batch; this one all of them.
    assert check.asked == [gap] and not outcome.skipped_waiting
    assert outcome.skipped_claimed == gap // 2  # the even ids among 1..gap
    assert check.read == [{KEY: Position(5, gap + 1)}]
    b.process(target_rows([gap + 2]))
    assert check.read[-1] == {KEY: Position(5, gap + 2)}


class Behind(Following):
    """Leaves every candidate for a later batch the first ``behind`` times it is called
    (its probe has not got past them), then claims the even ids."""

    def __init__(self, behind: int) -> None:
        super().__init__()
        self.behind, self._deferred = behind, set[PartitionKey]()

    def __call__(self, candidates: Mapping[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        if self.behind:
            self.behind -= 1
            self.asked.append(sum(r.entry_count() for r in candidates.values()))
            self._deferred = set(candidates)
            return {}
        return super().__call__(candidates)

    def drain_deferred(self) -> set[PartitionKey]:
        found, self._deferred = self._deferred, set()
        return found


def test_candidates_left_for_a_later_batch_are_asked_again_first_and_hold_the_probe() -> None:
    """Ids a check leaves undecided are neither claimed nor counted as checked: they wait in
    the partition's state (shown as waiting), the probe is not released past them, and the
    next batch asks them again, before its own."""
    check = Behind(behind=1)
    assert isinstance(check, Defers)
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    first = b.process(target_rows([0, 5]))  # 1..4 skipped
    assert check.asked == [4]
    assert first.skipped_waiting == {KEY: 4} and first.skipped_claimed == 0
    assert first.skipped_ids == 0
    assert check.read == [{KEY: Position(5, 0)}]  # just before 5:1, the first waiting id
    second = b.process(target_rows([7]))  # 6 skipped
    assert check.asked == [4, 5] and not second.skipped_waiting
    assert second.skipped_claimed == 3  # 2, 4, 6
    assert second.skipped_ids == 5
    assert check.read[-1] == {KEY: Position(5, 7)}


def test_a_check_cannot_defer_what_it_was_not_asked() -> None:
    check = Behind(behind=0)
    check._deferred = {PartitionKey("persistent://public/default/other", -1)}
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    with pytest.raises(ValueError, match="deferred partitions"):
        b.process(target_rows([0, 2]))
