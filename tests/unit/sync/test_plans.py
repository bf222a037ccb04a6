"""Idle cursors are kept packed: a packed cursor state unpacks to the same state, and a
packed plan is the same plan."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync.core.cursor import AckPlan, CursorState, Outcome
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.core.translate import translate
from cursorsync.sync.plans import (
    compact_plan,
    decode_plan,
    encode_plan,
    encode_state,
    stable_hash,
    states_equal,
)
from tests.support.core_strategies import World, worlds


def decode_state(data: bytes) -> CursorState:
    """:func:`encode_state`'s bytes read back: the layout is self-delimiting, so a state that
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
        back = decode_state(encode_state(state))
        assert states_equal(back, state)
        assert back.mark_delete == state.mark_delete
        assert back.individually_deleted == state.individually_deleted
        assert (back.ledgers is None) == (state.ledgers is None)
        assert encode_state(back) == encode_state(state)


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_packed_plan_is_the_same_plan(w: World) -> None:
    plan = translate(w.source, w.mapping, w.target)
    assert compact_plan(plan) == plan
    # A plan with nothing to ack (an idle cursor's) kept as bytes in a column.
    quiet = replace(plan, to_ack=RangeSet())
    assert decode_plan(encode_plan(quiet)) == compact_plan(quiet)


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
        back = decode_state(encode_state(state))
        assert back == state and state == back
        assert (back != state) is False
        if state.ledgers is not None and len(state.ledgers.ids):
            fewer = replace(state, ledgers=Ledgers(state.ledgers.ids[:-1].copy(),
                                                   state.ledgers.entries[:-1].copy()))
            assert fewer != state and not states_equal(fewer, state)


def test_the_bytes_keep_their_format() -> None:
    """Idle cursors' targets and plans are kept as these bytes between batches, and the
    rows' spread over batches by this number: the same, byte for byte, as they were made
    with plain strings for the outcomes (before :class:`Outcome` was an enum)."""
    state = CursorState(Position(7, 3), RangeSet.parse("[(7:5..7:9],(8:0..8:2]]"),
                        Ledgers.of([(7, 10), (8, 4)]))
    assert encode_state(state).hex() == (
        "07000000000000000300000000000000020000000000000002000000000000000700000000000000"
        "05000000000000000700000000000000090000000000000008000000000000000000000000000000"
        "08000000000000000200000000000000070000000000000008000000000000000a00000000000000"
        "0400000000000000")
    assert encode_state(CursorState(Position(7, 3))).hex() == (
        "070000000000000003000000000000000000000000000000ffffffffffffffff")
    for index, outcome in enumerate((Outcome.EXACT, Outcome.PARTIAL, Outcome.UNKNOWN)):
        plan = AckPlan(Position(8, 2), RangeSet.parse("[(9:1..9:4]]"), RangeSet(),
                       Position(7, 3), 1, 2, 3, 4, outcome)
        assert encode_plan(plan).hex() == (
            "0800000000000000020000000000000007000000000000000300000000000000010000000000"
            f"00000200000000000000030000000000000004000000000000000{index}09000000000000"
            "00010000000000000009000000000000000400000000000000")
        assert decode_plan(encode_plan(plan)) == plan
        assert decode_plan(encode_plan(replace(plan, outcome=outcome.value))) == plan
    assert stable_hash((PartitionKey("persistent://t/n/x", 3), "sub")) == 2400728021
