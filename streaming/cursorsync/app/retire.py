"""Retiring a job: removing what it created on both clusters and in its storage.

What a job creates, and so what ``cursorsync retire`` removes:

* on the **source** cluster, ``cursorsync-mapping-source`` on each partition of the
  configured topics (the mapping reads the source with identity or snapshot evidence);
* on the **target** cluster, ``cursorsync-mapping-target`` on each partition, and
  ``cursorsync-probe`` where ``evidence.holes: probe`` placed its probe, and
  ``cursorsync-batches`` where a job carrying batch indexes was stopped while it read a
  batch;
* in **storage**, the Delta tables under ``tables.path`` (the lease's last) and the parts of
  ``spark.checkpoint_dir`` the job writes (each query's checkpoint, the builder's states,
  the cursor polls, the mapping's wake file); each directory is removed once empty.

Nothing else: never the synced subscriptions (the user's, even one the emitter created on
the target), never a topic or a message. Deleting a subscription is never forced, so one
with a consumer connected stays and is reported. Retiring takes the tables' lease
(:mod:`cursorsync.app.lease`) first: it refuses while a job runs on them, and no job starts
on them while it runs. A dry run reads the lease and lists, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pyarrow.fs as pafs

from cursorsync.app.connect import connections
from cursorsync.app.lease import LEASE_TABLE, Lease
from cursorsync.app.settings import MAPPING_SUBSCRIPTION_PREFIX, Config
from cursorsync.app.settings.clusters import ClusterConfig
from cursorsync.app.spark_checkpoint import filesystem
from cursorsync.app.streams import selection
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.cleanup import delete_subscription, subscriptions_of
from cursorsync.pulsar.dispatch_probe import PROBE_SUBSCRIPTION
from cursorsync.pulsar.index_acks import BATCH_READER_SUBSCRIPTION
from cursorsync.sync.follow import SYNC_WAKE
from cursorsync.sync.poll_health import POLLS_DIR
from cursorsync.tables.schema import TABLES

Side = Literal["source", "target"]

#: The job's own subscriptions, by the side of the sync they are on.
OWN_SUBSCRIPTIONS: dict[Side, tuple[str, ...]] = {
    "source": (f"{MAPPING_SUBSCRIPTION_PREFIX}-source",),
    "target": (f"{MAPPING_SUBSCRIPTION_PREFIX}-target", PROBE_SUBSCRIPTION,
               BATCH_READER_SUBSCRIPTION),
}
#: What the job writes under ``spark.checkpoint_dir`` (:mod:`cursorsync.app.queries`).
CHECKPOINT_PARTS = ("mapping", "sync", "builder-state", POLLS_DIR, "mapping-wake",
                    SYNC_WAKE)


class RetireError(CursorSyncError):
    """Some of what the job created could not be removed; the lines above say which."""


@dataclass(frozen=True, slots=True)
class Removal:
    """One thing the job created: a subscription on a topic partition of a cluster, or a
    table or checkpoint part in storage."""

    kind: Literal["subscription", "table", "checkpoint"]
    #: The subscription's, table's or checkpoint part's name.
    name: str
    #: The topic partition (subscriptions), else the full path.
    at: str
    #: The cluster (subscriptions): its name and side.
    cluster: str = ""
    side: str = ""

    def describe(self) -> str:
        if self.kind == "subscription":
            return (f"subscription {self.name} on {self.at} (cluster {self.cluster}, "
                    f"{self.side})")
        return f"{self.kind} {self.name} at {self.at}"


def _cluster(config: Config, side: Side) -> ClusterConfig:
    return config.source if side == "source" else config.target


def _subscriptions(config: Config, side: Side) -> list[Removal]:
    cluster = _cluster(config, side)
    with connections(cluster).admin_client() as admin:
        topics = selection(config).expand(admin)
        found = subscriptions_of(admin, topics, OWN_SUBSCRIPTIONS[side])
    return [Removal("subscription", sub, topic, cluster.name, side)
            for topic, subs in sorted(found.items()) for sub in subs]


def _storage(kind: Literal["table", "checkpoint"], root: str,
             parts: tuple[str, ...]) -> list[Removal]:
    fs, base = filesystem(root)
    infos = fs.get_file_info([f"{base}/{p}" for p in parts])
    return [Removal(kind, part, f"{root.rstrip('/')}/{part}")
            for part, info in zip(parts, infos, strict=True)
            if info.type != pafs.FileType.NotFound]


def plan(config: Config, *, keep_tables: bool = False) -> list[Removal]:
    """Everything the job created that is still there, in the order it is removed (the
    lease's table aside: :func:`retire` removes it last)."""
    out = _subscriptions(config, "source") + _subscriptions(config, "target")
    out += _storage("checkpoint", config.spark.checkpoint_dir, CHECKPOINT_PARTS)
    if not keep_tables:
        out += _storage("table", config.tables.path, TABLES)
    return out


def _remove(config: Config, item: Removal) -> bool:
    """Remove one item; False when it was gone already."""
    if item.kind == "subscription":
        side: Side = "source" if item.side == "source" else "target"
        with connections(_cluster(config, side)).admin_client() as admin:
            return delete_subscription(admin, item.at, item.name)
    fs, path = filesystem(item.at)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)
    else:
        return False
    return True


def _is_dir(root: str) -> bool:
    fs, path = filesystem(root)
    return bool(fs.get_file_info(path).type == pafs.FileType.Directory)


def _remove_if_empty(root: str) -> bool:
    """Remove ``root`` when nothing is left in it (an object store has no empty ones)."""
    fs, path = filesystem(root)
    if not _is_dir(root):
        return False
    if fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
        return False
    fs.delete_dir(path)
    return True


def retire(config: Config, *, dry_run: bool, echo: Callable[[str], None],
           keep_tables: bool = False) -> int:
    """List what the job created and, unless ``dry_run``, remove it, one line each through
    ``echo``; returns how many were listed. Raises :class:`RetireError` when some could not
    be removed (the rest are), :class:`~cursorsync.app.lease.LeaseHeldError` while a job
    holds the tables."""
    lease = Lease(config.tables.path, "cursorsync retire",
                  storage_options=dict(config.tables.storage_options) or None)
    existed = lease.current() is not None
    tables_there = _is_dir(config.tables.path)  # else the lease below makes the directory
    if dry_run:
        lease.refuse_if_held()
    else:
        lease.acquire()
        lease.start_renewing()
    lease_at = f"{config.tables.path.rstrip('/')}/{LEASE_TABLE}"
    try:
        items = plan(config, keep_tables=keep_tables)
        if existed and not keep_tables:
            items.append(Removal("table", LEASE_TABLE, lease_at))
        if not items:
            echo("nothing to remove: no subscription, table or checkpoint of this job is left")
        failed = 0
        for item in items:
            if dry_run:
                echo(f"would remove {item.describe()}")
                continue
            if item.name == LEASE_TABLE and item.kind == "table":
                lease.stop_renewing()
            try:
                gone = _remove(config, item)
            except (CursorSyncError, OSError) as err:
                failed += 1
                echo(f"not removed: {item.describe()}: {err}")
                continue
            echo(f"removed {item.describe()}" + ("" if gone else " (already gone)"))
        if failed:
            raise RetireError(f"{failed} of {len(items)} not removed (listed above); run "
                              "retire again once the cause is fixed")
        if not dry_run:
            if not existed:  # the lease retire took for itself goes, and what it made
                lease.release()
                _remove(config, Removal("table", LEASE_TABLE, lease_at))
            if _remove_if_empty(config.spark.checkpoint_dir):
                echo(f"removed directory {config.spark.checkpoint_dir} (empty)")
            kept = keep_tables and tables_there
            if not kept and _remove_if_empty(config.tables.path) and tables_there:
                echo(f"removed directory {config.tables.path} (empty)")
        return len(items)
    finally:
        if not dry_run:
            lease.release()  # nothing to do once its table is gone


__all__ = ["CHECKPOINT_PARTS", "OWN_SUBSCRIPTIONS", "Removal", "RetireError",
           "plan", "retire"]
