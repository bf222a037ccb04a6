"""Hypothesis strategies for the pure core: random two-cluster histories with ground truth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import strategies as st

from cursorsync.core.anchors import Anchors
from cursorsync.core.cursor import AckPlan, CursorState, fold
from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import Runs, SegmentSet, TopicMapping
from cursorsync.core.translate import translate


@dataclass
class World:
    source_ledgers: Ledgers
    target_ledgers: Ledgers
    origin: dict[Position, Position]         # every replicated target entry -> its source entry
    skippable: set[Position]
    foreign: set[Position]
    unreplicated: set[Position]
    mapping: TopicMapping                     # what evidence we have (maybe partial)
    source: CursorState
    target: CursorState


def _sparse_ids(draw: st.DrawFn, n: int) -> list[int]:
    start = draw(st.integers(0, 2**40))
    gaps = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    return [start + sum(gaps[: i + 1]) for i in range(n)]


def acked_state(md: Position, acked: set[Position], ledgers: Ledgers) -> CursorState:
    rows = [(p.ledger, p.entry - 1, p.ledger, p.entry) for p in sorted(acked)]
    ranges = RangeSet(np.array(rows, dtype=np.int64).reshape(-1, 4))
    new_md, rest = fold(md, ranges, ledgers)
    return CursorState(new_md, rest, ledgers)


@st.composite
def worlds(draw: st.DrawFn, *, max_entries: int = 60) -> World:
    n_src_ledgers = draw(st.integers(1, 4))
    src_ids = _sparse_ids(draw, n_src_ledgers)
    src_counts = draw(st.lists(st.integers(0, max_entries // n_src_ledgers),
                               min_size=n_src_ledgers, max_size=n_src_ledgers))
    source_ledgers = Ledgers.of(zip(src_ids, src_counts, strict=True))
    src_entries = [Position(lg, e) for lg, n in zip(src_ids, src_counts, strict=True)
                   for e in range(n)]

    # The target stream: replicated entries in order, with markers and foreign entries between.
    # The replicator may start again (a source broker crash) a few entries back and send
    # copies of entries the target holds already.
    p_repl = draw(st.sampled_from([1.0, 0.9, 0.6]))
    p_marker = draw(st.sampled_from([0.0, 0.1, 0.3]))
    p_foreign = draw(st.sampled_from([0.0, 0.1]))
    p_restart = draw(st.sampled_from([0.0, 0.0, 0.05, 0.2]))
    stream: list[tuple[str, Position | None]] = []
    unreplicated: set[Position] = set()
    sent: dict[int, bool] = {}  # per source index: replicated as data, or never
    i, restarts = 0, 0
    while i < len(src_entries):
        p = src_entries[i]
        while draw(st.floats(0, 1)) < p_marker:
            stream.append(("skip", None))
        if draw(st.floats(0, 1)) < p_foreign:
            stream.append(("foreign", None))
        if i not in sent:
            sent[i] = draw(st.floats(0, 1)) < p_repl
        if sent[i]:
            stream.append(("repl", p))
        else:
            unreplicated.add(p)
        i += 1
        if restarts < 2 and draw(st.floats(0, 1)) < p_restart:
            i = draw(st.integers(max(0, i - 8), i))
            restarts += 1
    if draw(st.booleans()):
        stream.append(("skip", None))
    # Roll target ledgers at random sizes (empty ledgers allowed).
    tgt_counts: list[int] = []
    left = len(stream)
    while left > 0 or not tgt_counts:
        c = min(left, draw(st.integers(0, max(1, max_entries // 2))))
        tgt_counts.append(c)
        left -= c
    tgt_ids = _sparse_ids(draw, len(tgt_counts))
    target_ledgers = Ledgers.of(zip(tgt_ids, tgt_counts, strict=True))
    tgt_positions = [Position(lg, e) for lg, n in zip(tgt_ids, tgt_counts, strict=True)
                     for e in range(n)]
    origin: dict[Position, Position] = {}
    skippable: set[Position] = set()
    foreign: set[Position] = set()
    for (kind, src), tp in zip(stream, tgt_positions, strict=True):
        if kind == "repl":
            assert src is not None
            origin[tp] = src
        elif kind == "skip":
            skippable.add(tp)
        else:
            foreign.add(tp)

    # Evidence: a random subset of the true pairs (missing / partial evidence).
    keep_p = draw(st.sampled_from([1.0, 1.0, 0.8, 0.4, 0.0]))
    kept = [(s, t) for t, s in sorted(origin.items()) if draw(st.floats(0, 1)) < keep_p]
    segs = SegmentSet.from_pairs(
        np.array([s.ledger for s, _ in kept], np.int64),
        np.array([s.entry for s, _ in kept], np.int64),
        np.array([t.ledger for _, t in kept], np.int64),
        np.array([t.entry for _, t in kept], np.int64))
    know_skips = draw(st.booleans())

    def runs(ps: set[Position]) -> Runs:
        return Runs.from_positions(np.array([p.ledger for p in ps], np.int64),
                                   np.array([p.entry for p in ps], np.int64))

    # Known copies without a pair (identity said "from the source", not which entry), and
    # snapshot anchors: a target position T and a source position S after the sources of
    # every copy at or before T, as the brokers' snapshots make them.
    paired = {t for _, t in kept}
    unpaired = {t for t in origin if t not in paired and draw(st.booleans())}
    anchors = []
    for _ in range(draw(st.integers(0, 3)) if tgt_positions and src_entries else 0):
        j = draw(st.integers(0, len(tgt_positions) - 1))
        t_pos = tgt_positions[j]
        before = [origin[t] for t in tgt_positions[:j + 1] if t in origin]
        later = [q for q in src_entries if not before or q > max(before)]
        if later:
            anchors.append((draw(st.sampled_from(later)), t_pos))
    mapping = TopicMapping(segs, runs(skippable) if know_skips else Runs(), runs(foreign),
                           runs(unreplicated), unpaired=runs(unpaired),
                           anchors=Anchors.of(*anchors))

    # Source cursor: a random acked subset (markers/unreplicated acked more often).
    p_ack = draw(st.sampled_from([0.2, 0.5, 0.9, 1.0]))
    src_acked = {p for p in src_entries if draw(st.floats(0, 1)) < p_ack}
    md0 = Position(src_ids[0], -1)
    source = acked_state(md0, src_acked, source_ledgers)

    # Target cursor: fresh, or an earlier safe sync (a subset), plus consumer acks of foreign.
    tgt_acked: set[Position] = set()
    if draw(st.booleans()):
        earlier = {p for p in src_acked if draw(st.booleans())}
        tgt_acked |= {t for t, s in origin.items() if s in earlier and draw(st.booleans())}
    tgt_acked |= {p for p in foreign if draw(st.floats(0, 1)) < 0.5}
    target = acked_state(Position(tgt_ids[0], -1), tgt_acked, target_ledgers)
    return World(source_ledgers, target_ledgers, origin, skippable, foreign, unreplicated,
                 mapping, source, target)


# ---------------------------------------------------------------- guard cases


@dataclass
class GuardCase:
    """A plan for the guard over a world's mapping and cursors, drawn apart from translate."""

    world: World
    source: CursorState
    mapping: TopicMapping
    #: The target cursor as the guard sees it: its ledger list may be a stale snapshot.
    target: CursorState
    #: Every target entry that exists (the stale list's open ledger may hold more).
    universe: Ledgers
    plan: AckPlan
    kind: str


def _entry_ranges(entries: list[Position]) -> RangeSet:
    rows = [(p.ledger, p.entry - 1, p.ledger, p.entry) for p in entries]
    return RangeSet(np.array(rows, dtype=np.int64).reshape(-1, 4))


@st.composite
def guard_cases(draw: st.DrawFn, *, max_entries: int = 40) -> GuardCase:
    """A world, then a plan: random to_ack sets and markDeletePositions (many of them
    wrong), translate's plan, or translate's plan perturbed by an entry or a position.
    Half the time the target's ledger list shows fewer entries of its open ledger than
    exist; some cases relabel the ledger ids too far apart for based keys."""
    w = draw(worlds(max_entries=max_entries))
    full = w.target_ledgers
    seen = full
    if full.entries[-1] > 0 and draw(st.booleans()):
        counts = full.entries.copy()
        counts[-1] -= draw(st.integers(1, int(counts[-1])))
        seen = Ledgers(full.ids.copy(), counts)
    target = CursorState(w.target.mark_delete, w.target.individually_deleted, seen)
    universe = [Position(int(lg), e) for lg, n in zip(full.ids.tolist(), full.entries.tolist(),
                                                      strict=True) for e in range(n)]
    rnd = draw(st.randoms(use_true_random=False))
    starts = [Position(int(lg), -1) for lg in full.ids.tolist()]

    def some_position() -> Position:
        return rnd.choice([target.mark_delete, *starts, *universe])

    kind = draw(st.sampled_from(["random", "random", "translated", "perturbed", "perturbed"]))
    honest = translate(w.source, w.mapping, target)
    if kind == "random":
        share = rnd.choice([0.05, 0.3, 0.8])
        to_ack = _entry_ranges([p for p in universe if rnd.random() < share])
        md = some_position() if rnd.random() < 0.7 else target.mark_delete
        plan = replace(honest, mark_delete=md, to_ack=to_ack)
    elif kind == "translated":
        plan = honest
    else:
        how = rnd.choice(["entry", "md", "next", "window", "alone"])
        plan = honest
        if how == "alone" and universe:
            # One entry by itself, mapped where any is: a check that is wrong for one entry
            # cannot hide behind the others the plan holds.
            mapped = [Position(s.target_ledger, s.target_entry + k)
                      for s in w.mapping.segments for k in range(s.count)]
            plan = replace(plan, mark_delete=target.mark_delete,
                           to_ack=_entry_ranges([rnd.choice(mapped or universe)]))
        elif how == "entry" and universe:
            plan = replace(plan, to_ack=plan.to_ack | _entry_ranges([rnd.choice(universe)]))
        elif how == "md":
            plan = replace(plan, mark_delete=some_position())
        elif how == "next":
            later = [p for p in universe if p > plan.mark_delete]
            if later:
                plan = replace(plan, mark_delete=later[0])
        elif universe:
            i = rnd.randrange(len(universe))
            plan = replace(plan, to_ack=plan.to_ack | _entry_ranges(universe[i:i + 4]))
    case = GuardCase(w, w.source, w.mapping, target, full, plan, kind)
    layout = draw(st.sampled_from(["as drawn"] * 3 + list(LAYOUTS)))
    return case if layout == "as drawn" else relabelled(case, layout)


#: Order-keeping ledger relabellings (ledger -1 stays), from a side's lowest ledger id:
#: ids across a boundary between key bases, and ids too wide for based keys.
LAYOUTS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "across bases": lambda ids, low: np.where(ids == -1, -1, ids - low + 2**30 - 2),
    "too wide": lambda ids, low: np.where(ids == -1, -1, (ids - low) * 2**31 + 7),
}


def relabelled(case: GuardCase, layout: str) -> GuardCase:
    """The same case with its ledger ids relabelled (:data:`LAYOUTS`), order kept."""
    s_low = int(case.world.source_ledgers.ids[0])
    t_low = int(case.universe.ids[0])

    def fs(ids: np.ndarray) -> np.ndarray:
        return LAYOUTS[layout](ids, s_low)

    def ft(ids: np.ndarray) -> np.ndarray:
        return LAYOUTS[layout](ids, t_low)

    def pos(p: Position, f: Callable[[np.ndarray], np.ndarray]) -> Position:
        return Position(int(f(np.array([p.ledger]))[0]), p.entry)

    def ranges(rs: RangeSet, f: Callable[[np.ndarray], np.ndarray]) -> RangeSet:
        b = rs.bounds.copy()
        b[:, 0], b[:, 2] = f(b[:, 0]), f(b[:, 2])
        return RangeSet(b)

    def ledgers(lg: Ledgers | None, f: Callable[[np.ndarray], np.ndarray]) -> Ledgers | None:
        return None if lg is None else Ledgers(f(lg.ids), lg.entries.copy())

    def cursor(c: CursorState, f: Callable[[np.ndarray], np.ndarray]) -> CursorState:
        return CursorState(pos(c.mark_delete, f), ranges(c.individually_deleted, f),
                           ledgers(c.ledgers, f))

    def runs(r: Runs, f: Callable[[np.ndarray], np.ndarray]) -> Runs:
        rows = r.rows.copy()
        rows[:, 0] = f(rows[:, 0])
        return Runs(rows)

    m = case.mapping
    seg = m.segments.rows.copy()
    seg[:, 0], seg[:, 2] = fs(seg[:, 0]), ft(seg[:, 2])
    anchors = m.anchors.rows.copy()
    anchors[:, 0], anchors[:, 2] = fs(anchors[:, 0]), ft(anchors[:, 2])
    mapping = TopicMapping(SegmentSet(seg, m.segments.evidence_codes), runs(m.skippable, ft),
                           runs(m.foreign, ft), runs(m.unreplicated, fs),
                           unpaired=runs(m.unpaired, ft), anchors=Anchors(anchors))
    p = case.plan
    plan = replace(p, mark_delete=pos(p.mark_delete, ft),
                   individually_deleted=ranges(p.individually_deleted, ft),
                   to_ack=ranges(p.to_ack, ft),
                   previous_mark_delete=pos(p.previous_mark_delete, ft))
    universe = ledgers(case.universe, ft)
    assert universe is not None
    return GuardCase(case.world, cursor(case.source, fs), mapping, cursor(case.target, ft),
                     universe, plan, f"{case.kind}, {layout}")
