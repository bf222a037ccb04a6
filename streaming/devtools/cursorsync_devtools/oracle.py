"""The per-entry reference translator: obviously right, hopelessly slow.

It walks every entry of both topics one by one, with sets and dicts, and
answers the same question as :func:`cursorsync.core.translate.translate`. Property
tests compare the two on random inputs; the benchmark uses it as the baseline.
It needs the full ledger lists of both sides, since it enumerates entries.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from cursorsync.core.ledgers import Ledgers
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.segments import TopicMapping


@dataclass(frozen=True)
class OraclePlan:
    mark_delete: Position
    acked_after: frozenset[Position]
    to_ack: frozenset[Position]
    unmapped_acked_entries: int


def entries_of(ledgers: Ledgers) -> list[Position]:
    return [Position(int(lid), e) for lid, n in zip(ledgers.ids.tolist(),
                                                    ledgers.entries.tolist(), strict=True)
            for e in range(int(n))]


def _acked(mark_delete: Position, ranges: RangeSet, universe: list[Position]) -> set[Position]:
    """Entry by entry: those at or before the markDeletePosition, then each range's entries."""
    out = {p for p in universe if p <= mark_delete}
    for lo, hi in ranges:
        for i in range(bisect_right(universe, lo), bisect_right(universe, hi)):
            out.add(universe[i])
    return out


def oracle_translate(
    source_md: Position,
    source_ranges: RangeSet,
    source_ledgers: Ledgers,
    mapping: TopicMapping,
    target_md: Position,
    target_ranges: RangeSet,
    target_ledgers: Ledgers,
) -> OraclePlan:
    """Per entry: map acked source entries, ack skippables after acked entries, fold."""
    src_universe = entries_of(source_ledgers)
    tgt_universe = entries_of(target_ledgers)
    src_acked = _acked(source_md, source_ranges, src_universe)
    current = _acked(target_md, target_ranges, tgt_universe)

    # Target entry -> its source entry; a source entry may have several copies.
    back: dict[Position, Position] = {}
    for seg in mapping.segments:
        for k in range(seg.count):
            back[Position(seg.target_ledger, seg.target_entry + k)] = Position(
                seg.source_ledger, seg.source_entry + k)
    mapped_sources = set(back.values())
    skippable = {Position(int(lg), int(e) + k) for lg, e, n in mapping.skippable.rows.tolist()
                 for k in range(int(n))}
    unreplicated = {Position(int(lg), int(e) + k) for lg, e, n in mapping.unreplicated.rows.tolist()
                    for k in range(int(n))}

    after = set(current)
    after |= {t for t, s in back.items() if s in src_acked}
    # Snapshot anchors: once the source's markDeletePosition is at or past S, each known
    # copy (unpaired) at or before T is acked.
    licensed = [t for s, t in mapping.anchors if s <= source_md]
    if licensed:
        top = max(licensed)
        after |= {Position(int(lg), int(e) + k) for lg, e, n in mapping.unpaired.rows.tolist()
                  for k in range(int(n)) if Position(int(lg), int(e) + k) <= top}
    # Skippable closure in target order: acked when the entry before it is acked.
    changed = True
    while changed:
        changed = False
        prev_acked = bool(tgt_universe) and target_md >= Position(tgt_universe[0].ledger, -1)
        for p in tgt_universe:
            if p in skippable and p not in after and prev_acked:
                after.add(p)
                changed = True
            prev_acked = p in after

    md = target_md
    for p in tgt_universe:
        if p not in after:
            break
        md = max(md, p)

    unmapped = 0
    if back:
        first = min(mapped_sources)
        first_target = min(back)
        foreign = {Position(int(lg), int(e) + k) for lg, e, n in mapping.foreign.rows.tolist()
                   for k in range(int(n))}
        # Before the first segment, acks wait for evidence unless every target entry before
        # the first mapped one is a skippable or foreign entry (replication starts there).
        starts_mapped = all(q in skippable or q in foreign
                            for q in tgt_universe if q < first_target)
        implied = implied_unreplicated(back, skippable, tgt_universe)
        unmapped = sum(1 for p in src_acked
                       if (p >= first or not starts_mapped) and p not in mapped_sources
                       and p not in unreplicated and not implied(p))
    return OraclePlan(md, frozenset(after), frozenset(after - current), unmapped)


def implied_unreplicated(back: dict[Position, Position], skippable: set[Position],
                         tgt_universe: list[Position]) -> Callable[[Position], bool]:
    """Per entry: whether a source position lies strictly between the sources s1 < s2 of
    two mapped target entries t1 < t2 that are next to each other among mapped target
    entries and have only skippable entries between them: the listed entries between
    them, when both exist, or every entry id between them, when they share a ledger."""
    index = {p: i for i, p in enumerate(tgt_universe)}
    quiet: list[tuple[Position, Position]] = []  # (s1, s2) of each qualifying pair
    for t1, t2 in pairwise(sorted(back)):
        s1, s2 = back[t1], back[t2]
        listed = t1 in index and t2 in index and all(
            p in skippable for p in tgt_universe[index[t1] + 1:index[t2]])
        one_ledger = t1.ledger == t2.ledger and all(
            Position(t1.ledger, e) in skippable for e in range(t1.entry + 1, t2.entry))
        if s1 < s2 and (listed or one_ledger):
            quiet.append((s1, s2))

    def between(p: Position) -> bool:
        return any(s1 < p < s2 for s1, s2 in quiet)

    return between
