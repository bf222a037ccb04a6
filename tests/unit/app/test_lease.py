"""The tables' single-writer lease (cursorsync.app.lease) on a local delta-rs table: refusal
naming the holder, renewal, expiry and takeover, release, two contenders at once, and
`cursorsync run` refused while another process holds it."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import cursorsync.app.cli as cli
from cursorsync.app import lease as lease_module
from cursorsync.app.lease import (
    Lease,
    LeaseError,
    LeaseHeldError,
    LeaseLostError,
    LeaseRecord,
    held,
    lease_uri,
)
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH

T0 = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def lease(path: Path, clock: Clock, *, host: str = "host-a", pid: int = 11,
          command: str = "cursorsync run") -> Lease:
    return Lease(str(path), command, ttl_s=60, renew_s=10, now=clock, host=host, pid=pid)


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    clock = Clock()
    first = lease(tmp_path, clock)
    first.acquire()
    clock.advance(5)
    with pytest.raises(LeaseHeldError) as err:
        lease(tmp_path, clock, host="host-b", pid=22).acquire()
    message = str(err.value)
    assert message == (
        f"the tables at {tmp_path} are in use by cursorsync run on host host-a, pid 11 "
        "(started 2026-05-06T07:08:09Z, renewed at 2026-05-06T07:08:09Z, expires at "
        "2026-05-06T07:09:09Z): one job at a time on a set of tables; stop it, or wait "
        "until its lease expires")
    assert "\n" not in message
    assert first.current() == first.record  # the refused one wrote nothing


def test_renewal_moves_the_expiry_and_keeps_others_out_past_the_first_one(
        tmp_path: Path) -> None:
    clock = Clock()
    first = lease(tmp_path, clock)
    first.acquire()
    for _ in range(10):  # 100 s: past the first expiry, never past a renewed one
        clock.advance(10)
        first.renew()
    row = first.current()
    assert row is not None and row.started_at == T0
    assert row.renewed_at == T0 + timedelta(seconds=100)
    assert row.expires_at == T0 + timedelta(seconds=160)
    clock.advance(59)
    with pytest.raises(LeaseHeldError, match="renewed at 2026-05-06T07:09:49Z"):
        lease(tmp_path, clock, host="host-b").acquire()


def test_an_expired_lease_is_taken_over_and_the_log_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    first = lease(tmp_path, clock)
    first.acquire()
    clock.advance(60)  # expires_at is reached: no longer live
    second = lease(tmp_path, clock, host="host-b", pid=22)
    with caplog.at_level(logging.WARNING, logger="cursorsync.app.lease"):
        second.acquire()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line.startswith(f"took over the lease on {lease_uri(str(tmp_path))} from "
                           "cursorsync run on host host-a, pid 11")
    assert line.endswith("it expired unrenewed")
    current = second.current()
    assert current is not None and (current.host, current.pid) == ("host-b", 22)
    # The old holder learns at its next renewal that it has lost the lease, and stops.
    with pytest.raises(LeaseLostError, match="held by cursorsync run on host host-b"):
        first.renew()
    with pytest.raises(LeaseLostError, match="this job stops"):
        first.check()
    first.release()  # leaves the new holder's row alone
    assert second.current() == current


def test_a_released_lease_is_taken_at_once_without_a_takeover(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    first = lease(tmp_path, clock)
    first.acquire()
    clock.advance(3)
    first.release()
    row = first.current()
    assert row is not None and row.released_at == T0 + timedelta(seconds=3)
    with caplog.at_level(logging.WARNING, logger="cursorsync.app.lease"):
        lease(tmp_path, clock, host="host-b").acquire()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("expired_lease", [False, True], ids=["no-lease-yet", "expired"])
def test_of_two_contenders_reading_the_same_version_exactly_one_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, expired_lease: bool) -> None:
    clock = Clock()
    if expired_lease:
        lease(tmp_path, clock, host="gone").acquire()
        clock.advance(120)
    barrier = threading.Barrier(2)
    read = Lease._read
    waited: set[str] = set()

    def read_then_wait(self: Lease) -> Any:
        found = read(self)
        if self.host.startswith("contender") and self.host not in waited:
            waited.add(self.host)
            barrier.wait(timeout=30)  # both read the same version before either commits
        return found

    monkeypatch.setattr(Lease, "_read", read_then_wait)
    outcomes: dict[str, str] = {}

    def contend(name: str) -> None:
        try:
            lease(tmp_path, clock, host=name).acquire()
            outcomes[name] = "won"
        except LeaseHeldError as err:
            outcomes[name] = str(err)

    threads = [threading.Thread(target=contend, args=(f"contender-{i}",)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["contender-1", "contender-2"]
    winners = [n for n, o in outcomes.items() if o == "won"]
    assert len(winners) == 1, outcomes
    (loser,) = set(outcomes) - set(winners)
    assert f"in use by cursorsync run on host {winners[0]}," in outcomes[loser]
    current = Lease(str(tmp_path), "probe", now=clock).current()
    assert current is not None and current.host == winners[0]


def test_renewing_in_the_background_then_releasing(tmp_path: Path) -> None:
    with held(str(tmp_path), "cursorsync run", ttl_s=2.0, renew_s=0.2) as mine:
        first = mine.current()
        assert first is not None
        time.sleep(1.0)
        later = mine.current()
        assert later is not None and later.renewed_at > first.renewed_at
        assert later.expires_at - later.renewed_at == timedelta(seconds=2)
        mine.check()
    row = mine.current()
    assert row is not None and row.released_at is not None
    Lease(str(tmp_path), "cursorsync run").acquire()  # free at once


def test_a_lease_that_cannot_be_renewed_before_it_expires_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    mine = Lease(str(tmp_path), "cursorsync run", ttl_s=1.0, renew_s=0.05, now=clock)
    mine.acquire()

    def unreachable(self: Lease) -> Any:
        raise LeaseError(f"lease table {self.uri} cannot be read: connection refused")

    monkeypatch.setattr(Lease, "_read", unreachable)
    mine.start_renewing()
    time.sleep(0.3)
    mine.check()  # failing renewals, but not expired yet: it holds on
    clock.advance(1)
    deadline = time.monotonic() + 10
    while mine.record is not None:  # the renewals give up on it
        assert time.monotonic() < deadline, "the renewals did not give the lease up"
        time.sleep(0.05)
    with pytest.raises(LeaseLostError) as err:
        mine.check()
    assert "expired at 2026-05-06T07:08:10Z before it could be renewed" in str(err.value)
    assert "connection refused" in str(err.value)
    mine.release()


def test_a_lease_past_its_expiry_without_a_renewal_is_lost_even_while_one_hangs(
        tmp_path: Path) -> None:
    clock = Clock()
    mine = lease(tmp_path, clock)
    mine.acquire()
    clock.advance(59)
    mine.check()
    clock.advance(1)  # no renewal came back in time (none ran here)
    with pytest.raises(LeaseLostError, match="expired at 2026-05-06T07:09:09Z unrenewed"):
        mine.check()


def test_a_lease_row_of_another_version_is_an_error_naming_the_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = lease(tmp_path, Clock())
    mine.acquire()
    monkeypatch.setattr(lease_module, "LEASE_VERSION", 2)  # a newer cursorsync reads it
    with pytest.raises(LeaseError, match=r"lease table .*/lease has lease_version 1, this "
                                         r"cursorsync knows 2"):
        mine.current()


def test_a_renewal_period_not_shorter_than_the_lease_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shorter than the lease"):
        Lease(str(tmp_path), "cursorsync run", ttl_s=10, renew_s=10)


def test_records_round_trip_through_the_table() -> None:
    rec = LeaseRecord("h", "cursorsync run", "host", 7, T0, T0, T0 + timedelta(seconds=60))
    assert LeaseRecord.parse(rec.table(), "x") == rec
    assert rec.live(T0) and not rec.live(T0 + timedelta(seconds=60))
    assert not LeaseRecord("h", "c", "host", 7, T0, T0, T0 + timedelta(seconds=60),
                           released_at=T0).live(T0)


@pytest.mark.usefixtures("restore_logging")
def test_cursorsync_run_is_refused_while_another_process_holds_the_lease(
        tmp_path: Path) -> None:
    data = yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())
    data["tables"]["path"] = str(tmp_path / "tables")
    data["spark"]["checkpoint_dir"] = str(tmp_path / "checkpoints")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    other = Lease(str(tmp_path / "tables"), "cursorsync run", host="driver-1", pid=4242)
    other.acquire()
    result = CliRunner().invoke(cli.app, ["run", "-c", str(config), "--skip-check"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()  # the job's log lines, then why it did not start
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:] and errors[0].startswith("error: the tables at "), lines
    assert "in use by cursorsync run on host driver-1, pid 4242 (started " in errors[0]
    assert not (tmp_path / "checkpoints").exists()  # refused before anything started
    assert other.current() == other.record
