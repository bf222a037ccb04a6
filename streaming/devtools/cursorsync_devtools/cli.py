"""``cursorsync-dev``: the development tools' command line, the demo and the benchmarks.

Commands::

    cursorsync-dev demo [--json] [--seconds N] [--evidence S,S] [--work-dir DIR] [--keep]
                        [--batch-index-acks]
    cursorsync-dev bench translate [--ranges N] [--oracle-entries M] [--json]
    cursorsync-dev bench plan [--partitions P] [--active F] [--json]
    cursorsync-dev bench mapping-batch [--partitions P] [--active F] [--json]
    cursorsync-dev bench mapping-rows [--entries N] [--batch-entries B] [--json]
    cursorsync-dev bench partitions [--partitions P] [--seconds N] [--timeout T]
                                    [--holes verified,probe] [--json]
    cursorsync-dev bench admin [--partitions P] [--workers W,W] [--json]
    cursorsync-dev bench failover [--seed S] [--partitions P] [--messages M] [--json]
    cursorsync-dev bench e2e [--seconds N] [--backlog N] [--evidence S,S] [--json]
    cursorsync-dev bench soak [--minutes N] [--restart a|b|none] [--crash] [--json]
    cursorsync-dev bench layout [--rows N] [--repeat R] [--json]
    cursorsync-dev bench read-path [--entries N] [--repeat R] [--json]

Global options (before the command): ``--log-level``, ``--log-json``.

Exit status as the product's ``cursorsync``: 0 on success; 2 for anything the user can fix,
one ``error: ...`` line on stderr (a traceback only with ``--log-level debug``); 1 when
``bench failover`` sees a loss. The tools import the product's command-line plumbing; the
product never imports them. Each command imports its tool when it runs, so that the help
needs neither Spark nor Pulsar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cursorsync.app.cli_base import (
    EXIT_NOT_FOUND,
    JsonOption,
    user_errors,
)
from cursorsync.app.progress import progress
from cursorsync_devtools import cli_partitions  # noqa: F401 (registers `bench partitions`)
from cursorsync_devtools.cli_base import (
    app,
    bench_app,
    echo_json,
    parse_strategies,
    print_figures,
    steady_batch_rows,
)

# ------------------------------------------------------------------ demo


@app.command()
@user_errors
def demo(
    json_output: JsonOption = False,
    seconds: Annotated[
        float, typer.Option("--seconds", min=1, help="How long the workload produces.")
    ] = 8.0,
    evidence: Annotated[
        str, typer.Option("--evidence", help="Evidence strategies, comma-separated: "
                          "position-property, identity, snapshot (default the first two).")
    ] = "position-property,identity",
    work_dir: Annotated[
        Path | None,
        typer.Option("--work-dir", file_okay=False,
                     help="Where the clusters, tables and checkpoints go "
                          "[default: a temporary directory]."),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the work directory afterwards.")
    ] = False,
    batch_index_acks: Annotated[
        bool, typer.Option("--batch-index-acks",
                           help="Brokers keep batch-index acks "
                                "(acknowledgmentAtBatchIndexLevelEnabled, the default from "
                                "Pulsar 4.1) and a's consumers ack by batch index.")
    ] = False,
) -> None:
    """Two local Apache Pulsar clusters, a workload, cursorsync between them, then failover,
    beside Pulsar's own replicated subscriptions."""
    from cursorsync_devtools.demo import run_demo
    from cursorsync_devtools.testbed.workload import WorkloadSpec

    strategies = parse_strategies(evidence)
    with progress("demo: running", json_output=json_output):
        out = run_demo(json_output=json_output,
                       spec=WorkloadSpec(produce_seconds=seconds,
                                         batch_index_acks=batch_index_acks),
                       strategies=strategies,
                       work_dir=None if work_dir is None else str(work_dir), keep=keep)
    typer.echo(out)


# ------------------------------------------------------------------ bench


@bench_app.command("translate")
@user_errors
def bench_translate(
    ranges: Annotated[
        int, typer.Option("--ranges", min=1,
                          help="Acknowledgement holes in the source cursor (entries: 10x).")
    ] = 100_000,
    oracle_entries: Annotated[
        int, typer.Option("--oracle-entries", min=10,
                          help="Entries the per-entry oracle runs on for the speedup.")
    ] = 200_000,
    json_output: JsonOption = False,
) -> None:
    """Time the range-based translator against the per-entry oracle."""
    from cursorsync_devtools.bench import bench_translate as run_bench

    with progress(f"bench translate: {ranges} ranges", json_output=json_output):
        result = run_bench(ranges, oracle_entries=oracle_entries)
    print_figures(result, json_output)


@bench_app.command("plan")
@user_errors
def bench_plan(
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Topic partitions, one subscription each.")
    ] = 10_000,
    active: Annotated[
        float, typer.Option("--active", min=0, max=1,
                            help="Fraction of partitions whose cursors move.")
    ] = 0.05,
    json_output: JsonOption = False,
) -> None:
    """One sync batch for many partitions on the driver, no brokers: the mapping load from
    Delta, translation and guard, target requests."""
    from cursorsync_devtools.bench_plan import bench_plan as run_bench

    with progress(f"bench plan: {partitions} partitions", json_output=json_output):
        result = run_bench(partitions, active=active)
    print_figures(result, json_output, steady_batch_rows(result))


@bench_app.command("replay")
@user_errors
def bench_replay(
    tables: Annotated[str, typer.Argument(
        help="A run's tables, as `bench partitions --work-dir DIR` keeps them "
             "(DIR/<run>/tables).")],
    first: Annotated[int | None, typer.Option("--first", help="First sync batch.")] = None,
    last: Annotated[int | None, typer.Option("--last", help="Last sync batch.")] = None,
    json_output: JsonOption = False,
) -> None:
    """A kept run's sync batches again through the sync step on the driver alone (its
    cursors, the mappings written by each batch's time, the targets the batches before
    left): seconds per batch and per cursor, and the step's parts' shares of them."""
    from cursorsync_devtools.bench_replay import bench_replay as run_bench

    with progress(f"bench replay: {tables}", json_output=json_output):
        result = run_bench(tables, first=first, last=last)
    rows = [(f"share of step: {part}" if name == "share_of_step_by_part" else name,
             value if name != "share_of_step_by_part" else share)
            for name, value in result.items() if name != "per_batch"
            for part, share in (value.items() if isinstance(value, dict) else [("", None)])]
    print_figures(result, json_output, rows)


@bench_app.command("mapping-batch")
@user_errors
def bench_mapping_batch(
    partitions: Annotated[int, typer.Option("--partitions", min=1,
                                            help="Topic partitions the builder keeps.")
                          ] = 100_000,
    active: Annotated[float, typer.Option("--active", min=0, max=1,
                                          help="Fraction of partitions with new entries.")
                      ] = 0.05,
    json_output: JsonOption = False,
) -> None:
    """The mapping query's batches for many partitions on the driver, no brokers: the
    builder's work, the state saved with each batch, the heap kept per partition."""
    from cursorsync_devtools.bench_mapping_batch import bench_mapping_batch as run_bench

    with progress(f"bench mapping-batch: {partitions} partitions", json_output=json_output):
        result = run_bench(partitions, active=active)
    print_figures(result, json_output, steady_batch_rows(result))


@bench_app.command("mapping-rows")
@user_errors
def bench_mapping_rows(
    entries: Annotated[int, typer.Option("--entries", min=1, help="Entries of one ledger.")
                       ] = 50_000,
    batch_entries: Annotated[int, typer.Option("--batch-entries", min=1,
                                               help="Entries per mapping batch.")] = 500,
    json_output: JsonOption = False,
) -> None:
    """Mapping rows per entry for a steady stream: as the batches write them to a Delta
    table, and after the table maintenance merges them."""
    from cursorsync_devtools.bench import bench_mapping_rows as run_bench

    with progress(f"bench mapping-rows: {entries} entries", json_output=json_output):
        result = run_bench(entries, batch_entries=batch_entries)
    print_figures(result, json_output)


@bench_app.command("admin")
@user_errors
def bench_admin(
    partitions: Annotated[int, typer.Option("--partitions", min=1,
                                            help="Partitions of the one topic.")] = 1000,
    workers: Annotated[str, typer.Option("--workers",
                                         help="Thread counts to compare, comma-separated; "
                                              "1 is one request after another.")] = "1,4,8,16",
    plugin: Annotated[bool, typer.Option(
        "--plugin", help="Load cursorsync's broker plugin and measure its one request per "
                         "broker that tells which partitions moved, beside the source "
                         "polls.")] = False,
    json_output: JsonOption = False,
) -> None:
    """A sync batch's admin requests on the local test bed's broker: the target reads (one
    internalStats request per partition) for each thread count, and a source poll with and
    without the topic stats first (and, with --plugin, the plugin's digests); seconds, and
    the broker's CPU per request."""
    try:
        counts = [int(w) for w in workers.split(",") if w.strip()]
    except ValueError:
        raise typer.BadParameter(f"not a list of thread counts: {workers!r}",
                                 param_hint="--workers") from None
    if not counts or min(counts) < 1:
        raise typer.BadParameter("thread counts are at least 1", param_hint="--workers")
    from cursorsync_devtools.bench_admin import bench_admin as run_bench

    with progress(f"bench admin: {partitions} partitions", json_output=json_output):
        result = run_bench(partitions, workers=counts, plugin=plugin)
    rows = [(k, v) for k, v in result.items()
            if k not in ("by_workers", "source_poll", "probe_placement", "plugin_target_reads")]
    rows += [(f"target reads, {r['workers']} threads: {k}", v) for r in result["by_workers"]
             for k, v in r.items() if k != "workers"]
    rows += [(f"target reads, the plugin: {k}", v)
             for k, v in result.get("plugin_target_reads", {}).items()]
    rows += [(f"source poll, {label}: {k}", v) for label, r in result["source_poll"].items()
             for k, v in r.items()]
    rows += [(f"probe placement, {label.replace('_', ' ')}: {k}", v)
             for label, r in result["probe_placement"].items() for k, v in r.items()]
    print_figures(result, json_output, rows)


@bench_app.command("failover")
@user_errors
def bench_failover(
    seed: Annotated[int, typer.Option("--seed", help="Workload seed (same seed, same run).")] = 0,
    partitions: Annotated[int, typer.Option("--partitions", min=1)] = 1,
    messages: Annotated[
        int, typer.Option("--messages", min=1, help="Messages produced on the source in all.")
    ] = 40_000,
    json_output: JsonOption = False,
) -> None:
    """Simulate a failover: duplicates and losses under cursorsync vs built-in replication.

    Exit status 1 if cursorsync lost any message (that would be a bug).
    """
    from cursorsync_devtools.reports import failover_table
    from cursorsync_devtools.sim import Workload, run_failover

    workload = Workload(seed=seed, partitions=partitions, messages=messages)
    with progress("bench failover: simulating", json_output=json_output):
        report = run_failover(workload)
    if json_output:
        echo_json(report.to_dict())
    else:
        typer.echo(failover_table(report))
    if report.cursorsync.losses:
        typer.echo(f"cursorsync lost {report.cursorsync.losses} messages: a safety bug "
                   f"(reproduce with --seed {seed} --partitions {partitions} "
                   f"--messages {messages})", err=True)
        raise typer.Exit(EXIT_NOT_FOUND)


@bench_app.command("e2e")
@user_errors
def bench_e2e(
    seconds: Annotated[
        float, typer.Option("--seconds", min=1, help="How long the live workload runs "
                            "(the sync-lag phase).")
    ] = 60.0,
    json_output: JsonOption = False,
    backlog: Annotated[
        int, typer.Option("--backlog", min=1, help="Entries in the backlog the mapping "
                          "ingestion is timed on (default 200000).")
    ] = 200_000,
    evidence: Annotated[
        str, typer.Option("--evidence", help="Evidence strategies, comma-separated: "
                          "position-property, identity, snapshot (default the first two).")
    ] = "position-property,identity",
    identity_scope: Annotated[
        str, typer.Option("--identity-scope", help="evidence.identity_scope: all, or batched "
                          "(brokers that stamp the source position).")
    ] = "all",
) -> None:
    """End to end on the real test bed: mapping ingestion beside plain Readers, sync lag
    beside Pulsar's replicated subscriptions, failover counts and CPU per process group."""
    from cursorsync_devtools.bench_e2e import run_e2e

    strategies = tuple(parse_strategies(evidence))
    if identity_scope not in ("all", "batched"):
        raise typer.BadParameter(f"{identity_scope}: use all or batched",
                                 param_hint="--identity-scope")
    with progress("bench e2e: running", json_output=json_output):
        out = run_e2e(seconds=seconds, json_output=json_output, backlog=backlog,
                      strategies=strategies, identity_scope=identity_scope)
    typer.echo(out)


@bench_app.command("soak")
@user_errors
def bench_soak(
    minutes: Annotated[
        float, typer.Option("--minutes", min=0.5, help="How long the live traffic runs.")
    ] = 30.0,
    restart: Annotated[
        str, typer.Option("--restart", help="The cluster whose broker is restarted "
                          "halfway: a, b, or none.")
    ] = "b",
    crash: Annotated[
        bool, typer.Option("--crash", help="SIGKILL the broker instead of stopping it.")
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """`cursorsync run` under live traffic (late acks, holes) with a broker restart halfway:
    its memory and sync lag per window, then the failover counts."""
    if restart not in ("a", "b", "none"):
        raise typer.BadParameter(f"{restart}: use a, b or none", param_hint="--restart")
    from cursorsync_devtools.soak import run_soak

    with progress(f"bench soak: {minutes:g} min", json_output=json_output):
        out = run_soak(minutes=minutes, json_output=json_output,
                       restart=None if restart == "none" else restart, crash=crash)
    typer.echo(out)


@bench_app.command("layout")
@user_errors
def bench_layout(
    rows: Annotated[
        int, typer.Option("--rows", min=1, help="Evidence rows per collect (a mapping batch "
                          "of the e2e bench is 100000).")
    ] = 100_000,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Runs of each layout.")] = 5,
    json_output: JsonOption = False,
) -> None:
    """A Spark row per entry against layout=arrow: JVM CPU and wall time, alternated."""
    from cursorsync.app.session import build_session
    from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, load_config
    from cursorsync_devtools.bench_layout import run_layout
    from cursorsync_devtools.reports import layout_table as render_layout

    with progress(f"bench layout: {rows} rows x {repeat}", json_output=json_output):
        spark = build_session(load_config(EMBEDDED_CONFIG_PATH))
        try:
            result = run_layout(spark, rows=rows, repeat=repeat)
        finally:
            spark.stop()
    if json_output:
        echo_json(result)
        return
    typer.echo(render_layout(result, rows=rows, repeat=repeat))


@bench_app.command("read-path")
@user_errors
def bench_read_path(
    entries: Annotated[int, typer.Option("--entries", min=1,
                                         help="Backlog entries (20% batches of 5).")] = 50_000,
    repeat: Annotated[int, typer.Option("--repeat", min=1,
                                        help="Reads of each kind on each cluster.")] = 3,
    json_output: JsonOption = False,
) -> None:
    """The mapping's executor read path on the local test bed beside a plain Reader over
    the same entries: CPU per entry on each cluster."""
    from cursorsync_devtools.bench_read_path import bench_read_path as run_bench

    with progress(f"bench read-path: {entries} entries x {repeat}", json_output=json_output):
        result = run_bench(entries, repeat=repeat)
    rows = [(k, v) for k, v in result.items() if k != "clusters"]
    rows += [(f"cluster {c}: {k.replace('_', ' ')}", v)
             for c, figures in result["clusters"].items() for k, v in figures.items()]
    print_figures(result, json_output, rows)


# ------------------------------------------------------------------ entry point


def main() -> None:
    """The ``cursorsync-dev`` console script."""
    app(prog_name="cursorsync-dev")


if __name__ == "__main__":
    main()
