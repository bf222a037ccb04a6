"""The job running on the real test bed, and what the tests read of b's cursors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pulsar

from cursorsync.app.job import run_job
from cursorsync.core.positions import Position
from cursorsync_devtools.testbed import TestBed


@contextmanager
def running(config: Any) -> Iterator[None]:
    """The job as `cursorsync run` runs it, with its restarts: a query that fails on a
    broker's transient error (a topic unloaded or deleted under it) starts again from its
    checkpoint."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def main() -> None:
        try:
            run_job(config, stop_event=stop)
        except BaseException as err:  # reported below
            errors.append(err)

    thread = threading.Thread(target=main, name="cursorsync-job", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)
    assert not errors, errors


def mark_delete(bed: TestBed, cluster: str, topic: str, subscription: str) -> Position:
    return Position.parse(bed.internal_stats(cluster, topic)["cursors"][subscription][
        "markDeletePosition"])


def last_data_entry(bed: TestBed, topic: str) -> Position:
    """b's last dispatchable entry (markers after it do not count)."""
    probe = bed.client("b").subscribe(topic, "probe", receiver_queue_size=0,
                                      consumer_type=pulsar.ConsumerType.Shared)
    try:
        mid = probe.get_last_message_id()
    finally:
        probe.unsubscribe()
    return Position(mid.ledger_id(), mid.entry_id())
