"""The mapping builder on synthetic entry batches: both evidence kinds, holes, replay state."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest

from cursorsync.core.anchors import Anchors
from cursorsync.core.positions import Position
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.builder import AnchorFindings, BuilderSettings, MappingBuilder
from cursorsync.mapping.builder_state import read_state, write_state

P = Position.parse
KEY = PartitionKey("persistent://public/default/t", -1)


def digest(x: str) -> bytes:
    return hashlib.blake2b(x.encode(), digest_size=16).digest()


def rows(items: list[tuple[str, int, int, str | None, str | None]]) -> pa.Table:
    """(cluster, ledger, entry, source_position, identity key), one message per entry."""
    return pa.table({
        "cluster": [i[0] for i in items],
        "topic": [KEY.topic] * len(items),
        "partition": pa.array([KEY.partition] * len(items), pa.int32()),
        "ledger": pa.array([i[1] for i in items], pa.int64()),
        "entry": pa.array([i[2] for i in items], pa.int64()),
        "batch_index": pa.array([-1] * len(items), pa.int32()),
        "source_position": pa.array([i[3] for i in items], pa.string()),
        "entry_identity": pa.array([None if i[4] is None else digest(i[4]) for i in items],
                                   pa.binary()),
    })


def test_property_evidence_runs_holes_and_foreign() -> None:
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)))
    out = b.process(rows([
        ("B", 9, 0, "1:0", "m0"), ("B", 9, 1, "1:1", "m1"),
        # 9:2 never returned by the reader: a marker
        ("B", 9, 3, "1:2", "m2"), ("B", 9, 4, None, "foreign"), ("B", 9, 5, "1:3", "m3"),
    ]))
    m = out.mappings[KEY]
    assert [str(s) for s in m.segments] == [
        "1:0+2->9:0 (position-property)", "1:2+1->9:3 (position-property)",
        "1:3+1->9:5 (position-property)"]
    assert m.skippable.rows.tolist() == [[9, 2, 1]]
    assert m.foreign.rows.tolist() == [[9, 4, 1]]
    # The next batch continues the stream: holes after the previous batch's last entry.
    out2 = b.process(rows([("B", 9, 8, "1:4", "m4")]))
    assert out2.mappings[KEY].skippable.rows.tolist() == [[9, 6, 2]]
    assert b.known[KEY].lookup(P("1:4")) == P("9:8")


def test_stamps_parse_as_position_parse_does_and_a_malformed_one_stops_the_batch() -> None:
    """The stamps are parsed column-wise; other spellings fall back to Position.parse."""
    from cursorsync.errors import PositionFormatError

    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)))
    out = b.process(rows([("B", 9, 0, "1:0", None), ("B", 9, 1, " 1 : 1 ", None),
                          ("B", 9, 2, "2:7", None), ("B", 9, 3, "999999999999999999:0", None)]))
    assert [str(s) for s in out.mappings[KEY].segments] == [
        "1:0+2->9:0 (position-property)", "2:7+1->9:2 (position-property)",
        "999999999999999999:0+1->9:3 (position-property)"]
    for bad, error in (("1:x", PositionFormatError), ("99999999999999999999:0", ValueError)):
        with pytest.raises(error, match=bad):
            MappingBuilder(BuilderSettings("A", "B", ("position-property",))).process(
                rows([("B", 9, 0, "1:0", None), ("B", 9, 1, bad, None)]))


def test_only_the_target_s_stamps_are_read() -> None:
    """The property maps a target entry to its source id; a source entry carrying one
    (replicated there from a third cluster) is not read for it, even malformed."""
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)))
    out = b.process(rows([("A", 1, 0, "x:y", None), ("B", 9, 0, "1:0", None)]))
    assert [str(s) for s in out.mappings[KEY].segments] == ["1:0+1->9:0 (position-property)"]


def test_identity_evidence_pairs_and_never_guesses() -> None:
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property", "identity")))
    out = b.process(rows([
        ("A", 1, 0, None, "a"), ("A", 1, 1, None, "dup"), ("A", 1, 2, None, "dup"),
        ("A", 1, 3, None, "c"),
        ("B", 7, 0, None, "x-foreign"), ("B", 7, 1, None, "a"), ("B", 7, 2, None, "dup"),
        ("B", 7, 3, None, "dup"), ("B", 7, 4, None, "c"),
    ]))
    segs = out.mappings[KEY].segments
    assert [str(s) for s in segs] == ["1:0+1->7:1 (identity)", "1:3+1->7:4 (identity)"]
    # Ambiguous and unmatched entries before the last pair are given up: never acked.
    assert out.given_up_target == 3  # 7:0, 7:2, 7:3
    assert out.given_up_source == 2
    assert out.mappings[KEY].foreign.rows.tolist() == [[7, 0, 1], [7, 2, 2]]


def test_entries_without_a_digest_are_out_of_identity_scope() -> None:
    """identity_scope batched: an unstamped target entry without a digest cannot be
    matched (foreign, never acked); a source row without one is not waited for."""
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property", "identity")))
    out = b.process(rows([
        ("A", 1, 0, None, None), ("A", 1, 1, None, "batch"), ("A", 1, 2, None, None),
        ("B", 7, 0, "1:0", None), ("B", 7, 1, None, "batch"), ("B", 7, 2, None, None),
    ]))
    m = out.mappings[KEY]
    # Adjacent runs join whatever evidence produced them; the kinds are the segment's summary.
    assert [str(s) for s in m.segments] == ["1:0+2->7:0 (position-property,identity)"]
    assert m.foreign.rows.tolist() == [[7, 2, 1]]
    assert out.given_up_target == 1
    assert b.state().column("source_ledger").to_pylist() == [[]]


def test_identity_waits_for_the_other_side_across_batches() -> None:
    b = MappingBuilder(BuilderSettings("A", "B", ("identity",)))
    first = b.process(rows([("B", 7, 0, None, "a"), ("B", 7, 1, None, "b")]))
    assert KEY not in first.mappings or not len(first.mappings[KEY].segments)
    out = b.process(rows([("A", 1, 5, None, "a"), ("A", 1, 6, None, "b")]))
    assert [str(s) for s in out.mappings[KEY].segments] == ["1:5+2->7:0 (identity)"]


def test_state_round_trips_through_its_file_for_replay(tmp_path: Path) -> None:
    cfg = BuilderSettings("A", "B", ("identity",))
    b = MappingBuilder(cfg)
    b.process(rows([("B", 7, 0, None, "a"), ("B", 7, 3, None, "b")]))
    write_state(tmp_path / "state", b.state())
    saved = read_state(tmp_path / "state")
    batch = rows([("A", 1, 5, None, "a"), ("A", 1, 6, None, "b"), ("B", 7, 4, None, "z")])
    first = b.process(batch)
    replay = MappingBuilder(cfg, saved).process(batch)
    assert first.mappings[KEY] == replay.mappings[KEY]
    assert first.given_up_target == 0 and len(first.mappings[KEY].segments) == 2


def test_a_copy_sent_again_is_mapped_and_conflicting_evidence_is_dropped_not_guessed() -> None:
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)))
    b.process(rows([("B", 9, 0, "1:0", "m0"), ("B", 9, 1, "1:1", "m1")]))
    out = b.process(rows([("B", 9, 2, "1:0", "m0")]))  # the replicator sent 1:0 again
    assert out.conflicts == 0
    assert b.known[KEY].segments.copies(P("1:0")) == [P("9:0"), P("9:2")]
    out = b.process(rows([("B", 9, 1, "1:7", "m7")]))  # a second source for 9:1
    assert out.conflicts == 1
    assert b.known[KEY].lookup(P("1:1")) == P("9:1") and b.known[KEY].lookup(P("1:7")) is None


def test_window_ages_out_unmatched_entries() -> None:
    b = MappingBuilder(BuilderSettings("A", "B", ("identity",), alignment_window=2))
    out = b.process(rows([("B", 7, i, None, f"t{i}") for i in range(5)]))
    assert out.given_up_target == 3


@pytest.mark.parametrize("strategies", [("snapshot-typo",)])
def test_bad_strategy_is_named(strategies: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="snapshot-typo"):
        BuilderSettings("A", "B", strategies)  # type: ignore[arg-type]


def test_snapshot_alone_tells_copies_from_foreign_by_the_digests_the_source_shows() -> None:
    """No pairing: a target entry whose digest the source stream shows is a copy (unpaired,
    which only anchors ack), even when it shows twice; one the source never shows ages out
    of the window as foreign."""
    b = MappingBuilder(BuilderSettings("A", "B", ("snapshot",), alignment_window=2))
    out = b.process(rows([
        ("A", 1, 0, None, "a"), ("A", 1, 1, None, "dup"), ("A", 1, 2, None, "dup"),
        ("B", 7, 0, None, "a"), ("B", 7, 1, None, "local"), ("B", 7, 2, None, "dup"),
        ("B", 7, 3, None, "dup"), ("B", 7, 4, None, "later"),
    ]))
    m = out.mappings[KEY]
    assert not len(m.segments)
    assert m.unpaired.rows.tolist() == [[7, 0, 1], [7, 2, 2]]
    assert out.unpaired == 3
    # 7:1 and 7:4 wait (the source reader may lag); the window holds 2, so nothing ages yet.
    assert not len(m.foreign)
    out2 = b.process(rows([("A", 1, 3, None, "later"), ("B", 7, 5, None, "x"),
                           ("B", 7, 6, None, "y")]))
    assert out2.mappings[KEY].unpaired.rows.tolist() == [[7, 4, 1]]
    assert out2.mappings[KEY].foreign.rows.tolist() == [[7, 1, 1]]


def test_identity_with_snapshot_keeps_ambiguous_copies_as_unpaired_not_foreign() -> None:
    b = MappingBuilder(BuilderSettings("A", "B", ("identity", "snapshot")))
    out = b.process(rows([
        ("A", 1, 0, None, "dup"), ("A", 1, 1, None, "dup"), ("A", 1, 2, None, "c"),
        ("B", 7, 0, None, "dup"), ("B", 7, 1, None, "dup"), ("B", 7, 2, None, "local"),
        ("B", 7, 3, None, "c"),
    ]))
    m = out.mappings[KEY]
    assert [str(s) for s in m.segments] == ["1:2+1->7:3 (identity)"]
    assert m.unpaired.rows.tolist() == [[7, 0, 2]]
    assert m.foreign.rows.tolist() == [[7, 2, 1]]


class FakeMarkers:
    """The source's markers as an AnchorRead sees them: marker positions -> anchors; asks
    recorded. The real reader (admin raw entries) is tested on the real test bed."""

    def __init__(self, markers: dict[Position, Position | None]) -> None:
        self.markers = markers  # marker position -> T (a SNAPSHOT) or None (another marker)
        self.asked: list[tuple[dict[PartitionKey, list[list[int]]], dict[PartitionKey, str]]] = []

    def __call__(self, holes: Mapping[PartitionKey, Runs],
                 tails: Mapping[PartitionKey, Position]) -> AnchorFindings:
        self.asked.append(({k: r.rows.tolist() for k, r in holes.items()},
                           {k: str(p) for k, p in tails.items()}))
        found: list[tuple[Position, Position]] = []
        ends: dict[PartitionKey, Position] = {}
        for runs in holes.values():
            for lg, e, n in runs.rows.tolist():
                for i in range(n):
                    t = self.markers.get(Position(lg, e + i))
                    if t is not None:
                        found.append((Position(lg, e + i), t))
        for key, tail in tails.items():
            p = Position(tail.ledger, tail.entry + 1)
            while p in self.markers:
                t = self.markers[p]
                if t is not None:
                    found.append((p, t))
                ends[key] = p
                p = Position(p.ledger, p.entry + 1)
        return AnchorFindings({KEY: Anchors.of(*found)} if found else {}, ends)


def test_snapshot_markers_are_read_at_the_source_holes_and_past_the_tail_once_each() -> None:
    """Source 1:0, markers 1:1 (a request) and 1:2 (a snapshot -> 7:0), 1:3, then markers
    1:4 (request) and 1:5 (snapshot -> 7:1) after the last entry. The tail is looked past;
    the markers found there are not looked at again when the next entry shows them as holes."""
    fake = FakeMarkers({P("1:1"): None, P("1:2"): P("7:0"), P("1:4"): None, P("1:5"): P("7:1")})
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property", "snapshot")),
                       anchor_read=fake)
    out = b.process(rows([("A", 1, 0, None, "a"), ("A", 1, 3, None, "b"),
                          ("B", 7, 0, "1:0", "a"), ("B", 7, 1, "1:3", "b")]))
    assert out.anchors == 2
    assert out.mappings[KEY].anchors == Anchors.of((P("1:2"), P("7:0")), (P("1:5"), P("7:1")))
    assert fake.asked[0] == ({KEY: [[1, 1, 2]]}, {KEY: "1:3"})
    out2 = b.process(rows([("A", 1, 6, None, "c")]))
    assert fake.asked[1] == ({}, {KEY: "1:6"})  # 1:4 and 1:5 are not holes: looked at already
    assert out2.anchors == 0 and KEY not in out2.mappings
    # An idle partition's tail is watched for a while, then no longer.
    b.clock = lambda: 10**12
    b.process(rows([]))
    assert len(fake.asked) == 2


def test_holes_unacked_claims_no_skippable_and_a_chunked_message_stays_unmapped() -> None:
    """evidence.holes unacked: skipped ids (chunks, here 9:1-9:2) are never skippable, and
    the chunked message handed on without evidence (9:3) is never paired: nothing of it is
    acked on the target, so after a failover it comes again whole."""
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property", "identity"),
                                     claim_holes=False))
    out = b.process(rows([
        ("A", 1, 0, None, "m0"), ("A", 1, 3, None, None),   # the source's chunked message
        ("B", 9, 0, None, "m0"), ("B", 9, 3, None, None),   # its replica: no stamp, no digest
        ("B", 9, 4, "1:4", "m4"),
    ]))
    m = out.mappings[KEY]
    assert len(m.skippable) == 0 and len(b.known[KEY].skippable) == 0
    assert b.known[KEY].lookup(P("1:0")) == P("9:0")
    assert b.known[KEY].lookup(P("1:4")) == P("9:4")
    assert b.known[KEY].lookup(P("1:3")) is None
    # The same stream with holes taken for markers unchecked claims the chunks (what
    # evidence.holes markers refuses chunked messages for).
    trusting = MappingBuilder(BuilderSettings("A", "B", ("position-property", "identity")))
    claimed = trusting.process(rows([("B", 9, 0, None, "m0"), ("B", 9, 3, None, None)]))
    assert claimed.mappings[KEY].skippable.rows.tolist() == [[9, 1, 2]]


class FakeCheck:
    """A hole check that knows which ids are markers; records what it was asked."""

    def __init__(self, markers: set[tuple[int, int]]) -> None:
        self.markers = markers
        self.asked: list[dict[PartitionKey, list[list[int]]]] = []

    def __call__(self, candidates: Mapping[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        self.asked.append({k: r.rows.tolist() for k, r in candidates.items()})
        out = {}
        for key, runs in candidates.items():
            kept = []
            for lg, e, n in runs.rows.tolist():
                k = 0
                while k < n and (lg, e + k) in self.markers:
                    k += 1
                if k:
                    kept.append((lg, e, k))
            out[key] = Runs.of(*kept)
        return out


def test_verified_holes_claims_only_what_the_check_says_are_markers() -> None:
    """evidence.holes verified: 9:1 is a marker, 9:2-9:3 the first chunks of a chunked
    message whose last chunk (9:7) comes a batch later, 9:5 a marker again. Only the
    markers are claimed, in the batch that finds them; the chunks never are."""
    check = FakeCheck({(9, 1), (9, 5)})
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)), hole_check=check)
    out = b.process(rows([("B", 9, 0, "1:0", "m0"), ("B", 9, 4, "1:4", "m4"),
                          ("B", 9, 6, "1:6", "m6")]))
    assert check.asked == [{KEY: [[9, 1, 3], [9, 5, 1]]}]
    assert out.mappings[KEY].skippable.rows.tolist() == [[9, 1, 1], [9, 5, 1]]
    out2 = b.process(rows([("B", 9, 7, None, None), ("B", 9, 8, "1:8", "m8")]))
    assert len(check.asked) == 1  # 9:6 -> 9:7 -> 9:8 leaves no hole: nothing to ask
    assert len(out2.mappings[KEY].skippable) == 0
    assert b.known[KEY].skippable.rows.tolist() == [[9, 1, 1], [9, 5, 1]]


def test_a_hole_check_answering_beyond_its_candidates_is_an_error() -> None:
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)),
                       hole_check=lambda c: {KEY: Runs.of((9, 1, 2))})
    with pytest.raises(ValueError, match="not candidates"):
        b.process(rows([("B", 9, 0, "1:0", "m0"), ("B", 9, 2, "1:2", "m2")]))


def test_skipped_ids_past_the_batch_budget_wait_in_the_state_and_go_first_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Five skipped ids a batch may be checked: runs of two give 2+2+2 = 6 (the run that
    crosses the budget is checked whole), and the next two runs wait. They survive a
    restart from the state, and the next batch checks them before its own."""
    import cursorsync.mapping.builder as builder_module

    monkeypatch.setattr(builder_module, "HOLE_CHECKS_PER_BATCH", 5)
    check = FakeCheck({(9, e) for e in range(40)} - {(9, 3 * k) for k in range(14)})
    cfg = BuilderSettings("A", "B", ("position-property",))
    b = MappingBuilder(cfg, hole_check=check)
    # Target entries 9:0, 9:3, 9:6, ..., 9:15: runs of two skipped ids between them.
    out = b.process(rows([("B", 9, 3 * k, f"1:{k}", None) for k in range(6)]))
    assert check.asked == [{KEY: [[9, 1, 2], [9, 4, 2], [9, 7, 2]]}]
    assert out.skipped_ids == out.skipped_claimed == 6
    assert out.skipped_waiting == {KEY: 4}
    assert out.mappings[KEY].skippable.rows.tolist() == [[9, 1, 2], [9, 4, 2], [9, 7, 2]]

    restarted = MappingBuilder(cfg, state=b.state(), hole_check=check)
    restarted.seed_known(b.known)
    out2 = restarted.process(rows([("B", 9, 18, "1:6", None)]))
    # Left over first (9:10, 9:13), then this batch's (9:16): 6 ids, within one run over.
    assert check.asked[1] == {KEY: [[9, 10, 2], [9, 13, 2], [9, 16, 2]]}
    assert out2.skipped_waiting == {}
    assert restarted.known[KEY].skippable.rows.tolist() == [[9, 1, 2], [9, 4, 2], [9, 7, 2],
                                                            [9, 10, 2], [9, 13, 2], [9, 16, 2]]


def test_the_builder_keeps_known_mappings_packed_but_those_a_batch_maps() -> None:
    """Its memory follows the partitions with new entries: a partition no batch touched
    since the last is kept packed, and comes back the same when a later batch does."""
    other = PartitionKey("persistent://public/default/u", -1)
    b = MappingBuilder(BuilderSettings("A", "B", ("position-property",)))
    b.process(rows([("B", 9, 0, "1:0", "m0"), ("B", 9, 1, "1:1", "m1")]))
    b.process(pa.concat_tables([rows([("B", 3, 0, "2:0", "u0")]).set_column(
        1, "topic", pa.array([other.topic]))]))
    b.process(rows([("B", 9, 2, "1:2", "m2")]))
    b.process(rows([("B", 9, 3, "1:3", "m3")]))
    assert b.known.built == 1  # t; u was mapped two batches ago and is packed
    assert [str(s) for s in b.known[KEY].segments] == ["1:0+4->9:0 (position-property)"]
    assert b.known[other].lookup(P("2:0")) == P("3:0")
