"""Entry pairs: what each evidence strategy finds, before it collapses into segments."""

from __future__ import annotations

import numpy as np
import pytest

from cursorsync.core.positions import Position
from cursorsync.errors import MappingConflictError
from cursorsync.mapping.pairs import Pairs

A = np.array


def test_pairs_of_kinds_concatenate_in_order_and_keep_each_pairs_evidence() -> None:
    stamped = Pairs.of(A([1, 1]), A([0, 1]), A([9, 9]), A([10, 11]), "position-property")
    by_digest = Pairs.of(A([1]), A([2]), A([9]), A([12]), "identity")
    both = Pairs.concat([stamped, by_digest])
    assert len(both) == 3
    assert both.target_entry.tolist() == [10, 11, 12]
    assert [str(s) for s in both.segments()] == ["1:0+3->9:10 (position-property,identity)"]
    assert both.source_ranges().contains(Position(1, 2))
    assert not both.source_ranges().contains(Position(1, 3))


def test_two_sources_for_one_target_entry_conflict_but_still_name_their_sources() -> None:
    pairs = Pairs.of(A([1, 2]), A([0, 0]), A([9, 9]), A([10, 10]), "position-property")
    with pytest.raises(MappingConflictError):
        pairs.segments()
    assert pairs.source_ranges().contains(Position(2, 0))
