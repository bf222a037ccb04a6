"""``cursorsync-dev bench e2e``'s report as text: each figure beside its baseline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cursorsync_devtools.batch_figures import phase_table, trigger_table
from cursorsync_devtools.testbed.lag_stages import STAGES

#: Process groups in the order the tables show them.
GROUPS = ("driver", "spark jvm", "python workers", "broker a", "broker b")
#: A phase's groups: the live workload runs in a process of its own (``workload``).
PHASE_GROUPS = (*GROUPS, "workload")


def table(report: Mapping[str, Any]) -> str:
    """The report as text: each figure beside its baseline."""
    from cursorsync.app.render import format_table

    s, m, b, lag = report["spec"], report["mapping"], report["backlog"], report["lag"]
    base, check = m["baseline"], m["check"]
    machine = report["machine"]
    head = (f"e2e bench: Apache Pulsar {machine['pulsar']} a -> b, {machine['cores']} cores "
            f"(load {machine['load_average'][0]} at start); evidence "
            f"{', '.join(s['strategies'])} (identity scope {s['identity_scope']}); trigger "
            f"{s['trigger_interval_s']:g} s; spark start-up {report['spark_startup_s']:.1f} s; "
            f"{report['total_s']:.0f} s in all")
    backlog = (f"backlog: {b['entries']:,} entries ({b['batched_entries']:,} batches of "
               f"{s['batch_size']}), {b['messages']:,} messages on "
               f"{_plural(b['partitions'], 'partition')}; produced in {b['produce_s']:.1f} s, "
               f"replicated in {b['replicate_s']:.1f} s")
    rates = format_table(("MAPPING INGESTION", "CURSORSYNC", "BASELINE", "RATIO"), [
        ("entries/s warm", _n(m["entries_per_s_warm"]), _n(base["entries_per_s"]),
         m["ratio_warm"]),
        ("entries/s from job start", _n(m["entries_per_s_from_start"]),
         _n(base["entries_per_s"]), m["ratio_from_start"]),
        ("seconds", m["seconds_from_start"], base["seconds"], None),
    ], right=(1, 2, 3))
    baseline = (f"baseline: plain Readers over cluster(s) {', '.join(base['clusters'])}, "
                f"{base['readers']} readers, {base['processes']} at a time "
                f"({base['messages_read']:,} messages); goal: ratio >= 0.8\n"
                f"mapping check: {check['pairs_checked']:,} pairs, {check['pairs_wrong']} "
                f"wrong, {check['pairs_unmapped']} unmapped")
    batches = format_table(
        ("MAPPING BATCH", "ROWS b", "ROWS a", "SINK S", "TRIGGER S",
         "CPU-S " + " / ".join(GROUPS)),
        [(x["batch"], x["rows"].get("b", 0), x["rows"].get("a", 0), x["sink_s"],
          x["trigger_s"], " / ".join(f"{x['cpu_s'].get(g, 0.0):.1f}" for g in GROUPS))
         for x in m["per_batch"]], right=(1, 2, 3, 4))
    cs, bi = lag["cursorsync"], lag["builtin"]
    lags = format_table(("SYNC LAG", "CURSORSYNC", "BUILT-IN"), [
        (label, _s(cs[k]), _s(bi[k])) for label, k in
        (("p50", "p50_s"), ("p99", "p99_s"), ("max", "max_s"), ("min", "min_s"))
    ] + [(f"{q} of entries acked {w}", _s(cs["by_window"][w][f"{q}_s"]),
          _s(bi["by_window"][w][f"{q}_s"]))
         for w in _first_seconds_first(cs.get("by_window", {})) for q in ("p50", "p99")
         ] + [(f"{q} of the warm-up topic's entries", _s(w["cursorsync"][f"{q}_s"]),
               _s(w["builtin"][f"{q}_s"])) for w in [lag.get("warm_up")] if w
              for q in ("p50", "p99")
         ] + [("entries covered", cs["covered"], bi["covered"]),
         ("never covered", cs["never_covered"], bi["never_covered"])], right=(1, 2))
    st = lag.get("cursorsync_stages") or {}
    windows = _first_seconds_first(st.get("by_window") or {})
    stages = format_table(
        ("CURSORSYNC LAG BY STAGE", "P50", "P99",
         *(f"{w.upper()}: P50 / P99" for w in windows)), [
            (name, _s(st[name]["p50_s"]), _s(st[name]["p99_s"]),
             *(f"{_s(w[name]['p50_s'])} / {_s(w[name]['p99_s'])}" if w.get(name) else None
               for w in windows.values()))
            for name in (*STAGES, "lag") if st.get(name)], right=range(1, 3 + len(windows)))
    stages += (f"\n{st.get('with_every_time', 0):,} of {st.get('entries', 0):,} entries with "
               "every step's time: source poll = ack on a -> the job's cursor_states row; "
               "mapping = -> its segment row, if later; sync = -> the sync_progress row acking "
               "it; target = -> b's cursor polled covering it")
    batch_phases = phase_table(lag.get("batch_phases_mean_s") or {},
                               lag.get("batch_phases_cpu_mean_s"))
    if lag.get("spark_phases"):
        batch_phases += ("\n\n" + trigger_table(lag["spark_phases"]) + "\n(the live phase's "
                         "batches; addBatch holds the job's own phases above)")
    live = (f"live: {lag['messages']:,} messages in {lag['entries']:,} entries "
            f"({lag['late_entries']} acked late) at {lag['rate_per_s']:g} msg/s for "
            f"{lag['seconds']:.0f} s on {_plural(lag['partitions'], 'partition')}; b polled "
            f"every {lag['poll_interval_s']:g} s ({lag['polls']} polls); goal: cursorsync p99 "
            f"<= 2 s and below the built-in's")
    if lag.get("warm_up"):
        w = lag["warm_up"]
        live += (f"\nwarm-up before it, not in the figures above but its own rows: "
                 f"{w['messages']:,} messages at {w['rate_per_s']:g} msg/s for "
                 f"{w['seconds']:.0f} s on a topic of its own (the bed's first live traffic)")
    fo = report["failover"]
    failover = format_table(("FAILOVER TO b", "CURSORSYNC", "BUILT-IN"), [
        (label, fo["cursorsync"][k], fo["builtin"][k]) for label, k in (
            ("messages", "messages"), ("acked on a", "acked_on_source"),
            ("deliveries on b", "deliveries"), ("duplicates", "duplicates"),
            ("losses", "losses"))], right=(1, 2))
    phases = format_table(
        ("CPU-S BY PHASE", "WALL S", *(g.upper() for g in PHASE_GROUPS), "BROKERS' JIT"), [
            (p["phase"], p["seconds"], *(f"{p['cpu_s'].get(g, 0.0):.1f}" for g in PHASE_GROUPS),
             f"{_jit_s(p):.1f}")
            for p in report["phases"]], right=range(1, 3 + len(PHASE_GROUPS)))
    return "\n\n".join((head + "\n" + backlog, rates + "\n" + baseline, batches,
                        lags + "\n" + live, stages, batch_phases, failover, phases))


def _first_seconds_first(windows: Mapping[str, Any]) -> dict[str, Any]:
    """The windows of a lag, the topic's first seconds before the rest (JSON sorts them)."""
    return dict(sorted(windows.items(), key=lambda w: not w[0].startswith("first")))


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _n(v: float | None) -> str | None:
    return None if v is None else f"{v:,.0f}"


def _s(v: float | None) -> str | None:
    return None if v is None else f"{v:.2f} s"


def _jit_s(phase: dict[str, Any]) -> float:
    """The brokers' JIT compiling in a phase (inside their CPU-seconds)."""
    return sum(float(kinds.get("jit", 0.0))
               for kinds in (phase.get("broker_threads_cpu_s") or {}).values())
