"""The soak's report as text: each window beside the first, then the failover counts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cursorsync.app.render import format_table


def table(report: Mapping[str, Any]) -> str:
    """The report as text: each window beside the first, the failover counts."""
    s = report["spec"]
    r = report["restart"]
    head = (f"soak: Apache Pulsar {report['pulsar']} a -> b, {report['cores']} cores; "
            f"{report['messages']:,} messages at {s['rate_per_s']:g} msg/s for "
            f"{report['workload_s']:.0f} s on {s['partitions']} partitions "
            f"({s['late_fraction']:.0%} acked late by up to {s['late_delay_s'][1]:g} s, "
            f"{s['never_fraction']:.0%} never); {report['total_s']:.0f} s in all")
    crash = ("no broker restart" if not r.get("cluster") else
             f"cluster {r['cluster']} {'SIGKILLed' if r['crash'] else 'stopped'} and "
             f"restarted at "
             f"{r['at_s']} s; "
             f"it took writes again after {r.get('writable_after_s', '?')} s")
    rows = []
    for w in report["windows"]:
        rss = w["rss_mib"]
        rows.append((f"{w['window']}{' *' if w['restart'] else ''}",
                     f"{w['from_s']}-{w['to_s']}", w["entries"], _s(w["lag_p50_s"]),
                     _s(w["lag_p99_s"]), _s(w["lag_max_s"]), w["never_covered"],
                     _mib(rss.get("total")), _mib(rss.get("jvm")), _mib(rss.get("driver")),
                     _mib(rss.get("workers")), _s(w["batch_s"].get("mapping")),
                     _s(w["batch_s"].get("sync"))))
    windows = format_table(("WINDOW", "ACKED AT S", "ENTRIES", "LAG P50", "LAG P99",
                            "LAG MAX", "UNCOVERED", "RSS MIB", "JVM", "DRIVER", "WORKERS",
                            "MAPPING BATCH", "SYNC BATCH"), rows, right=range(2, 13))
    job = report["job"]
    f = report["failover"]
    tail = (f"* the window with the broker restart; window 1 (Spark warming up) is the "
            f"baseline\nb covered every ack {report['settled_after_last_ack_s']:.1f} s after "
            f"the last one; peak RSS {report['rss_mib_peak']:,.0f} MiB\n"
            f"job: {job['sync_batches']:.0f} sync batches, {job['acks_sent']:,.0f} acks sent, "
            f"outcomes {_kv(job['outcomes'])}, errors {_kv(job['errors']) or 'none'}; "
            f"exit code {job['exit_code']} on SIGTERM\n"
            f"failover to b: {f['messages']:,} messages, {f['acked_on_source']:,} acked on a, "
            f"{f['deliveries']:,} deliveries on b, {f['duplicates']} duplicates "
            f"({f['unexplained']} unexplained), {f['losses']} losses")
    return "\n\n".join((head + "\n" + crash, windows, tail))


def _kv(d: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:,.0f}" for k, v in sorted(d.items()))


def _s(v: float | None) -> str | None:
    return None if v is None else f"{v:.2f} s"


def _mib(v: float | None) -> str | None:
    return None if v is None else f"{v:,.0f}"
