"""Figures read from a job's own metrics registry, for the demo and the benchmarks: batch
times per query and per phase (where the time, and so the sync lag, goes), and the admin
requests the classification of skipped ids made."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def _samples(metrics: Any, family: str) -> Iterator[Any]:
    """The samples of one metric family of the job's registry (none without metrics)."""
    if metrics is None:
        return
    for found in metrics.registry.collect():
        if found.name == family:
            yield from found.samples


def skipped_id_requests(metrics: Any) -> dict[str, float]:
    """The job's ``cursorsync_skipped_id_requests`` by kind, its
    ``cursorsync_source_lookups`` as ``source <kind>``, and its
    ``cursorsync_target_cursor_reads`` as ``target <way>``: the admin requests by kind."""
    found = {s.labels["kind"]: s.value
             for s in _samples(metrics, "cursorsync_skipped_id_requests")
             if s.name.endswith("_total")}
    found.update({f"source {s.labels['kind']}": s.value
                  for s in _samples(metrics, "cursorsync_source_lookups")
                  if s.name.endswith("_total")})
    found.update({f"target {s.labels['way']}": s.value
                  for s in _samples(metrics, "cursorsync_target_cursor_reads")
                  if s.name.endswith("_total")})
    return found


def phase_seconds(metrics: Any) -> dict[str, dict[str, float]]:
    """Mean seconds per batch of each phase, per query, from the job's phase histogram
    (a phase ``a:b`` is part of ``a``): where the batches' time, and the lag, goes."""
    sums, counts = _phase_sums(metrics)
    return _means(sums, counts)


def phase_cpu_seconds(metrics: Any) -> dict[str, dict[str, float]]:
    """Mean CPU seconds per batch the batch's own thread spent in each phase, per query:
    beside :func:`phase_seconds`, what of a phase is work and what is waiting."""
    _, counts = _phase_sums(metrics)
    cpu = {(s.labels["query"], s.labels["phase"]): s.value
           for s in _samples(metrics, "cursorsync_batch_phase_cpu_seconds")
           if s.name.endswith("_total")}
    return _means(cpu, {key: counts.get(key, 0.0) for key in cpu})


def _phase_sums(metrics: Any) -> tuple[dict[tuple[str, str], float],
                                       dict[tuple[str, str], float]]:
    """The phase histogram's sums and counts by (query, phase)."""
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    for s in _samples(metrics, "cursorsync_batch_phase_seconds"):
        key = (s.labels["query"], s.labels["phase"])
        if s.name.endswith("_sum"):
            sums[key] = s.value
        elif s.name.endswith("_count"):
            counts[key] = s.value
    return sums, counts


def _means(sums: Mapping[tuple[str, str], float], counts: Mapping[tuple[str, str], float]
           ) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (query, phase), n in sorted(counts.items()):
        if n:
            out.setdefault(query, {})[phase] = round(sums.get((query, phase), 0.0) / n, 3)
    return out


def batch_seconds(metrics: Any) -> dict[str, dict[str, float]]:
    """Batches, mean seconds and the p99 bucket per query, from the job's histogram."""
    by_query: dict[str, dict[str, Any]] = {}
    for s in _samples(metrics, "cursorsync_batch_duration_seconds"):
        q = by_query.setdefault(s.labels["query"], {"buckets": []})
        if s.name.endswith("_count"):
            q["count"] = s.value
        elif s.name.endswith("_sum"):
            q["sum"] = s.value
        elif s.name.endswith("_bucket"):
            q["buckets"].append((float(s.labels["le"]), s.value))
    out: dict[str, dict[str, float]] = {}
    for query, q in by_query.items():
        n = q.get("count", 0.0)
        if not n:
            continue
        p99 = next((le for le, c in sorted(q["buckets"]) if c >= 0.99 * n), float("inf"))
        out[query] = {"batches": n, "mean_s": round(q["sum"] / n, 3), "p99_at_most_s": p99}
    return out


def phase_table(by_phase: Mapping[str, Mapping[str, float]],
                cpu: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """The mean seconds per batch of each phase, a column per query, each beside its
    thread's CPU seconds in the phase (``cpu``, :func:`phase_cpu_seconds`)."""
    from cursorsync.app.render import format_table

    names = sorted({p for q in by_phase.values() for p in q})
    mapping_cpu, sync_cpu = ((cpu or {}).get(q, {}) for q in ("mapping", "sync"))
    table = format_table(
        ("BATCH PHASE, MEAN S PER BATCH", "MAPPING", "MAPPING CPU", "SYNC", "SYNC CPU"), [
            (name, _s(by_phase.get("mapping", {}).get(name)), _s(mapping_cpu.get(name)),
             _s(by_phase.get("sync", {}).get(name)), _s(sync_cpu.get(name)))
            for name in names], right=(1, 2, 3, 4))
    return table + ('\n("step:..." is part of "step", "build:..." of "build"; "read" is the '
                    "mapping batch's Spark tasks, every range's reader; a CPU column is the "
                    "query thread's own seconds on a core, the rest of its seconds waiting)")


def _s(v: float | None) -> str | None:
    return None if v is None else f"{v:.2f}"


#: Spark's own phases of a micro-batch (``StreamingQueryProgress.durationMs``), in the
#: order they run: the sources' new offsets (the sync's source poll runs here), the offset
#: log's write, the batch (the job's sink), the commit log's write, and the whole trigger.
TRIGGER_PHASES = ("latestOffset", "walCommit", "addBatch", "commitOffsets",
                  "triggerExecution")


def trigger_phases(progress: Mapping[str, list[Mapping[str, Any]]],
                   since_epoch_s: float) -> dict[str, dict[str, Any]]:
    """Per query, the p50 and p90 milliseconds of each Spark phase over the batches that
    started at or after ``since_epoch_s`` (progress of triggers that ran no batch is left
    out): what a batch costs around the job's own work, which waits for it."""
    from datetime import datetime

    out: dict[str, dict[str, Any]] = {}
    for query, updates in progress.items():
        ran = [p["durationMs"] for p in updates
               if "addBatch" in p.get("durationMs", {}) and datetime.fromisoformat(
                   p["timestamp"].replace("Z", "+00:00")).timestamp() >= since_epoch_s]
        if not ran:
            continue
        figures: dict[str, Any] = {"batches": len(ran)}
        for phase in TRIGGER_PHASES:
            ms = sorted(d.get(phase, 0) for d in ran)
            figures[phase] = {"p50_ms": ms[len(ms) // 2], "p90_ms": ms[int(len(ms) * 0.9)]}
        out[query] = figures
    return out


def trigger_table(by_query: Mapping[str, Mapping[str, Any]]) -> str:
    """:func:`trigger_phases` as a table, a column per query."""
    from cursorsync.app.render import format_table

    queries = sorted(by_query)
    rows = [(phase, *(f"{by_query[q][phase]['p50_ms']} / {by_query[q][phase]['p90_ms']}"
                      for q in queries)) for phase in TRIGGER_PHASES]
    rows.append(("batches", *(by_query[q]["batches"] for q in queries)))
    return format_table(("SPARK PHASE, MS P50 / P90", *(q.upper() for q in queries)), rows,
                        right=range(1, 1 + len(queries)))
