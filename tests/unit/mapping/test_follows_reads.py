"""A hole check that follows the target reads (``evidence.holes: probe``): it is given every
skipped id of a batch at once and hears how far each partition was read."""

from __future__ import annotations

from collections.abc import Mapping

from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.builder import HOLE_CHECKS_PER_BATCH, BuilderSettings, MappingBuilder
from cursorsync.mapping.skipped_ids import FollowsReads
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
