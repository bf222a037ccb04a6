"""Identity alignment against the truth of which target entry copies which source entry.

Three clusters' messages (the source a's own, a third cluster c's, the target b's own)
reach each side in an order of their own, each origin's in the order it produced them;
identical messages, producer names shared across clusters and narrowed identity fields
make digests repeat; one side's reader lags the other by more than the window. Whatever
the builder pairs must be a true copy (safety); with every digest distinct and no side
lagging beyond the window, every message both sides hold pairs (progress).

What no identity evidence can tell apart is left out of the safety property: messages
with one digest of which some reached one side only.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cursorsync.core.alignment import Memory, Waiting, align, stream_of
from cursorsync.core.records import PartitionKey
from cursorsync.mapping.builder import BuilderSettings, MappingBuilder

KEY = PartitionKey("persistent://t/n/x", -1)
SOURCE_LEDGER, TARGET_LEDGER = 1, 9


@dataclass(frozen=True)
class Message:
    uid: int
    origin: str
    producer: str
    publish: int
    payload: int


def digest_of(m: Message, fields: tuple[str, ...]) -> bytes:
    parts = {"producer_name": m.producer, "publish_time": str(m.publish),
             "payload": str(m.payload)}
    raw = "|".join(parts[f] for f in fields)
    return hashlib.blake2b(raw.encode(), digest_size=16).digest()


@dataclass(frozen=True)
class World:
    source: list[Message]  # in a's order
    target: list[Message]  # in b's order
    fields: tuple[str, ...]
    window: int
    source_steps: list[int]  # entries each side's reader returns per batch
    target_steps: list[int]


def _interleave(rng: random.Random, streams: list[list[Message]]) -> list[Message]:
    """Merge keeping each stream's order, picking the next stream at random."""
    heads = [list(s) for s in streams if s]
    out = []
    while heads:
        i = rng.randrange(len(heads))
        out.append(heads[i].pop(0))
        if not heads[i]:
            heads.pop(i)
    return out


@st.composite
def worlds(draw: st.DrawFn, *, distinct: bool = False) -> World:
    rng = random.Random(draw(st.integers(0, 2**32)))
    shared_names = not distinct and draw(st.booleans())
    narrow = not distinct and draw(st.booleans())
    producers = {"a": ["pa1", "pa2"], "b": ["pb1"], "c": ["pc1", "pc2"]}
    if shared_names:  # the same producer name on two clusters
        producers["c"] = ["pa1", "pc2"]
    payloads = 1_000_000 if distinct else draw(st.integers(1, 4))
    msgs: dict[str, list[Message]] = {"a": [], "b": [], "c": []}
    uid = 0
    for origin in "abc":
        for _ in range(draw(st.integers(0, 14))):
            p = rng.choice(producers[origin])
            # Publish times collide only between messages published in one millisecond.
            publish = 1000 + (uid if distinct else rng.randrange(3))
            msgs[origin].append(Message(uid, origin, p, publish,
                                        uid if distinct else rng.randrange(payloads)))
            uid += 1
    # What replicates where: a's and c's to b, b's and c's to a; some left out
    # (replicate_to), and a replicator sending a run again after a crash.
    def sent(ms: list[Message]) -> list[Message]:
        kept = [m for m in ms if distinct or rng.random() > 0.1]
        if not distinct and kept and rng.random() < 0.2:
            i = rng.randrange(len(kept))
            kept = kept[: i + 1] + kept[max(0, i - 2): i + 1] + kept[i + 1:]
        return kept

    source = _interleave(rng, [msgs["a"], sent(msgs["c"]), sent(msgs["b"])])
    target = _interleave(rng, [sent(msgs["a"]), sent(msgs["c"]), msgs["b"]])
    fields = (("publish_time", "payload") if narrow
              else ("producer_name", "publish_time", "payload"))
    window = draw(st.integers(2, 8)) if not distinct else 10_000
    lag = not distinct and draw(st.booleans())

    def steps(n: int, slow: bool) -> list[int]:
        if slow:  # nothing at first, then all at once: behind by more than the window
            return [0, 0, 0, n]
        return [draw(st.integers(1, 5)) for _ in range(n)] + [n]

    slow_side = draw(st.sampled_from(["source", "target"]))
    return World(source, target, fields, window,
                 steps(len(source), lag and slow_side == "source"),
                 steps(len(target), lag and slow_side == "target"))


def _rows(cluster: str, ledger: int, start: int, ms: list[Message],
          fields: tuple[str, ...]) -> pa.Table:
    n = len(ms)
    return pa.table({
        "cluster": pa.array([cluster] * n, pa.string()),
        "topic": pa.array([KEY.topic] * n, pa.string()),
        "partition": pa.array([KEY.partition] * n, pa.int32()),
        "ledger": pa.array([ledger] * n, pa.int64()),
        "entry": pa.array(range(start, start + n), pa.int64()),
        "batch_index": pa.array([-1] * n, pa.int32()),
        "source_position": pa.array([None] * n, pa.string()),
        "entry_identity": pa.array([digest_of(m, fields) for m in ms], pa.binary()),
        "producer_name": pa.array([m.producer for m in ms], pa.string()),
        "publish_time": pa.array([m.publish for m in ms], pa.int64()),
    })


def run(world: World) -> list[tuple[int, int]]:
    """Feed both sides' entries batch by batch; the (source entry, target entry) pairs the
    builder's segments hold at the end."""
    b = MappingBuilder(BuilderSettings("a", "b", ("identity",), world.window, claim_holes=False))
    s_at = t_at = 0
    for i in range(max(len(world.source_steps), len(world.target_steps))):
        s_n = world.source_steps[i] if i < len(world.source_steps) else 0
        t_n = world.target_steps[i] if i < len(world.target_steps) else 0
        s_part = world.source[s_at: s_at + s_n]
        t_part = world.target[t_at: t_at + t_n]
        batch = pa.concat_tables([_rows("a", SOURCE_LEDGER, s_at, s_part, world.fields),
                                  _rows("b", TARGET_LEDGER, t_at, t_part, world.fields)])
        s_at += len(s_part)
        t_at += len(t_part)
        if batch.num_rows:
            b.process(batch)
    pairs = []
    mapping = b.known.get(KEY)
    if mapping is None:
        return pairs
    for seg in mapping.segments:
        for k in range(seg.count):
            pairs.append((seg.source_entry + k, seg.target_entry + k))
    return pairs


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_a_pair_is_always_a_true_copy(world: World) -> None:
    """Unless nothing could tell: identical messages (one digest, one producer name) may
    pair with one another once each side shows the digest once, where some of them
    reached one side only (kept from one cluster by replicate_to or TTL), or where they
    come from two clusters whose producers share a name (their orders differ by side).
    Every other digest that repeats, in any order and at any lag, must never pair two
    different messages."""
    on_s: dict[bytes, set[Message]] = {}
    on_t: dict[bytes, set[Message]] = {}
    for side, ms in ((on_s, world.source), (on_t, world.target)):
        for m in ms:
            side.setdefault(digest_of(m, world.fields), set()).add(m)
    for s, t in run(world):
        d = digest_of(world.source[s], world.fields)
        if on_s[d] != on_t[d] or len({m.origin for m in on_s[d]}) > 1:
            continue  # indistinguishable, as above
        assert world.source[s].uid == world.target[t].uid, (
            f"source {s} ({world.source[s]}) paired with target {t} ({world.target[t]})")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(distinct=True))
def test_every_message_on_both_sides_pairs_when_digests_are_distinct(world: World) -> None:
    """Three origins interleave differently on each side: pairs cross between producers,
    and none may be dropped for it."""
    pairs = set(run(world))
    on_source = {m.uid: i for i, m in enumerate(world.source)}
    want = {(on_source[m.uid], j) for j, m in enumerate(world.target) if m.uid in on_source}
    assert pairs == want


def test_a_digest_given_up_never_pairs_again() -> None:
    """The review's case: two source entries with one digest; the first ages out of the
    window while its copy is still on its way; the digest is then seen once on each
    side, and must not pair the copy of the first with the second."""
    d = b"d" * 16
    other = [bytes([i]) * 16 for i in range(1, 5)]
    memory = Memory()
    src = Waiting.of([1] * 6, range(6), [d, d, *other], [1] * 6, [5] * 6)
    done = align(src, Waiting.of([], [], []), memory, window=4)
    assert done.source_gone.tolist() == [True, True, False, False, False, False]
    # Both copies of d left the source's window unpaired; the target now shows d once.
    later = align(Waiting.of([1] * 4, range(2, 6), other, [1] * 4, [5] * 4),
                  Waiting.of([9], [0], [d], [1], [5]), done.memory, window=4)
    assert len(later.source) == 0 and later.target_gone.tolist() == [True]


def test_the_memory_keeps_a_watermark_per_stream() -> None:
    p, q = stream_of("p"), stream_of("q")
    d = [bytes([i]) * 16 for i in range(4)]
    memory = Memory().remember(d[:3], np.array([p, p, q], np.int64),
                               np.array([10, 12, 12], np.int64), capacity=10)
    assert memory.streams == {p: (12, frozenset({d[1]})), q: (12, frozenset({d[2]}))}
    blocked = memory.blocks(
        [d[1], d[3], d[0], d[3], d[3]], np.array([p, p, p, q, stream_of("r")], np.int64),
        np.array([12, 12, 11, 13, 5], np.int64))
    # d[1] again at p's watermark; a new digest at it; before it (out of order); after
    # q's; a stream never seen.
    assert blocked.tolist() == [True, False, True, False, False]


def test_streams_dropped_from_memory_raise_the_horizon(monkeypatch: pytest.MonkeyPatch) -> None:
    import cursorsync.core.alignment as alignment

    monkeypatch.setattr(alignment, "STREAMS_REMEMBERED", 2)
    memory = Memory().remember([b"a" * 16, b"b" * 16, b"c" * 16],
                               np.array([1, 2, 3], np.int64), np.array([10, 30, 20], np.int64),
                               capacity=10)
    assert (sorted(memory.streams), memory.horizon) == ([2, 3], 10)
    blocked = memory.blocks([b"x" * 16, b"y" * 16], np.array([1, 1], np.int64),
                            np.array([10, 11], np.int64))
    assert blocked.tolist() == [True, False]


def test_pairs_of_two_producers_may_cross_but_not_within_one() -> None:
    """Order is checked within a producer's stream only."""
    d = [bytes([i]) * 16 for i in range(4)]
    p, q = stream_of("p"), stream_of("q")
    src = Waiting.of([1] * 4, range(4), d, [p, p, q, q], [1] * 4)
    # b got q's messages first: crossings between p and q, none within either.
    tgt = Waiting.of([9] * 4, range(4), [d[2], d[3], d[0], d[1]], [q, q, p, p], [1] * 4)
    done = align(src, tgt, Memory(), window=10)
    assert sorted(zip(done.source.tolist(), done.target.tolist(), strict=True)) == [
        (0, 2), (1, 3), (2, 0), (3, 1)]
    # Within p the order is swapped: both of p's pairs go, q's stay.
    tgt = Waiting.of([9] * 4, range(4), [d[2], d[3], d[1], d[0]], [q, q, p, p], [1] * 4)
    done = align(src, tgt, Memory(), window=10)
    assert sorted(zip(done.source.tolist(), done.target.tolist(), strict=True)) == [
        (2, 0), (3, 1)]


def test_pairs_of_two_producers_with_one_digest_are_refused() -> None:
    """With producer names left out of the digest, two producers' messages may share one:
    their streams disagree, so they do not pair."""
    d = b"d" * 16
    done = align(Waiting.of([1], [0], [d], [stream_of("p")], [1]),
                 Waiting.of([9], [0], [d], [stream_of("q")], [1]), Memory(), window=10)
    assert len(done.source) == 0


def test_one_stream_pairs_only_unique_digests_that_do_not_cross() -> None:
    src = [b"a", b"b", b"c", b"d", b"d", b"e", b"f", b"g"]
    tgt = [b"x", b"a", b"b", b"d", b"c", b"e", b"g", b"f", b"y"]
    done = align(Waiting.of([1] * 8, range(8), src), Waiting.of([9] * 9, range(9), tgt),
                 Memory(), window=100)
    pairs = [(src[i], tgt[j]) for i, j in zip(done.source, done.target, strict=True)]
    # d is ambiguous on the source (so c no longer crosses anything); f and g cross: dropped.
    assert pairs == [(b"a", b"a"), (b"b", b"b"), (b"c", b"c"), (b"e", b"e")]
