"""The demo's report: failover counts per subscription type for cursorsync and for
Pulsar's built-in, with the forecast, and the table ``cursorsync-dev demo`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The rows of the failover table, in order, with their labels.
TABLE_ROWS = (
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


#: Below the partially acked batches' duplicates, how many of them a restart on a (no
#: failover) delivers again too.
SOURCE_RESTART_ROW = "    also again on a restart on a, no failover"

#: Below each measured kind, what the forecast said of it (cursorsync's columns only).
FORECAST_ROW = "    forecast before failover"


@dataclass
class DemoReport:
    """Failover counts per subscription type, for cursorsync and for the built-in."""

    topics: list[str]
    evidence: list[str]
    pulsar_version: str
    cursorsync: dict[str, dict[str, int]]
    builtin: dict[str, dict[str, int]]
    #: From the workload's last ack on a until the sync's progress showed it caught up.
    sync_caught_up_s: float
    #: From the same moment until the built-in's cursors on b last moved (negative: they
    #: last moved before it, and nothing after the last ack moved them; None: not watched).
    builtin_settled_s: float | None
    sync_batches: int
    mapping_batches: int
    seconds: float
    workload: dict[str, Any] = field(default_factory=dict)
    #: Restarts of the job from its checkpoints, and how many of them a crash the caller
    #: asked for caused (``crash_sync_batch``, ``crash_mapping_claims``).
    restarts: int = 0
    injected_crashes: int = 0
    #: Per query (mapping, sync): batches, mean seconds, and the histogram bucket that
    #: holds the 99th percentile (from the job's own metrics).
    batch_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Per query, each phase's mean seconds per batch (``demo.phase_seconds``).
    phase_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Per query, the CPU seconds its thread spent in each phase, mean per batch, where
    #: measured (``batch_figures.phase_cpu_seconds``).
    phase_cpu_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Per query, Spark's phases of its batches since the workload began, p50 and p90 ms
    #: (``batch_figures.trigger_phases``): the sources' new offsets, the logs, the batch.
    spark_phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: b's markDeletePosition per sync subscription and topic partition when the job
    #: stopped, before the failover check's consumers (whose dispatchers ack the markers
    #: they read) connect: what the sync alone made of b's cursors.
    target_marks: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Admin requests the mapping made to classify skipped target ids, by kind.
    skipped_id_requests: dict[str, float] = field(default_factory=dict)
    #: Per subscription type, cursorsync's redelivery forecast taken when the job stopped,
    #: by cause (``Figure.to_dict``).
    forecast: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: Whether a's consumers acked by batch index, on brokers that keep such acks.
    batch_index_acks: bool = False
    #: Per subscription type, what a restart on a (instead of a failover) delivers again,
    #: counted alike: for cursorsync's and for the built-in's subscription.
    source_restart: dict[str, dict[str, int]] = field(default_factory=dict)
    builtin_source_restart: dict[str, dict[str, int]] = field(default_factory=dict)
    #: CPU-seconds of the workload's own process (its producers and consumers).
    workload_cpu_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    def total(self, which: str, name: str) -> int:
        side = self.cursorsync if which == "cursorsync" else self.builtin
        return sum(counts[name] for counts in side.values())

    def table(self) -> str:
        from cursorsync.app.render import forecast_cell
        from cursorsync_devtools.testbed.failover import FORECAST_CAUSES, figure_of

        kinds = sorted(self.cursorsync)
        head = [""] + [f"cursorsync {k}" for k in kinds] + [f"built-in {k}" for k in kinds]
        rows = [head]
        for name, label in TABLE_ROWS:
            rows.append([label] + [str(self.cursorsync[k][name]) for k in kinds]
                        + [str(self.builtin[k][name]) for k in kinds])
            if name in FORECAST_CAUSES and self.forecast:
                rows.append([FORECAST_ROW] + [forecast_cell(figure_of(
                    self.forecast[k][FORECAST_CAUSES[name]])) for k in kinds] + [""] * len(kinds))
            if name == "partial_batch" and self.source_restart:
                rows.append([SOURCE_RESTART_ROW]
                            + [str(self.source_restart[k]["partial_batch"]) for k in kinds]
                            + [str(self.builtin_source_restart.get(k, {}).get(
                                "partial_batch", "")) for k in kinds])
        settled = ("not watched" if self.builtin_settled_s is None
                   else f"{self.builtin_settled_s:.1f} s" if self.builtin_settled_s >= 0
                   else "no move")
        rows.append(["b's cursor last moved, after the last ack"]
                    + [f"{self.sync_caught_up_s:.1f} s"] * len(kinds) + [settled] * len(kinds))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                           for i, c in enumerate(r)) for r in rows]
        acks = ("batch-index acks on (brokers and a's consumers): a partially acked batch's "
                "acked messages are acked on a's broker" if self.batch_index_acks else
                "batch-index acks off (Pulsar 4.0's default): a's broker holds no ack for a "
                "partially acked batch's acked messages")
        intro = (f"failover to b: {', '.join(self.topics)}; Apache Pulsar {self.pulsar_version}; "
                 f"evidence {', '.join(self.evidence)}\n{acks}\n"
                 f"{self.mapping_batches} mapping and {self.sync_batches} sync batches, "
                 f"{self.seconds:.0f} s in all\n")
        return intro + "\n".join(lines)


__all__ = ["FORECAST_ROW", "SOURCE_RESTART_ROW", "TABLE_ROWS", "DemoReport"]
