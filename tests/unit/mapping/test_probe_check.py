"""The probe check's choices between its probe, a later batch and the per-id check, on a
probe whose progress the test sets (the real probe on real brokers:
tests/integration/mapping/test_probe_check.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import pytest

from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import PartitionKey
from cursorsync.core.segments import Runs
from cursorsync.mapping.probe_check import ProbeHoleCheck
from cursorsync.mapping.skipped_ids import Defers
from cursorsync.pulsar.dispatch_probe import CursorRead

KEY = PartitionKey("persistent://public/default/t", -1)
TOPIC = KEY.concrete_topic()
#: Skipped ids 5:1..5:4; the broker filtered (acked on the probe) all of them.
RUNS = Runs.of((5, 1, 4))


class Probe:
    """Placed at 5:1 when asked; ``past`` says whether it has received a message past the
    candidates yet, ``trusted`` whether it vouches for anything."""

    def __init__(self, *, past: bool, trusted: bool = True) -> None:
        self.past, self.trusted = past, trusted
        self.own: Position | None = None

    def place_all(self, places: Mapping[str, Position]) -> None:
        for first in places.values():
            self.own = Position(first.ledger, first.entry - 1)

    def is_placed(self, topic: str) -> bool:
        return self.own is not None

    def vouches_after(self, topic: str) -> Position | None:
        return self.own if self.trusted else None

    def wait_past(self, wanted: Mapping[str, Position], timeout_s: float) -> set[str]:
        return set(wanted) if self.past else set()

    def read(self, topics: list[str]) -> dict[str, CursorRead]:
        assert self.own is not None
        return {t: CursorRead(RangeSet.of(("5:0", "5:4")), self.own, {5: 10}) for t in topics}


class PerId:
    """Claims nothing; counts the ids it is asked about."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, candidates: Mapping[PartitionKey, Runs]) -> dict[PartitionKey, Runs]:
        self.asked += sum(r.entry_count() for r in candidates.values())
        return {}


def _check(probe: Probe, patience_s: float = 60.0) -> tuple[ProbeHoleCheck, PerId, list[float]]:
    per_id = PerId()
    check = ProbeHoleCheck(cast(Any, probe), cast(Any, per_id), wait_s=0.0,
                           patience_s=patience_s)
    now = [100.0]
    check.clock = lambda: now[0]
    return check, per_id, now


def test_a_probe_that_is_behind_leaves_its_candidates_for_a_later_batch() -> None:
    probe = Probe(past=False)
    check, per_id, now = _check(probe)
    assert isinstance(check, Defers)
    assert check({KEY: RUNS}) == {}
    assert check.drain_deferred() == {KEY} and check.drain_deferred() == set()
    assert per_id.asked == 0 and check.stats.deferred == 4
    # A batch later the probe has got past them: claimed on its word, nothing per id.
    now[0] += 30.0
    probe.past = True
    assert check({KEY: RUNS}) == {KEY: RUNS}
    assert check.drain_deferred() == set() and per_id.asked == 0
    assert check.stats.filtered == 4


def test_a_probe_behind_for_longer_than_the_patience_sends_its_ids_per_id() -> None:
    check, per_id, now = _check(Probe(past=False), patience_s=60.0)
    check({KEY: RUNS})
    now[0] += 59.0
    check({KEY: RUNS})
    assert check.drain_deferred() == {KEY} and per_id.asked == 0
    now[0] += 1.0
    assert check({KEY: RUNS}) == {}
    assert check.drain_deferred() == set() and per_id.asked == 4
    # The patience starts again for the partition's next wait.
    check({KEY: RUNS})
    assert check.drain_deferred() == {KEY} and per_id.asked == 4


def test_ids_no_probe_vouches_for_go_per_id_at_once() -> None:
    """A disturbed probe (message expiry, an operator's skip) never answers, and ids before
    a probe's place it cannot answer for: waiting for either would be waiting for nothing."""
    check, per_id, _ = _check(Probe(past=False, trusted=False))
    check({KEY: RUNS})
    assert check.drain_deferred() == set() and per_id.asked == 4
    probe = Probe(past=False)
    check, per_id, _ = _check(probe)
    probe.own = Position(5, 2)  # released past the first two candidates
    check({KEY: RUNS})
    assert check.drain_deferred() == set() and per_id.asked == 4


class Admin:
    """Policies that let nothing but the broker's filter ack on a probe."""

    def get_json(self, path: str, what: str, **_: object) -> object:
        return 0 if "messageTTL" in path else {}


class Consumer:
    def __init__(self, fail: list[bool]) -> None:
        self.fail, self.seeks = fail, 0

    def seek(self, _: object) -> None:
        if self.fail.pop(0):
            import pulsar

            raise pulsar.Timeout("Pulsar error: TimeOut")
        self.seeks += 1


class Client:
    def __init__(self, fail: list[bool]) -> None:
        self.consumer = Consumer(fail)

    def subscribe(self, *_: object, **__: object) -> Consumer:
        return self.consumer


def test_a_probe_the_broker_does_not_place_in_time_stops_nothing_and_is_placed_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """A thousand subscribes and seeks at once can time out on a busy broker: the mapping
    goes on (that partition's ids per id), and the probe is placed when next asked."""
    from cursorsync.pulsar.dispatch_probe import DispatchProbe

    client = Client([True, False])
    probe = DispatchProbe(client, cast(Any, Admin()), "cursorsync-probe")
    with caplog.at_level(logging.WARNING, logger="cursorsync.pulsar.dispatch_probe"):
        probe.place_all({TOPIC: Position(5, 1)})
    assert not probe.is_placed(TOPIC) and probe.vouches_after(TOPIC) is None
    assert probe.stats.place_failures == 1 and probe.stats.seeks == 0
    assert "1 of 1 probes were not placed" in caplog.text
    probe.place_all({TOPIC: Position(5, 1)})
    assert probe.vouches_after(TOPIC) == Position(5, 0) and probe.stats.seeks == 1
