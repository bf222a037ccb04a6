"""The failover gate: whether failing a subscription over now redelivers only what
cursorsync cannot carry over, read from the status rows (``cursorsync status --ready``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cursorsync.app.status import StatusRow
from cursorsync.sync.poll_health import PollHealth


@dataclass(frozen=True)
class PartitionReadiness:
    """Whether failing one (topic partition, subscription) over now redelivers only what
    cursorsync cannot carry over (partially acked batches, chunks), and why not."""

    row: StatusRow
    reasons: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.row.topic, "partition": self.row.partition,
                "partition_topic": self.row.key.concrete_topic(),
                "subscription": self.row.subscription, "ready": self.ready,
                "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Readiness:
    """The failover gate: ready when every partition of every subscription shown is."""

    partitions: tuple[PartitionReadiness, ...]
    #: What makes every partition not ready at once (the source polls failing).
    blockers: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        return (bool(self.partitions) and not self.blockers
                and all(p.ready for p in self.partitions))

    def not_ready(self) -> dict[str, int]:
        """Per subscription, how many of its partitions are not ready (0: ready)."""
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.row.subscription] = out.get(p.row.subscription, 0) + (not p.ready)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "blockers": list(self.blockers),
                "subscriptions": [{"subscription": s, "ready": n == 0, "partitions_not_ready": n}
                                  for s, n in sorted(self.not_ready().items())],
                "partitions": [p.to_dict() for p in self.partitions]}


def readiness(rows: Iterable[StatusRow], now: datetime, max_age_s: float,
              polls: PollHealth | None = None) -> Readiness:
    """Each partition's readiness for a failover now: its last sync acked every acked
    source entry the mapping covers (outcome ``exact``), nothing acked on the source waits
    unmapped, it was no dry run, and it is at most ``max_age_s`` old (an older one says
    nothing of what the source acked since). No rows at all is not ready, nor is anything
    while the source's cursor polls fail (``polls``, when known): the tables cannot say
    what the source acked since."""
    out = []
    for r in rows:
        reasons: list[str] = []
        if r.emitted_at is None:
            reasons.append("never synced")
        else:
            if r.dry_run:
                reasons.append("dry run: nothing acked on the target")
            elif r.outcome != "exact":
                reasons.append(f"last sync {r.outcome}")
            if r.unmapped_acked_entries:
                reasons.append(f"{r.unmapped_acked_entries} source-acked entries unmapped")
            age = (now - r.emitted_at).total_seconds()
            if age > max_age_s:
                reasons.append(f"last synced {age:.0f} s ago (more than {max_age_s:g} s)")
        out.append(PartitionReadiness(r, tuple(reasons)))
    blockers = () if polls is None or not polls.failing else (polls_failing(polls),)
    return Readiness(tuple(out), blockers)


def polls_failing(polls: PollHealth) -> str:
    """One line on the source's cursor polls failing."""
    since = polls.failing_since.isoformat(timespec="seconds") if polls.failing_since else "?"
    return (f"the source's cursor polls fail since {since} ({polls.failures} in a row): "
            f"{polls.error}")
