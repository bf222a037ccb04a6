"""The plugin's last dispatchable positions (cursorsync.pulsar.dispatchable): parsing, and the
tail checks answered from them, asked of a stub broker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from cursorsync.core.positions import Position
from cursorsync.errors import MalformedAdminOutputError
from cursorsync.pulsar.cursor_digests import PLUGIN_RETRY_S
from cursorsync.pulsar.dispatchable import (
    DISPATCHABLE_PATH,
    PLUGIN_TAIL_EVERY_S,
    PluginPositions,
    PluginTail,
    fetch_dispatchable,
    parse_dispatchable,
)
from tests.support.admin_stub import Reply, StubAdmin
from tests.support.admin_stub import fast_client as client

NS = "acme/orders"
P0 = f"persistent://{NS}/events-partition-0"
P1 = f"persistent://{NS}/events-partition-1"
PATH = f"{DISPATCHABLE_PATH}?namespace=acme%2Forders"


def answer(broker: str = "broker-1:8080", **positions: str) -> dict[str, Any]:
    return {"plugin": "cursorsync", "broker": broker, "brokers": [broker], "namespace": NS,
            "topics": [{"topic": f"persistent://{NS}/{local}", "dispatchable": p}
                       for local, p in positions.items()]}


def test_an_answer_reads_as_topic_to_position() -> None:
    doc = {**answer(), "topics": [{"topic": P0, "dispatchable": "12:40"},
                                  {"topic": P1, "dispatchable": "7:-1"}]}
    got = parse_dispatchable(NS, doc)
    assert got.broker == "broker-1:8080" and got.brokers == ("broker-1:8080",)
    assert got.topics == {P0: Position(12, 40), P1: Position(7, -1)}


@pytest.mark.parametrize(("topics", "why"), [
    ([{"topic": P0}], "dispatchable None is not ledger:entry"),
    ([{"topic": P0, "dispatchable": "12"}], "dispatchable '12' is not ledger:entry"),
    ([{"topic": P0, "dispatchable": 12}], "dispatchable 12 is not ledger:entry"),
    ([{"topic": P0, "dispatchable": "99999999999999999999:1"}], "is not ledger:entry"),
    ([{"topic": "persistent://acme/other/x", "dispatchable": "1:1"}], "not a persistent topic"),
    ([{"topic": P0, "dispatchable": "1:1"}] * 2, "listed twice"),
    (["x"], "expected an object"),
])
def test_anything_else_is_one_error_naming_the_namespace(topics: list[Any], why: str) -> None:
    with pytest.raises(MalformedAdminOutputError, match=f"namespace {NS}: .*{why}"):
        parse_dispatchable(NS, {**answer(), "topics": topics})


def test_the_head_of_the_answer_is_checked_as_the_cursor_digests_are() -> None:
    with pytest.raises(MalformedAdminOutputError, match="plugin is None"):
        parse_dispatchable(NS, {**answer(), "plugin": None})
    with pytest.raises(MalformedAdminOutputError, match="for namespace 'acme/other'"):
        parse_dispatchable(NS, {**answer(), "namespace": "acme/other"})


class Readers:
    """The reader checks a PluginTail falls back to, recorded: ``nothing`` is their answer."""

    def __init__(self, nothing: bool = False) -> None:
        self.nothing = nothing
        self.asked: list[tuple[str, Position, float | None]] = []
        self.checks = 0
        self.closed = False

    def nothing_dispatchable_after(self, topic: str, after: Position,
                                   not_before: float | None = None) -> bool:
        self.asked.append((topic, after, not_before))
        self.checks += 1
        return self.nothing

    def requests_by_kind(self) -> dict[str, int]:
        return {"tail-check": self.checks}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def stub() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


def _tail(stub: StubAdmin, readers: Readers) -> tuple[PluginTail, list[float]]:
    """A PluginTail on the stub, its clock and sleeps in a list: [now]."""
    tail = PluginTail(client(stub.url), readers)  # type: ignore[arg-type]
    now = [100.0]
    tail.clock = lambda: now[0]

    def sleep(s: float) -> None:
        now[0] += s

    tail.sleep = sleep
    return tail, now


def _own(stub: StubAdmin, **positions: str) -> Reply:
    return Reply(body=answer(urlsplit(stub.url).netloc, **positions))


def test_a_partition_is_answered_from_its_brokers_position(stub: StubAdmin) -> None:
    """Nothing dispatchable past an entry at or after the broker's position; something past
    one before it. The readers are not asked."""
    stub.set(PATH, _own(stub, **{"events-partition-0": "12:40"}))
    readers = Readers()
    tail, now = _tail(stub, readers)
    assert tail.nothing_dispatchable_after(P0, Position(12, 40), now[0])
    assert tail.nothing_dispatchable_after(P0, Position(12, 41), now[0])
    assert tail.nothing_dispatchable_after(P0, Position(13, 0), now[0])
    assert not tail.nothing_dispatchable_after(P0, Position(12, 39), now[0])
    assert not tail.nothing_dispatchable_after(P0, Position(11, 90), now[0])
    assert readers.asked == []
    assert tail.requests_by_kind() == {"plugin-tail": 1, "tail-check": 0}
    assert tail.answered == 5


def test_a_partition_the_plugin_does_not_list_is_asked_with_a_reader(stub: StubAdmin) -> None:
    stub.set(PATH, _own(stub, **{"events-partition-0": "12:40"}))
    readers = Readers(nothing=True)
    tail, now = _tail(stub, readers)
    assert tail.nothing_dispatchable_after(P1, Position(3, 4), now[0] - 1)
    assert readers.asked == [(P1, Position(3, 4), now[0] - 1)]
    assert tail.requests_by_kind() == {"plugin-tail": 1, "tail-check": 1}


def test_a_check_takes_only_an_answer_asked_no_sooner_than_it_says(stub: StubAdmin) -> None:
    """An answer asked before a check's time is not taken for it: the next answer, asked no
    sooner than PLUGIN_TAIL_EVERY_S after the last, is; a check whose time an answer already
    passed takes that one."""
    stub.set(PATH, _own(stub, **{"events-partition-0": "12:40"}),
             _own(stub, **{"events-partition-0": "12:50"}))
    tail, now = _tail(stub, Readers())
    assert tail.nothing_dispatchable_after(P0, Position(12, 45), now[0])
    first = now[0]
    assert not tail.nothing_dispatchable_after(P0, Position(12, 45), first + 0.01)
    assert now[0] == pytest.approx(first + PLUGIN_TAIL_EVERY_S)  # waited before asking
    assert not tail.nothing_dispatchable_after(P0, Position(12, 45), first + 0.2)
    assert tail.requests == 2 and len(stub.requests) == 2


def test_a_check_whose_time_is_still_to_come_is_asked_no_sooner(stub: StubAdmin) -> None:
    """A check submitted right after its poll waits out the margin after it, as a reader
    would: the answer it takes is asked at its ``not_before``, not when it is submitted."""
    stub.set(PATH, _own(stub, **{"events-partition-0": "12:40"}))
    tail, now = _tail(stub, Readers())
    due = now[0] + 1.0
    assert tail.nothing_dispatchable_after(P0, Position(12, 40), due)
    assert now[0] >= due and tail.requests == 1


def test_checks_waiting_at_once_share_one_request(stub: StubAdmin) -> None:
    """Eight threads asking at the same time: one request answers them all."""
    stub.set(PATH, Reply(body=answer(urlsplit(stub.url).netloc,
                                     **{"events-partition-0": "12:40"}), delay_s=0.3))
    tail = PluginTail(client(stub.url), Readers())  # type: ignore[arg-type]
    start = threading.Barrier(8)
    got: list[bool] = []

    def check() -> None:
        start.wait()
        got.append(tail.nothing_dispatchable_after(P0, Position(12, 40)))

    threads = [threading.Thread(target=check) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [True] * 8
    # The first thread's request may begin before the others ask: at most one more.
    assert len(stub.requests) <= 2 and tail.requests == len(stub.requests)


def test_a_broker_without_the_plugin_sends_every_check_to_the_readers_for_a_while(
        stub: StubAdmin, caplog: pytest.LogCaptureFixture) -> None:
    readers = Readers(nothing=True)
    tail, now = _tail(stub, readers)  # the stub answers 404 without the plugin's mark
    assert tail.nothing_dispatchable_after(P0, Position(1, 1), now[0])
    assert "a reader per partition checks for the next" in caplog.text
    assert tail.nothing_dispatchable_after(P1, Position(1, 1), now[0] + 1)
    assert len(stub.requests) == 1 and len(readers.asked) == 2
    stub.set(PATH, _own(stub, **{"events-partition-0": "12:40"}))
    now[0] += PLUGIN_RETRY_S
    assert not tail.nothing_dispatchable_after(P0, Position(1, 1), now[0])
    assert len(stub.requests) == 2 and len(readers.asked) == 2
    tail.close()
    assert readers.closed


def test_fetch_asks_one_broker_for_one_namespace(stub: StubAdmin) -> None:
    stub.set(PATH, Reply(body=answer(**{"events-partition-0": "5:6"})))
    with client(stub.url) as admin:
        got = fetch_dispatchable(admin, NS)
    assert got.topics == {P0: Position(5, 6)} and stub.requests[0][0] == PATH


def test_positions_of_many_partitions_come_from_one_request(stub: StubAdmin) -> None:
    """Every listed partition by the name it was asked by (short or full); one the broker
    does not list is left for the caller's consumer."""
    stub.set(PATH, _own(stub, **{"events-partition-0": "12:40", "events-partition-2": "7:-1"}))
    positions = PluginPositions(client(stub.url))
    short = "acme/orders/events-partition-2"
    got = positions.read([P0, P1, short])
    assert got == {P0: Position(12, 40), short: Position(7, -1)}
    assert len(stub.requests) == 1 and positions.requests == 1


def test_positions_of_nothing_ask_nothing(stub: StubAdmin) -> None:
    positions = PluginPositions(client(stub.url))
    assert positions.read([]) == {} and stub.requests == []


def test_a_broker_without_the_plugin_leaves_every_position_to_the_consumers_for_a_while(
        stub: StubAdmin, caplog: pytest.LogCaptureFixture) -> None:
    positions = PluginPositions(client(stub.url))
    now = [100.0]
    positions.clock = lambda: now[0]
    assert positions.read([P0]) == {}  # the stub answers 404 without the plugin's mark
    assert "a consumer per partition asks for the next" in caplog.text
    now[0] += PLUGIN_RETRY_S - 1
    assert positions.read([P0]) == {} and len(stub.requests) == 1
    stub.set(PATH, _own(stub, **{"events-partition-0": "12:40"}))
    now[0] += 1
    assert positions.read([P0]) == {P0: Position(12, 40)} and len(stub.requests) == 2
