"""Transactional messages on the test bed: committed, aborted and plain ones in one topic.

The Python client has no transactions, so the distribution's own Java client sends them
(``TxnProduce.java``, run from source by ``java`` with the distribution's jars). The
clusters must run with ``transactionCoordinatorEnabled`` (:data:`TRANSACTION_SETTINGS`).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cursorsync.core.positions import Position
from cursorsync_devtools.testbed.distribution import ensure_pulsar, require_java
from cursorsync_devtools.testbed.testbed import TestBed, TestBedError

#: Broker settings a cluster needs for transactions (standalone sets up the coordinator).
TRANSACTION_SETTINGS = {"transactionCoordinatorEnabled": "true"}

_SOURCE = Path(__file__).with_name("TxnProduce.java")
#: A line the tool prints per message (the client's own log lines are anything else).
_SENT = re.compile(r"(\S+) ([cap]) (\d+:\d+)")


@dataclass(frozen=True)
class TxnMessage:
    """One message sent: its key (``properties["key"]``), how (``c`` in a transaction
    committed, ``a`` aborted, ``p`` plain) and its entry on the cluster it was sent to."""

    key: str
    kind: str
    position: Position


def send_transactions(bed: TestBed, cluster: str, topic: str, plan: str, *,
                      prefix: str = "t", timeout_s: float = 180.0) -> list[TxnMessage]:
    """Send ``plan`` (``c3,a2,p1``: 3 messages committed, 2 aborted, 1 plain, in that order)
    to ``topic`` on ``cluster``; the messages as sent."""
    java = require_java()
    cmd = [java, "-cp", str(ensure_pulsar() / "lib" / "*"), str(_SOURCE),
           bed.service_url(cluster), bed.topic(topic), plan, prefix]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired as err:
        raise TestBedError(f"sending transactions to {topic} on {cluster} took over "
                           f"{timeout_s:.0f} s") from err
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise TestBedError(f"sending transactions to {topic} on {cluster} failed "
                           f"(exit {done.returncode}):\n{tail}")
    return [TxnMessage(m[1], m[2], Position.parse(m[3]))
            for m in map(_SENT.fullmatch, done.stdout.splitlines()) if m]


__all__ = ["TRANSACTION_SETTINGS", "TxnMessage", "send_transactions"]
