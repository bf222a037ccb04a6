"""Idle cursors are kept packed: a packed cursor state unpacks to the same state, and a
packed plan is the same plan."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core_strategies import World, worlds
from cursorsync.core.cursor import CursorState
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.translate import translate
from cursorsync.sync.plans import lean, pack, pack_plan, same, unpack_plan


def unpack(data: bytes) -> CursorState:
    """:func:`pack`'s bytes read back: the layout is self-delimiting, so a state that
    reads back from its bytes is the only state with them."""
    a = np.frombuffer(data, np.int64)
    md_l, md_e, ranges, n = (int(x) for x in a[:4])
    individually = RangeSet(a[4:4 + 4 * ranges].reshape(-1, 4).copy())
    if n < 0:
        return CursorState(Position(md_l, md_e), individually, None)
    rest = a[4 + 4 * ranges:]
    return CursorState(Position(md_l, md_e), individually,
                       Ledgers(rest[:n].copy(), rest[n:].copy()))


@settings(max_examples=300, deadline=None)
@given(worlds(), st.booleans())
def test_a_packed_cursor_state_unpacks_to_the_same_state(w: World, with_ledgers: bool) -> None:
    """So equal bytes are equal states: an idle cursor compares its target reads packed."""
    for state in (w.source, w.target):
        if not with_ledgers:
            state = replace(state, ledgers=None)
        back = unpack(pack(state))
        assert same(back, state)
        assert back.mark_delete == state.mark_delete
        assert back.individually_deleted == state.individually_deleted
        assert (back.ledgers is None) == (state.ledgers is None)
        assert pack(back) == pack(state)


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_packed_plan_is_the_same_plan(w: World) -> None:
    plan = translate(w.source, w.mapping, w.target)
    assert lean(plan) == plan
    # A plan with nothing to ack (an idle cursor's) kept as bytes in a column.
    quiet = replace(plan, to_ack=RangeSet())
    assert unpack_plan(pack_plan(quiet)) == lean(quiet)


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_a_state_that_forgets_what_it_derived_plans_the_same(w: World) -> None:
    """An idle cursor's source state drops its derived arrays: made again, they give the
    same plan."""
    plan = translate(w.source, w.mapping, w.target)
    w.source.forget()
    w.target.forget()
    assert w.source._acked is None
    assert translate(w.source, w.mapping, w.target) == plan


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_cursor_states_compare_by_value_ledger_lists_included(w: World) -> None:
    """Two states with equal values are equal whatever objects hold their ledger lists."""
    for state in (w.source, w.target):
        back = unpack(pack(state))
        assert back == state and state == back
        assert (back != state) is False
        if state.ledgers is not None and len(state.ledgers.ids):
            fewer = replace(state, ledgers=Ledgers(state.ledgers.ids[:-1].copy(),
                                                   state.ledgers.entries[:-1].copy()))
            assert fewer != state and not same(fewer, state)
