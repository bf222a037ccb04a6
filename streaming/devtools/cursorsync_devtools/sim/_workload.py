"""The knobs of a simulated two-cluster workload, validated once."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from cursorsync.errors import ConfigError

SkippableFrom = Literal["markers", "reader-holes"]
TargetAckMode = Literal["individual", "cumulative"]
TargetStateFrom = Literal["plan", "broker"]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Everything that shapes one simulated run; the same value always gives the same run.

    Times are milliseconds on one discrete clock shared by both clusters.
    ``messages`` counts every message produced on the source across all
    partitions. Ranges written as ``(lo, hi)`` are inclusive and drawn uniformly.
    """

    seed: int = 0
    partitions: int = 1
    messages: int = 40_000

    # -- production on A
    entry_interval_ms: float = 10.0
    batch_probability: float = 0.5
    batch_size: tuple[int, int] = (2, 10)
    unreplicated_rate: float = 0.01

    # -- managed ledgers (entries per ledger before rollover), ledger id gaps
    ledger_entries_a: tuple[int, int] = (300, 900)
    ledger_entries_b: tuple[int, int] = (200, 700)
    ledger_id_gap: tuple[int, int] = (1, 40)

    # -- production directly on B
    foreign_rate_per_s: float = 2.0

    # -- replicated-subscription markers (PIP-33): snapshot frequency on both clusters
    marker_interval_ms: int = 1000
    snapshot_timeout_ms: int = 30_000
    snapshot_cache_size: int = 10

    # -- consumers on A
    consumer_delay_ms: int = 5
    out_of_order_window_ms: int = 300
    hole_probability: float = 0.002
    hole_lifetime_ms: int = 20_000
    partial_batch_probability: float = 0.02
    cumulative_ack_probability: float = 0.0

    # -- replication A -> B (and the marker back channel B -> A)
    replication_lag_ms: int = 50
    replication_jitter_ms: int = 20
    #: (start_ms, duration_ms): A -> B replication stalls; entries arrive when it ends.
    backlog_bursts: tuple[tuple[int, int], ...] = ((8_000, 35_000),)

    # -- cursorsync
    sync_interval_ms: int = 1000
    #: Delay between observing the source cursor and the acks landing on B.
    sync_lag_ms: int = 100
    #: The mapping builder knows target entries written up to this long before a sync.
    mapping_lag_ms: int = 0
    #: Fraction of replicated entries whose evidence never reaches the mapping.
    evidence_drop: float = 0.0
    #: Map replicated markers too (else their target copies are only skippable).
    map_markers: bool = False
    skippable_from: SkippableFrom = "markers"
    target_ack_mode: TargetAckMode = "individual"
    #: Which target cursor the next translation starts from: the last plan or B's real cursor.
    target_state_from: TargetStateFrom = "plan"

    #: Failover instant; None means 80% of the shortest partition's production span.
    failover_ms: int | None = None

    def __post_init__(self) -> None:
        bad: list[str] = []

        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                bad.append(f"{name}={getattr(self, name)!r} ({why})")

        check(self.partitions >= 1, "partitions", "at least 1")
        check(self.messages >= self.partitions, "messages", "at least one per partition")
        check(self.entry_interval_ms > 0, "entry_interval_ms", "must be > 0")
        for name in ("batch_probability", "unreplicated_rate", "hole_probability",
                     "partial_batch_probability", "cumulative_ack_probability", "evidence_drop"):
            v = getattr(self, name)
            check(0.0 <= v <= 1.0, name, "a probability in [0, 1]")
        for name, low in (("batch_size", 2), ("ledger_entries_a", 1), ("ledger_entries_b", 1),
                          ("ledger_id_gap", 1)):
            lo, hi = getattr(self, name)
            check(low <= lo <= hi, name, f"(lo, hi) with {low} <= lo <= hi")
        for name in ("marker_interval_ms", "snapshot_timeout_ms", "snapshot_cache_size",
                     "sync_interval_ms"):
            check(getattr(self, name) > 0, name, "must be > 0")
        for name in ("consumer_delay_ms", "out_of_order_window_ms", "hole_lifetime_ms",
                     "replication_lag_ms", "replication_jitter_ms", "sync_lag_ms",
                     "mapping_lag_ms", "foreign_rate_per_s"):
            check(getattr(self, name) >= 0, name, "must be >= 0")
        check(all(d >= 0 for _, d in self.backlog_bursts), "backlog_bursts",
              "durations must be >= 0")
        check(self.skippable_from in ("markers", "reader-holes"), "skippable_from",
              "valid values are: markers, reader-holes")
        check(self.target_ack_mode in ("individual", "cumulative"), "target_ack_mode",
              "valid values are: individual, cumulative")
        check(self.target_state_from in ("plan", "broker"), "target_state_from",
              "valid values are: plan, broker")
        check(self.failover_ms is None or self.failover_ms > 0, "failover_ms", "must be > 0")
        if bad:
            raise ConfigError("invalid Workload: " + "; ".join(bad))

    def to_dict(self) -> dict[str, object]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(v: object) -> object:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v
