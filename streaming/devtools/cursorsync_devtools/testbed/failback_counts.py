"""The failback's counts: every delivery on a after failing back, per message, against
what a's consumers acked before the failover and b's after it (see tests/e2e/test_failback.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Any

from cursorsync_devtools.testbed.failback import OnB, in_topic
from cursorsync_devtools.testbed.failover import FailoverCounts, _only, count
from cursorsync_devtools.testbed.readers import positions_by_key
from cursorsync_devtools.testbed.testbed import TestBed, TestBedError
from cursorsync_devtools.testbed.workload import Produced, WorkloadResult


@dataclass
class FailbackCounts(FailoverCounts):
    """Per-message counts of one subscription after failback to a. ``acked_on_source``
    counts the messages acked on either cluster; ``foreign`` the messages on a only."""

    acked_on_b: int = 0
    #: Acked on a before the failover, left unacked on b, not delivered on a: a's own ack
    #: stands (no loss: a's consumers had them).
    kept_acked_on_a: int = 0

    def add(self, other: FailoverCounts) -> FailbackCounts:
        return FailbackCounts(**{k: v + getattr(other, k) for k, v in asdict(self).items()})


def on_a(bed: TestBed, earlier: WorkloadResult, after: OnB) -> list[Produced]:
    """The messages published on b after the failover, each at its copy's entry on a
    (where its batch is one entry too); TestBedError if one is not on a."""
    keyed: Counter[str] = Counter()
    for m in [*earlier.messages, *after.messages, *after.foreign_on_a]:
        keyed[m.topic] += 1
    found = positions_by_key(bed, "a", dict(keyed))
    out = []
    for m in after.messages:
        if m.key not in found:
            raise TestBedError(f"{m.topic}: {m.key}, published on b at {m.position}, is not "
                               "on a")
        out.append(replace(m, position=found[m.key]))
    return out


def count_failback(earlier: WorkloadResult, after: OnB, b_messages_on_a: list[Produced],
                   topic: str, subscription: str, delivered_on_a: list[Any], *,
                   synced_at: float) -> dict[str, FailbackCounts]:
    """Counts per origin (``a``: the first phase's messages and a's foreign ones; ``b``:
    published on b after failover) for one topic's deliveries on a after failback (see the
    module doc). ``b_messages_on_a``: b's messages at their entries on a (:func:`on_a`);
    ``synced_at``: when b's cursors were observed for the failback job's last completed
    sync."""
    delivered_on_b = Counter(m.properties().get("key") for m in after.delivered[subscription])
    seen = Counter(m.properties().get("key") for m in delivered_on_a)
    on_a_before = earlier.acked.get(subscription, {})
    on_b = after.acked.get(subscription, {})
    # Acked by either side's consumers, and when (b's ack where it made one).
    acked = {**on_a_before, **on_b}
    out = {}
    for origin, messages, foreign in (
            ("a", _only(earlier, topic).messages,
             [f for f in after.foreign_on_a if in_topic(f.topic, topic)]),
            ("b", [m for m in b_messages_on_a if in_topic(m.topic, topic)], [])):
        truth = WorkloadResult(earlier.spec, messages, foreign, {subscription: acked})
        c = FailbackCounts(**asdict(count(truth, subscription, delivered_on_a,
                                          synced_at=synced_at)))
        for m in messages:
            b_acked = m.key in on_b or (m.key in on_a_before and not delivered_on_b[m.key])
            c.acked_on_b += b_acked
            c.kept_acked_on_a += (m.key in on_a_before and not b_acked and not seen[m.key])
        out[origin] = c
    return out


#: The rows of the failback table, in order, with their labels.
FAILBACK_ROWS = (
    ("messages", "messages"),
    ("acked_on_source", "acked (on a before failover, or on b after)"),
    ("acked_on_b", "  acked on b"),
    ("kept_acked_on_a", "  acked on a before, unacked on b, not again on a"),
    ("deliveries", "deliveries on a after failback"),
    ("duplicates", "duplicates (acked, delivered on a)"),
    ("partial_batch", "  of batches not wholly acked"),
    ("chunked", "  chunked messages"),
    ("acked_after_sync", "  acked on b after the last sync"),
    ("unexplained", "  unexplained"),
    ("losses", "losses (acked nowhere, never delivered on a)"),
    ("foreign", "foreign messages on a (published on a only)"),
    ("foreign_acked", "foreign messages acked on a"),
)

#: The rows of the failover table (a -> b), counted from what b's consumers got.
FAILOVER_ROWS = (
    ("messages", "messages"),
    ("acked_on_source", "acked on a"),
    ("deliveries", "deliveries on b after failover"),
    ("duplicates", "duplicates (acked on a, delivered on b)"),
    ("partial_batch", "  of partially acked batches"),
    ("chunked", "  chunked messages"),
    ("acked_after_sync", "  acked after the last sync"),
    ("unexplained", "  unexplained"),
    ("losses", "losses (not acked on a, never delivered)"),
    ("foreign", "foreign messages on b"),
    ("foreign_acked", "foreign messages acked on b"),
)


def render(columns: dict[str, dict[str, int]], rows: tuple[tuple[str, str], ...]) -> str:
    """A text table: one column per entry of ``columns`` (``to_dict`` counts)."""
    table = [["", *columns]] + [[label, *(str(c[name]) for c in columns.values())]
                                for name, label in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                               for i, c in enumerate(r)) for r in table)


def failover_counts(earlier: WorkloadResult, after: OnB, subscription: str,
                    topics: list[str]) -> FailoverCounts:
    """The failover a -> b, counted from what b's consumers were delivered: the first
    phase's messages (keys name their topic, so one list serves every topic)."""
    total = FailoverCounts()
    for topic in topics:
        total = total.add(count(_only(earlier, topic), subscription,
                                after.delivered[subscription], synced_at=earlier.last_ack_at))
    return total
