"""``cursorsync-dev bench partitions`` (what it runs:
:mod:`cursorsync_devtools.bench_partitions`)."""

from __future__ import annotations

from typing import Annotated

import typer

from cursorsync.app.cli_base import JsonOption, user_errors
from cursorsync.app.progress import progress
from cursorsync_devtools.cli_base import bench_app, print_figures


@bench_app.command("partitions")
@user_errors
def bench_partitions(
    partitions: Annotated[int, typer.Option("--partitions", min=1,
                                            help="Partitions of the one topic.")] = 1000,
    entries: Annotated[int, typer.Option("--entries-per-partition", min=1)] = 20,
    seconds: Annotated[float, typer.Option("--seconds", min=1,
                                           help="How long the workload produces.")] = 30.0,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, help="Seconds the sync may take to catch up after the workload "
        "(the failover check waits for it).")] = 900.0,
    holes: Annotated[str, typer.Option(
        "--holes", help="evidence.holes modes to run one after the other on one test bed, "
        "comma-separated; the first is the baseline.")] = "verified,probe",
    batch_index_acks: Annotated[bool, typer.Option(
        "--batch-index-acks", help="Brokers and consumers ack by batch index, the plugin "
        "loaded; each mode runs without and with emission.batch_index_acks.")] = False,
    cursor_digests: Annotated[bool, typer.Option(
        "--cursor-digests", help="The plugin loaded; each run is made without and with "
        "spark.cursor_digests (the source polls, target reads and probe reads ask it).")] = False,
    digests_only: Annotated[bool, typer.Option(
        "--digests-only", help="The plugin loaded; each run is made with "
        "spark.cursor_digests alone, no baseline beside it (for a width whose baseline "
        "does not finish).")] = False,
    kept_readers: Annotated[bool, typer.Option(
        "--kept-readers", help="Each run is made with the mapping's workers opening a reader "
        "per range (kept_readers 0, the baseline) and keeping readers between ranges.")] = False,
    memory_scale: Annotated[int | None, typer.Option(
        "--memory-scale", min=1, help="The brokers' heap and direct memory this many times "
        "the bed's default (default: 1 up to 1,000 partitions, one more per 1,000 "
        "beyond).")] = None,
    warm_up: Annotated[bool, typer.Option(
        "--warm-up", help="Run the first mode once more before the others, on topics of "
        "its own, so that the compared runs find the brokers' JIT warm (its figures are "
        "printed as warm-up, not compared).")] = False,
    watch_builtin: Annotated[bool, typer.Option(
        "--watch-builtin", help="Follow the built-in's cursors on b through the whole run "
        "(an internalStats of every partition each poll, beside the job), not only after "
        "the sync caught up.")] = False,
    work_dir: Annotated[str | None, typer.Option(
        "--work-dir", help="Where the bed, tables and checkpoints go, kept after the run "
        "(default: a temporary directory, removed).")] = None,
    json_output: JsonOption = False,
) -> None:
    """One job syncing a topic of many partitions on the local test bed, once per way of
    classifying skipped ids: failover counts, per-batch time, sync lag, the admin requests
    the classification made and mapping rows per entry."""
    from cursorsync_devtools.bench_partitions import bench_partitions as run_bench

    modes = tuple(m.strip() for m in holes.split(",") if m.strip())
    if not modes or set(modes) - {"verified", "probe", "unacked"}:
        raise typer.BadParameter(f"not a list of verified, probe, unacked: {holes!r}",
                                 param_hint="--holes")
    with progress(f"bench partitions: {partitions} partitions", json_output=json_output):
        result = run_bench(partitions, entries_per_partition=entries, produce_seconds=seconds,
                           timeout_s=timeout, holes=modes, batch_index_acks=batch_index_acks,
                           cursor_digests=cursor_digests, kept_readers=kept_readers,
                           memory_scale=memory_scale, warm_up=warm_up,
                           work_dir=work_dir, digests_only=digests_only,
                           watch_builtin=watch_builtin)
    if json_output:
        print_figures(result, json_output)
        return
    rows = [(f"{mode} {name}{f' {part}' if part else ''}", v)
            for mode, run in result["runs"].items() for name, value in run.items()
            for part, v in (value.items() if isinstance(value, dict) else [("", value)])]
    print_figures(result, json_output, rows)
