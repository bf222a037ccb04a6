"""The text tables the demo's and benchmarks' commands print."""

from __future__ import annotations

from typing import Any

from cursorsync.app.render import format_table
from cursorsync_devtools.sim import FailoverReport


def failover_table(report: FailoverReport) -> str:
    """The FailoverReport side by side: cursorsync vs Pulsar's replicated subscriptions."""
    cs, bi, w = report.cursorsync, report.builtin, report.workload
    lines = [
        ("messages produced by failover", cs.messages_total, bi.messages_total),
        ("acked on source", cs.acked_on_source, bi.acked_on_source),
        ("replicated to target", cs.on_target, bi.on_target),
        ("delivered again after switch", cs.redelivered, bi.redelivered),
        ("duplicates", cs.duplicates, bi.duplicates),
        ("  in partly acked batches", cs.partial_batch_duplicates, bi.partial_batch_duplicates),
        ("  acked after the last sync", cs.duplicates_after_last_sync,
         bi.duplicates_after_last_sync),
        ("  unexplained", cs.duplicates_unexplained, bi.duplicates_unexplained),
        ("losses", cs.losses, bi.losses),
    ]
    head = (f"failover at {report.failover_ms} ms (seed {w.seed}, {w.partitions} "
            f"partition{'s' if w.partitions != 1 else ''}, {w.messages} messages; "
            f"{report.messages_in_flight} still in flight, "
            f"{report.messages_unreplicated} never replicated)")
    table = format_table(("", "CURSORSYNC", "BUILT-IN"), lines, right=(1, 2))
    s = report.sync
    tail = (f"cursorsync: {s.syncs} syncs, {s.entries_acked} entries acked, "
            f"{s.unsafe_entries_refused} unsafe acks refused")
    return f"{head}\n\n{table}\n\n{tail}"


def layout_table(result: dict[str, Any], *, rows: int, repeat: int) -> str:
    """``bench layout``: a row per entry against layout=arrow, medians side by side."""
    lines = [(figure.removeprefix("median_"), result[figure]["rows"], result[figure]["arrow"],
              result["ratio_" + figure.removeprefix("median_")])
             for figure in ("median_wall_s", "median_jvm_cpu_s", "median_driver_cpu_s")]
    head = (f"{rows} evidence rows, {result['partitions']} partitions, layouts alternated "
            f"{repeat} times (medians)")
    table = format_table(("FIGURE", "ROW PER ENTRY", "LAYOUT=ARROW", "RATIO"), lines,
                         right=(1, 2, 3))
    return f"{head}\n{table}"
