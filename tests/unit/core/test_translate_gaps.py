"""Gap judgements (:func:`implied_unreplicated`, :func:`marker_bridged`) on Python ints for
a partition's few segments: the same answers as on arrays, on every random world."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cursorsync.core import translate as tr
from cursorsync.core.ledgers import Ledgers
from tests.support.core_strategies import World, worlds

SETTINGS = settings(max_examples=int(os.environ.get("CURSORSYNC_EXAMPLES", "200")) * 2,
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def _lists(w: World, deleted: int, listed: bool) -> Ledgers | None:
    """The target's ledger list with its first ``deleted`` ledgers gone, or none at all."""
    ids, counts = w.target_ledgers.ids, w.target_ledgers.entries
    if not listed or len(ids) <= deleted:
        return None
    return Ledgers.of(zip(ids[deleted:].tolist(), counts[deleted:].tolist(), strict=True))


@SETTINGS
@given(worlds(), st.integers(0, 2), st.booleans(), st.integers(-1, 8))
def test_few_segments_are_judged_as_on_arrays(monkeypatch: pytest.MonkeyPatch, w: World,
                                              deleted: int, listed: bool, before: int) -> None:
    ledgers = _lists(w, deleted, listed)
    first = int(w.target_ledgers.ids[0]) if len(w.target_ledgers.ids) else 0
    pairs = tr._target_pairs(w.mapping)
    assert pairs is None or tr._few(pairs, w.mapping)  # the worlds are small
    few = (tr.implied_unreplicated(w.mapping, ledgers),
           tr.marker_bridged(w.mapping, first + before))
    with monkeypatch.context() as m:
        m.setattr(tr, "_FEW_PAIRS", -1)
        arrays = (tr.implied_unreplicated(w.mapping, ledgers),
                  tr.marker_bridged(w.mapping, first + before))
    assert few == arrays
