"""Readers kept between ranges: the pool's rules, and read_entries on a kept reader giving
the rows a reader opened at the range's start gives (a fake topic stands for the broker)."""

from __future__ import annotations

import itertools
from typing import Any

import pulsar
import pytest

import cursorsync.mapping.entries_read as entries_read
from cursorsync.mapping.entries_read import read_entries
from cursorsync.mapping.entries_tasks import EntriesPartition
from cursorsync.mapping.kept_readers import FORWARD_MAX, IDLE_CLOSE_S, KeptReader, KeptReaders
from tests.support.entries import LOCAL_NS, REPL, _Id, _Msg, _varint

# -- the pool ----------------------------------------------------------------------------


class _Reader:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False

    def close(self) -> None:
        self.closed = True


def _kept(name: str, at: tuple[int, int]) -> KeptReader:
    return KeptReader(_Reader(name), at)


def test_a_kept_reader_is_taken_for_a_range_at_or_after_where_it_stopped() -> None:
    pool = KeptReaders()
    r = _kept("r", (1, 5))
    pool.keep("s", "t", r, limit=10)
    assert pool.take("s", "t", (1, 7)) is r and len(pool) == 0
    pool.keep("s", "t", r, limit=10)
    assert pool.take("s", "t", (1, 5)) is r
    assert pool.take("s", "t", (1, 5)) is None  # taken: no longer kept
    assert pool.take("other settings", "t", (1, 9)) is None
    assert not r.reader.closed and pool.taken == 2


def test_a_kept_reader_past_the_range_start_is_closed() -> None:
    """A batch read again starts before where the reader stopped: what lay between is
    gone from it."""
    pool = KeptReaders()
    r = _kept("r", (2, 0))
    pool.keep("s", "t", r, limit=10)
    assert pool.take("s", "t", (1, 9)) is None
    assert r.reader.closed and len(pool) == 0


def test_over_the_limit_the_least_recently_used_reader_is_closed() -> None:
    pool = KeptReaders()
    readers = [_kept(f"r{i}", (1, i)) for i in range(4)]
    for i, r in enumerate(readers[:3]):
        pool.keep("s", f"t{i}", r, limit=3)
    pool.take("s", "t0", (1, 0))
    pool.keep("s", "t0", readers[0], limit=3)  # used again: the newest now
    pool.keep("s", "t3", readers[3], limit=3)
    assert [r.reader.closed for r in readers] == [False, True, False, False]
    assert len(pool) == 3
    pool.keep("s", "t4", _kept("r4", (1, 0)), limit=0)
    assert len(pool) == 0 and all(r.reader.closed for r in readers)


def test_a_reader_kept_again_for_its_topic_closes_the_one_before() -> None:
    pool = KeptReaders()
    first, second = _kept("a", (1, 1)), _kept("b", (1, 2))
    pool.keep("s", "t", first, limit=10)
    pool.keep("s", "t", second, limit=10)
    assert first.reader.closed and not second.reader.closed and len(pool) == 1
    pool.drop("s", "t")
    assert second.reader.closed and len(pool) == 0


def test_idle_readers_are_closed_and_a_closed_client_s_are_forgotten() -> None:
    now = [0.0]
    pool = KeptReaders(clock=lambda: now[0])
    old, young, other = _kept("old", (1, 1)), _kept("young", (1, 1)), _kept("o", (1, 1))
    pool.keep("s", "t1", old, limit=10)
    now[0] = IDLE_CLOSE_S / 2
    pool.keep("s", "t2", young, limit=10)
    pool.keep("x", "t1", other, limit=10)
    now[0] = IDLE_CLOSE_S + 1
    assert pool.take("s", "t2", (1, 1)) is young
    assert old.reader.closed and not other.reader.closed
    assert pool.forget("x") == [other] and len(pool) == 0
    assert not other.reader.closed  # its client closes it


# -- read_entries on kept readers ---------------------------------------------------------


class _ChunkId(_Id):
    """The id a client gives a chunked message: at its last chunk, naming its first."""

    def __init__(self, ledger: int, entry: int, first: tuple[int, int]) -> None:
        super().__init__(ledger, entry)
        self.first = first

    def serialize(self) -> bytes:
        inner = bytes([0x08, *_varint(self.first[0]), 0x10, *_varint(self.first[1])])
        return bytes([0x08, *_varint(self.l), 0x10, *_varint(self.e),
                      0x3A, *_varint(len(inner)), *inner])


class _Topic:
    """A topic's deliverable messages, in order; a reader opened after ``start`` delivers
    those past it (and a batched start entry again, as the Python client does), except a
    chunked message whose first chunk is at or before ``start``; then it times out."""

    def __init__(self) -> None:
        self.messages: list[_Msg] = []
        self.opened: list[tuple[int, int]] = []

    def connect(self) -> _Topic:
        return self

    def create_reader(self, _topic: str, start: Any, **_k: Any) -> _TopicReader:
        at = (-1, -1) if start is pulsar.MessageId.earliest else (
            start.ledger_id(), start.entry_id())
        self.opened.append(at)
        return _TopicReader(self, at)


class _TopicReader:
    def __init__(self, topic: _Topic, start: tuple[int, int]) -> None:
        self.topic, self.start, self.next, self.closed = topic, start, 0, False

    def read_next(self, _timeout: int) -> _Msg:
        while self.next < len(self.topic.messages):
            msg = self.topic.messages[self.next]
            self.next += 1
            mid = msg.message_id()
            pos = (mid.l, mid.e)
            first = getattr(mid, "first", None)
            after = self.start < (0, 0) or pos > self.start or (pos == self.start and mid.i >= 0)
            if after and (first is None or self.start < first):
                return msg
        raise pulsar.Timeout()

    def has_message_available(self) -> bool:
        return self.next < len(self.topic.messages)

    def close(self) -> None:
        self.closed = True


def _part(topic: _Topic, start: str, end: str, **kw: Any) -> EntriesPartition:
    kw.setdefault("read_timeout_ms", 300)
    kw.setdefault("tail_check_ms", 100)
    return EntriesPartition(cluster="a", topic=f"{LOCAL_NS}/t", start=start, end=end,
                            client=topic,  # type: ignore[arg-type]
                            identity_fields=("payload",), identity=True, per_entry=False,
                            source_position_property=REPL, **kw)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> KeptReaders:
    kept = KeptReaders()
    monkeypatch.setattr(entries_read, "KEPT", kept)
    # Whatever is left short of a range's end is markers here.
    monkeypatch.setattr(entries_read, "_nothing_to_deliver", lambda *_: True)
    return kept


def _fill(topic: _Topic, ledger: int, entries: range) -> None:
    for e in entries:
        if e % 3 == 2:  # a batch of three
            topic.messages += [_Msg(_Id(ledger, e, i, 3)) for i in range(3)]
        else:
            topic.messages.append(_Msg(_Id(ledger, e)))


def _ranges(topic: _Topic, bounds: list[str], **kw: Any) -> list[list[tuple]]:
    return [list(read_entries(_part(topic, lo, hi, **kw)))
            for lo, hi in itertools.pairwise(bounds)]


def test_ranges_read_on_a_kept_reader_give_the_rows_of_readers_opened_at_each_start(
        pool: KeptReaders) -> None:
    """One reader reads every range: the message it delivered past a range's end is the
    next range's first, each batch whole; the rows are those of a reader per range."""
    kept, fresh = _Topic(), _Topic()
    for t in (kept, fresh):
        _fill(t, 1, range(12))
    bounds = ["1:0", "1:2", "1:4", "1:5", "1:8", "1:11"]
    rows = _ranges(kept, bounds)
    assert kept.opened == [(1, 0)] and pool.taken == 4 and len(pool) == 1
    assert rows == _ranges(fresh, bounds, kept_readers=0)
    assert len(fresh.opened) == 5 and len(pool) == 1
    assert [[(r[3], r[4], r[5]) for r in x] for x in rows][1] == [
        (1, 3, -1), (1, 4, -1)]


def test_the_message_read_past_a_range_s_end_is_the_next_range_s_first(
        pool: KeptReaders) -> None:
    """A range ending at ids the reader skips (markers: 1:2 and 1:5 here) is read to its
    end only when the reader delivers the message after them; that message is the next
    range's, and a kept reader hands it on."""
    kept, fresh = _Topic(), _Topic()
    for t in (kept, fresh):
        t.messages = [_Msg(_Id(1, e)) for e in (0, 1, 3, 4, 6)]
    bounds = ["1:0", "1:2", "1:5", "1:6"]
    rows = _ranges(kept, bounds, read_timeout_ms=10_000)
    assert [[r[4] for r in x] for x in rows] == [[1], [3, 4], [6]]
    assert rows == _ranges(fresh, bounds, kept_readers=0, read_timeout_ms=10_000)
    assert kept.opened == [(1, 0)]


def test_a_kept_reader_behind_the_start_drops_what_lies_before_it(pool: KeptReaders) -> None:
    """Another worker read the ranges in between: this reader drops up to FORWARD_MAX
    messages to reach the start, and beyond that reads the range on a new reader."""
    topic = _Topic()
    _fill(topic, 1, range(3 * FORWARD_MAX))
    assert [r[4] for r in read_entries(_part(topic, "1:0", "1:1"))] == [1]
    assert [(r[4], r[5]) for r in read_entries(_part(topic, "1:10", "1:12"))] == [
        (11, 0), (11, 1), (11, 2), (12, -1)]
    assert topic.opened == [(1, 0)]
    last = 3 * FORWARD_MAX - 1
    rows = list(read_entries(_part(topic, f"1:{last - 2}", f"1:{last}")))
    assert sorted({r[4] for r in rows}) == [last - 1, last]
    assert topic.opened == [(1, 0), (1, last - 2)]  # too far behind: a new reader
    assert pool.closed == 1


def test_a_range_that_is_too_big_or_of_unknown_size_is_read_on_a_reader_of_its_own(
        pool: KeptReaders) -> None:
    topic = _Topic()
    _fill(topic, 1, range(5))
    _fill(topic, 2, range(2000))
    list(read_entries(_part(topic, "1:0", "1:2")))
    assert len(pool) == 1
    list(read_entries(_part(topic, "1:2", "2:10")))  # across ledgers, no size known
    assert len(pool) == 0 and pool.closed == 2  # the kept one, passed, and its own
    list(read_entries(_part(topic, "2:10", "2:1500")))  # over KEEP_RANGE_MAX
    assert len(pool) == 0
    list(read_entries(_part(topic, "1:2", "2:5", entries=8)))  # across, size known
    assert len(pool) == 1 and topic.opened == [(1, 0), (1, 2), (2, 10), (1, 2)]


def test_a_chunked_message_begun_before_the_start_is_not_delivered_on_a_kept_reader(
        pool: KeptReaders) -> None:
    """A reader opened at the start never delivers a chunked message whose first chunk
    lies at or before it (the client has not seen that chunk); a kept reader, which did,
    drops it, so the rows are the same either way."""
    def topic() -> _Topic:
        t = _Topic()
        t.messages = [_Msg(_Id(1, 0)), _Msg(_ChunkId(1, 4, (1, 1))), _Msg(_Id(1, 5)),
                      _Msg(_ChunkId(1, 8, (1, 6))), _Msg(_Id(1, 9))]
        return t
    kept, fresh = topic(), topic()
    bounds = ["1:0", "1:2", "1:5", "1:7", "1:9"]
    rows = _ranges(kept, bounds)
    assert rows == _ranges(fresh, bounds, kept_readers=0)
    assert [[r[4] for r in x] for x in rows] == [[], [5], [], [9]]
    assert kept.opened == [(1, 0)]


def test_a_failed_read_closes_its_kept_reader(pool: KeptReaders) -> None:
    topic = _Topic()
    topic.messages = [_Msg(_Id(1, e)) for e in (0, 1, 3, 2, 4)]  # 1:2 after 1:3
    list(read_entries(_part(topic, "1:0", "1:1")))
    reader = next(iter(pool._kept.values())).reader
    with pytest.raises(Exception, match="entry 1:2 arrived after 1:3, out of order"):
        list(read_entries(_part(topic, "1:1", "1:4")))
    assert len(pool) == 0 and reader.closed and pool.closed == 1
