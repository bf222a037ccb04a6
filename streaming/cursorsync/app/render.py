"""``status`` and ``lookup`` as text tables and as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime

from cursorsync.app.forecast import CAUSES, Figure, PartitionForecast, by_subscription
from cursorsync.app.lookup import LookupResult
from cursorsync.app.readiness import Readiness, polls_failing
from cursorsync.app.status import StatusRow, iso_time, subscription_summaries
from cursorsync.core.records import PartitionKey
from cursorsync.sync.poll_health import PollHealth


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Iterable[int] = ()
) -> str:
    """Plain-text columns, padded to the widest cell; ``right`` columns are right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    align_right = set(right)

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if i in align_right else v.ljust(w)
                  for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return "  ".join(padded).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


_STATUS_HEADERS = (
    "TOPIC", "SUBSCRIPTION", "SOURCE_MD", "RANGES", "TARGET_MD", "BUILTIN_MD", "OUTCOME",
    "UNMAPPED",
    "REWOUND", "LAG_MS", "LAST_SYNC", "SEGMENTS", "MAPPED", "LAST_MAPPED", "SKIPPED_WAITING",
)
_SUMMARY_HEADERS = (
    "SUBSCRIPTION", "PARTITIONS", "NEVER_SYNCED", "UNMAPPED", "REWOUND", "MAX_LAG_MS",
    "OLDEST_SYNC", "SKIPPED_WAITING",
)


def render_status_table(rows: Sequence[StatusRow]) -> str:
    """The per-partition table, then the per-subscription summary."""
    if not rows:
        return "no subscriptions recorded (no sync_progress or cursor_states rows match)"
    table = format_table(_STATUS_HEADERS, [
        (r.key.concrete_topic(), r.subscription, r.source_mark_delete, r.source_ranges,
         r.target_mark_delete, r.builtin_mark_delete,
         None if r.outcome is None else r.outcome + (
             f" ({r.planned_outcome} planned)" if r.dry_run else ""),
         r.unmapped_acked_entries, r.rewound_entries, r.lag_ms, r.emitted_at, r.segments,
         r.mapped_entries, r.last_mapped_source, r.skipped_waiting)
        for r in rows
    ], right=(3, 7, 8, 9, 11, 12, 14))
    summary = format_table(_SUMMARY_HEADERS, [
        (s.subscription + (" (dry-run)" if s.dry_run else ""), s.partitions, s.never_synced,
         s.unmapped_acked_entries, s.rewound_entries, s.max_lag_ms, s.oldest_sync,
         s.skipped_waiting)
        for s in subscription_summaries(rows)
    ], right=(1, 2, 3, 4, 5, 7))
    return f"{table}\n\n{summary}"


def status_json(rows: Sequence[StatusRow], polls: PollHealth | None = None) -> str:
    """``{"subscriptions": [summary...], "partitions": [row...], "source_polls": ...}``,
    indented; ``source_polls`` is null where the driver's checkpoint is not readable."""
    return json.dumps({
        "subscriptions": [s.to_dict() for s in subscription_summaries(rows)],
        "partitions": [r.to_dict() for r in rows],
        "source_polls": None if polls is None else polls.to_dict(),
    }, indent=2)


def render_polls(polls: PollHealth | None) -> str | None:
    """The line under the status tables when the source's cursor polls fail."""
    return None if polls is None or not polls.failing else f"WARNING: {polls_failing(polls)}"


def render_readiness(gate: Readiness) -> str:
    """One line for the verdict, then each partition that is not ready and why."""
    if not gate.partitions:
        return "NOT READY: no subscriptions recorded (no sync_progress or cursor_states rows)"
    waiting = [p for p in gate.partitions if not p.ready]
    if not waiting and not gate.blockers:
        return f"READY: {len(gate.partitions)} partitions of {len(gate.not_ready())} " \
               f"subscriptions synced exactly"
    lines = ([f"NOT READY: {b}" for b in gate.blockers] if gate.blockers
             else [f"NOT READY: {len(waiting)} of {len(gate.partitions)} partitions"])
    lines += [f"  {p.row.key.concrete_topic()} {p.row.subscription}: {'; '.join(p.reasons)}"
              for p in waiting]
    return "\n".join(lines)


def readiness_json(gate: Readiness) -> str:
    return json.dumps(gate.to_dict(), indent=2)


_FORECAST_CAUSES = ("ACKED_UNMAPPED", "ACKED_SINCE_SYNC", "PARTIAL_BATCHES", "CHUNKS")


def render_forecast(parts: Sequence[PartitionForecast]) -> str:
    """Messages a failover now would deliver again, per partition and cause, then per
    subscription, then why each figure that is not exact is a bound or unknown."""
    if not parts:
        return "no subscriptions recorded (no sync_progress or cursor_states rows match)"
    right = range(2, 3 + len(CAUSES))
    table = format_table(("TOPIC", "SUBSCRIPTION", *_FORECAST_CAUSES, "TOTAL"), [
        (p.row.key.concrete_topic(), p.row.subscription,
         *(forecast_cell(p.causes[c]) for c in CAUSES), forecast_cell(p.total))
        for p in parts], right=right)
    subs = by_subscription(parts)
    summary = format_table(("SUBSCRIPTION", "PARTITIONS", *_FORECAST_CAUSES, "TOTAL"), [
        (s.subscription, s.partitions, *(forecast_cell(s.causes[c]) for c in CAUSES),
         forecast_cell(s.total)) for s in subs], right=range(1, 3 + len(CAUSES)))
    notes = dict.fromkeys(f"  {c}: {f.why}" for p in parts for c in CAUSES
                          if (f := p.causes[c]).why)
    legend = ("messages a failover now delivers again: N exactly, <=N at most, >=N at least "
              "(not all known), ? unknown")
    return "\n".join([legend, "", table, "", summary, *(["", "why:", *notes] if notes else [])])


def forecast_cell(f: Figure) -> str:
    """A figure's messages: ``12`` exact, ``<=12`` a bound, ``>=12`` or ``?`` unknown."""
    if f.basis == "exact":
        return str(f.messages)
    if f.basis == "bound":
        return f"<={f.messages}"
    return f">={f.at_least}" if f.at_least else "?"


def forecast_json(parts: Sequence[PartitionForecast]) -> str:
    """``{"subscriptions": [...], "partitions": [...]}``, each with its causes' figures."""
    return json.dumps({"subscriptions": [s.to_dict() for s in by_subscription(parts)],
                       "partitions": [p.to_dict() for p in parts]}, indent=2)


def render_lookup_table(result: LookupResult) -> str:
    """Aligned ``field  value`` lines; absent values are left out."""
    seg = result.segment
    pairs: list[tuple[str, object]] = [
        ("topic", PartitionKey(result.topic, result.partition).concrete_topic()),
        ("source", result.source),
        ("outcome", result.outcome),
        ("target", result.target),
        ("copies", ", ".join(str(c) for c in result.copies) if len(result.copies) > 1 else None),
        ("evidence", result.evidence),
        ("segment", None if seg is None else
         f"{seg.source_ledger}:{seg.source_entry}+{seg.count} -> "
         f"{seg.target_ledger}:{seg.target_entry}"),
        ("mapped before", result.mapped_before),
        ("mapped after", result.mapped_after),
        ("reason", result.reason or None),
    ]
    shown = [(k, _cell(v)) for k, v in pairs if v is not None]
    width = max(len(k) for k, _ in shown)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in shown)


def lookup_json(result: LookupResult) -> str:
    return json.dumps(result.to_dict(), indent=2)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return iso_time(value, seconds=True) or "-"
    return str(value)


__all__ = [
    "forecast_cell",
    "forecast_json",
    "format_table",
    "lookup_json",
    "render_forecast",
    "render_lookup_table",
    "render_status_table",
    "status_json",
]
