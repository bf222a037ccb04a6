"""One writer per set of tables: a lease row in a small Delta table beside them.

Two jobs on one set of tables would each write batches, bind checkpoints and emit acks
from their own view of the tables: neither's idempotency holds against the other. So
``cursorsync run`` (and ``cursorsync retire``) first take the lease: one row in the Delta
table ``lease`` under ``tables.path`` naming the holder (a random id, the command, host,
pid, when it started, when it last renewed it, when it expires). The holder renews it
every :data:`RENEW_S` seconds, moving its expiry :data:`TTL_S` seconds past the renewal,
and releases it on a clean stop. Another process refuses to start while the row names a
holder that has neither released it nor let it expire; an expired lease is taken over
(and the log says so).

Every change is a Delta commit on the version just read, with no retry: the commit of
version N+1 is a put-if-absent of its log file, so of two processes that read version N,
one commits and the other fails and reads again. That is as atomic as the tables' own
writes (local files, HDFS, and object stores with conditional put: on S3, delta-rs's
conditional put or locking provider in ``tables.storage_options``).

Expiry compares the holder's written ``expires_at`` with the reader's clock: the hosts'
clocks must agree to well within :data:`TTL_S` (NTP). A holder that cannot renew before
its own expiry (storage unreachable, the process stalled) counts the lease as lost, and
so does one that finds another holder's row: :meth:`Lease.check` then raises, and the job
stops.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from cursorsync.errors import CursorSyncError

log = logging.getLogger(__name__)

#: The lease's Delta table, under ``tables.path``.
LEASE_TABLE = "lease"
LEASE_VERSION = 1
#: Seconds between renewals.
RENEW_S = 10.0
#: Seconds a lease lasts past its last renewal.
TTL_S = 60.0
#: Renewals between two vacuums of the lease table (each renewal leaves a file behind).
VACUUM_EVERY = 360
#: Commits on a contended lease before giving up (each loser reads again and decides anew).
ATTEMPTS = 5

SCHEMA = pa.schema([
    pa.field("lease_version", pa.int32(), nullable=False),
    pa.field("holder", pa.string(), nullable=False),
    pa.field("command", pa.string(), nullable=False),
    pa.field("host", pa.string(), nullable=False),
    pa.field("pid", pa.int64(), nullable=False),
    pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("renewed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("expires_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("released_at", pa.timestamp("us", tz="UTC"), nullable=True),
])
#: Few versions are kept: the lease is current state, not history.
TABLE_CONFIGURATION = {"delta.logRetentionDuration": "interval 1 hours",
                       "delta.deletedFileRetentionDuration": "interval 1 hours",
                       "delta.checkpointInterval": "100"}


class LeaseError(CursorSyncError):
    """The lease table cannot be read or written; names the table."""


class LeaseHeldError(LeaseError):
    """Another process holds the lease; names it."""


class LeaseLostError(LeaseError):
    """The lease was lost while held (another holder took it, or it expired unrenewed)."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The lease row: who holds it, since when, until when."""

    holder: str
    command: str
    host: str
    pid: int
    started_at: datetime
    renewed_at: datetime
    expires_at: datetime
    released_at: datetime | None = None

    def live(self, now: datetime) -> bool:
        """Held: neither released nor expired at ``now``."""
        return self.released_at is None and now < self.expires_at

    def describe(self) -> str:
        return (f"{self.command} on host {self.host}, pid {self.pid} (started "
                f"{_iso(self.started_at)}, renewed at {_iso(self.renewed_at)}, expires at "
                f"{_iso(self.expires_at)})")

    def table(self) -> pa.Table:
        row = {"lease_version": LEASE_VERSION, "holder": self.holder, "command": self.command,
               "host": self.host, "pid": self.pid, "started_at": self.started_at,
               "renewed_at": self.renewed_at, "expires_at": self.expires_at,
               "released_at": self.released_at}
        return pa.Table.from_pylist([row], schema=SCHEMA)

    @classmethod
    def parse(cls, rows: pa.Table, where: str) -> LeaseRecord | None:
        if rows.num_rows == 0:
            return None
        if rows.num_rows != 1:
            raise LeaseError(f"lease table {where} holds {rows.num_rows} rows, not one; "
                             "delete it when no job runs on these tables")
        r = rows.to_pylist()[0]
        if r.get("lease_version") != LEASE_VERSION:
            raise LeaseError(f"lease table {where} has lease_version {r.get('lease_version')!r}"
                             f", this cursorsync knows {LEASE_VERSION}")
        return cls(r["holder"], r["command"], r["host"], int(r["pid"]), r["started_at"],
                   r["renewed_at"], r["expires_at"], r["released_at"])


def lease_uri(tables_path: str) -> str:
    """The lease table's URI for delta-rs (Hadoop's ``s3a://`` spelled ``s3://``)."""
    root = tables_path.rstrip("/")
    if root.startswith("s3a://"):
        root = "s3://" + root[len("s3a://"):]
    elif "://" not in root:
        root = os.path.abspath(root)
    return f"{root}/{LEASE_TABLE}"


class Lease:
    """The lease on one set of tables, as one process takes, renews and releases it."""

    def __init__(self, tables_path: str, command: str, *,
                 storage_options: dict[str, str] | None = None, ttl_s: float = TTL_S,
                 renew_s: float = RENEW_S, now: Callable[[], datetime] = _utc_now,
                 host: str | None = None, pid: int | None = None) -> None:
        if not 0 < renew_s < ttl_s:
            raise ValueError(f"renewal every {renew_s} s must be shorter than the lease's "
                             f"{ttl_s} s")
        self.uri = lease_uri(tables_path)
        self.command, self.ttl, self.renew_s = command, timedelta(seconds=ttl_s), renew_s
        self._storage = dict(storage_options or {}) or None
        self._now = now
        self.holder = uuid.uuid4().hex
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        #: Our row as last committed (None: not held).
        self.record: LeaseRecord | None = None
        self._lost: str | None = None
        self._renewals = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading and committing

    def _read(self) -> tuple[DeltaTable | None, LeaseRecord | None]:
        try:
            dt = DeltaTable(self.uri, storage_options=self._storage)
        except TableNotFoundError:
            return None, None
        except (DeltaError, OSError) as err:
            raise LeaseError(f"lease table {self.uri} cannot be read: {_one_line(err)}") from err
        try:
            # Not to_pyarrow_table(): its scan threads can abort the process at its exit.
            rows = pa.table(QueryBuilder().register("lease", dt)
                            .execute("SELECT * FROM lease").read_all())
        except (DeltaError, OSError) as err:
            raise LeaseError(f"lease table {self.uri} cannot be read: {_one_line(err)}") from err
        return dt, LeaseRecord.parse(rows, self.uri)

    def current(self) -> LeaseRecord | None:
        """The lease row as it is now (None: never taken)."""
        return self._read()[1]

    def _commit(self, dt: DeltaTable | None, record: LeaseRecord) -> bool:
        """Write ``record`` as the version after ``dt``'s (creating the table when None);
        False when another commit got there first."""
        # No retry: delta-rs would otherwise commit a lost race as the next version (an
        # append, even for the table's creation).
        once = CommitProperties(max_commit_retries=0)
        try:
            if dt is None:
                write_deltalake(self.uri, record.table(), mode="error",
                                configuration=TABLE_CONFIGURATION, storage_options=self._storage,
                                commit_properties=once)
            else:
                write_deltalake(dt, record.table(), mode="overwrite", commit_properties=once)
        except CommitFailedError:
            return False
        except DeltaError as err:
            if dt is None and "already exists" in str(err):
                return False  # another process created it first
            raise LeaseError(f"lease table {self.uri} cannot be written: {_one_line(err)}") from err
        except OSError as err:
            raise LeaseError(f"lease table {self.uri} cannot be written: {_one_line(err)}") from err
        return True

    def _fresh(self, started: datetime | None = None) -> LeaseRecord:
        now = self._now()
        return LeaseRecord(self.holder, self.command, self.host, self.pid, started or now, now,
                           now + self.ttl)

    # -- the lease's life

    def _refuse_held(self, found: LeaseRecord | None) -> None:
        if found is not None and found.holder != self.holder and found.live(self._now()):
            raise LeaseHeldError(
                f"the tables at {self.uri.rsplit('/', 1)[0]} are in use by "
                f"{found.describe()}: one job at a time on a set of tables; stop it, or "
                f"wait until its lease expires")

    def refuse_if_held(self) -> None:
        """Raise :class:`LeaseHeldError` as :meth:`acquire` would, writing nothing."""
        self._refuse_held(self.current())

    def acquire(self) -> LeaseRecord:
        """Take the lease, or raise :class:`LeaseHeldError` naming its live holder."""
        for _ in range(ATTEMPTS):
            dt, found = self._read()
            self._refuse_held(found)
            mine = self._fresh()
            if self._commit(dt, mine):
                if found is not None and found.released_at is None and found.holder != self.holder:
                    log.warning("took over the lease on %s from %s: it expired unrenewed",
                                self.uri, found.describe())
                self.record, self._lost = mine, None
                log.info("lease on %s taken by %s", self.uri, mine.describe())
                return mine
        raise LeaseHeldError(f"lease table {self.uri}: {ATTEMPTS} commits in a row lost to "
                             "other processes; another job is starting on these tables")

    def renew(self) -> None:
        """Move the expiry on; :class:`LeaseLostError` when another holder has the row."""
        if self.record is None:
            raise LeaseLostError(f"lease on {self.uri} is not held")
        for _ in range(ATTEMPTS):
            dt, found = self._read()
            if found is None or found.holder != self.holder or found.released_at is not None:
                self._lose(f"the lease on {self.uri} is now "
                           + ("gone" if found is None else f"held by {found.describe()}"))
            mine = self._fresh(self.record.started_at)
            if self._commit(dt, mine):
                self.record = mine
                self._renewals += 1
                if self._renewals % VACUUM_EVERY == 0:
                    self._vacuum()
                return
        raise LeaseError(f"lease table {self.uri}: {ATTEMPTS} renewals in a row lost to other "
                         "commits")

    def release(self) -> None:
        """Mark the lease released, if it is still ours (a clean stop)."""
        self.stop_renewing()
        if self.record is None:
            return
        for _ in range(ATTEMPTS):
            dt, found = self._read()
            if found is None or found.holder != self.holder:
                break
            done = replace(found, released_at=self._now())
            if self._commit(dt, done):
                log.info("lease on %s released", self.uri)
                break
        self.record = None

    def _lose(self, why: str) -> None:
        self._lost = why
        self.record = None
        raise LeaseLostError(why)

    def _vacuum(self) -> None:
        try:
            DeltaTable(self.uri, storage_options=self._storage).vacuum(dry_run=False)
        except (DeltaError, OSError) as err:  # the next one will do
            log.warning("vacuum of lease table %s failed: %s", self.uri, err)

    # -- renewal in the background

    def start_renewing(self) -> None:
        """Renew every ``renew_s`` on a thread of its own until :meth:`release`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="cursorsync-lease",
                                        daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.renew_s + 30)
        self._thread = None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            record = self.record
            if record is None:
                return
            try:
                self.renew()
            except LeaseLostError as err:
                log.error("%s: stopping", err)
                return
            except LeaseError as err:
                if self._now() >= record.expires_at:
                    self._lost = (f"the lease on {self.uri} expired at "
                                  f"{_iso(record.expires_at)} before it could be renewed ({err})")
                    self.record = None
                    log.error("%s: stopping", self._lost)
                    return
                log.warning("lease not renewed, trying again in %.0f s: %s", self.renew_s, err)

    def check(self) -> None:
        """Raise :class:`LeaseLostError` once the lease is lost (the job then stops): found
        so by a renewal, or past its expiry with no renewal in (a renewal hanging on the
        storage counts as none)."""
        record = self.record
        if self._lost is None and record is not None and self._now() >= record.expires_at:
            self._lost = f"the lease on {self.uri} expired at {_iso(record.expires_at)} unrenewed"
        if self._lost is not None:
            raise LeaseLostError(f"{self._lost}; this job stops (another may be writing the "
                                 "tables)")


def _one_line(err: BaseException) -> str:
    """An engine's error in one line (delta-rs puts the OS error on a line of its own),
    so the command's ``error:`` line stays one."""
    return " ".join(str(err).split())


@contextmanager
def held(tables_path: str, command: str, *, storage_options: dict[str, str] | None = None,
         **kwargs: Any) -> Iterator[Lease]:
    """The lease, taken and renewed for the block, released after it (not after a crash:
    then it expires)."""
    lease = Lease(tables_path, command, storage_options=storage_options, **kwargs)
    lease.acquire()
    lease.start_renewing()
    try:
        yield lease
    finally:
        lease.release()


__all__ = ["LEASE_TABLE", "RENEW_S", "TTL_S", "Lease", "LeaseError", "LeaseHeldError",
           "LeaseLostError", "LeaseRecord", "held", "lease_uri"]
