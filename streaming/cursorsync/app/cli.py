"""The ``cursorsync`` command line.

Commands::

    cursorsync run -c FILE [--dry-run | --no-dry-run] [--once]
    cursorsync demo [--json] [--seconds N] [--evidence S,S] [--work-dir DIR] [--keep]
    cursorsync status -c FILE [--topic T] [--subscription S] [--json]
    cursorsync lookup -c FILE TOPIC LEDGER:ENTRY [--partition I] [--json]
    cursorsync bench translate [--ranges N] [--oracle-entries M] [--json]
    cursorsync bench failover [--seed S] [--partitions P] [--messages M] [--json]
    cursorsync bench e2e [--seconds N] [--json]
    cursorsync bench layout [--rows N] [--repeat R] [--json]

Global options (before the command): ``--log-level``, ``--log-json``, ``--version``.

Exit status: 0 on success; 2 for anything the user can fix (any
:class:`~cursorsync.errors.CursorSyncError`), one ``error: ...`` line on stderr
(a traceback only with ``--log-level debug``); 1 when ``lookup`` finds the
position unmapped or ``bench failover`` sees a loss. Spark and the development
tools are imported only by the commands that need them.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import sys
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer

from cursorsync.app.logs import configure_logging
from cursorsync.app.progress import progress
from cursorsync.errors import CursorSyncError

if TYPE_CHECKING:
    from cursorsync.app.settings import Config
    from cursorsync.tables import TableStore

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger(__name__)

#: Exit status for errors the user can act on (same as a command-line usage error).
EXIT_USER_ERROR = 2
#: Exit status when a query found nothing / a check failed (lookup, bench failover).
EXIT_NOT_FOUND = 1
EXIT_INTERRUPTED = 130

CONFIG_ENV = "CURSORSYNC_CONFIG"

#: The development tools (test bed, simulator, benchmarks) the demo and benches load.
DEVTOOLS = "cursorsync_devtools"
DEVTOOLS_HINT = "the demo and benchmarks need the development tools: " \
    "pip install 'cursorsync[devtools]'"


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


@dataclass(frozen=True)
class _State:
    """What the global options decided, for the commands."""

    log_level: str | None = None
    log_json: bool | None = None

    @property
    def debug(self) -> bool:
        return self.log_level == LogLevel.debug.value


app = typer.Typer(
    name="cursorsync",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
bench_app = typer.Typer(
    help="Benchmarks that print their figures (translation cost, failover outcome, end to end).",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


# ------------------------------------------------------------------ plumbing


#: Set by the global options callback; commands read it (click's context is not
#: always current while a command body runs under typer).
_STATE: ContextVar[_State | None] = ContextVar("cursorsync_cli_state", default=None)


def _state() -> _State:
    return _STATE.get() or _State()


def _fail(message: str, exc: BaseException | None = None) -> NoReturn:
    """Print ``error: <message>`` (and the traceback when debugging) and exit 2."""
    if exc is not None and _state().debug:
        traceback.print_exception(exc, file=sys.stderr)
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_USER_ERROR)


def _user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn our errors into ``error: ...`` + exit 2, and Ctrl-C into exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except CursorSyncError as exc:
            _fail(str(exc), exc)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def _load(module: str, attr: str, command: str) -> Any:
    """Import ``module.attr`` lazily; a missing module is a clear error, not a traceback."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            _fail(f"`{command}` is not available: this installation has no {exc.name} module "
                  f"({DEVTOOLS_HINT if module.startswith(DEVTOOLS) else 'reinstall cursorsync'})",
                  exc)
        _fail(f"`{command}` needs the Python module {exc.name!r}, which is not installed "
              f"({DEVTOOLS_HINT if module.startswith(DEVTOOLS) else 'reinstall cursorsync'})",
              exc)
    try:
        return getattr(mod, attr)
    except AttributeError as exc:
        _fail(f"`{command}` is not available: {module} has no {attr}", exc)


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _load_config(path: Path) -> Config:
    from cursorsync.app.settings import load_config

    return load_config(path)


def _query_store(config: Config) -> TableStore:
    from cursorsync.tables import open_reader

    return open_reader(config.tables.path, storage_options=dict(config.tables.storage_options))


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"cursorsync {version('cursorsync')}")
        except PackageNotFoundError:
            typer.echo("cursorsync (not installed as a package)")
        raise typer.Exit()


# ------------------------------------------------------------------ global options

ConfigOption = Annotated[
    Path,
    typer.Option(
        "--config", "-c", envvar=CONFIG_ENV, show_envvar=True, dir_okay=False,
        help="The YAML config (conf/embedded.yaml and conf/production.example.yaml are examples).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@app.callback()
def _global_options(
    ctx: typer.Context,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            "--log-level", case_sensitive=False,
            help="Log level (default warning; `run` defaults to the config's logging.level). "
                 "debug also prints the traceback of an error.",
        ),
    ] = None,
    log_json: Annotated[
        bool | None,
        typer.Option("--log-json", help="Log one JSON object per line (on stderr)."),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
) -> None:
    """Keep geo-replicated Pulsar subscriptions in step across two clusters.

    Results go to stdout, logs and errors to stderr. Exit status 2 means an error
    you can fix (the message says what); see each command's help for 1.
    """
    state = _State(None if log_level is None else log_level.value, log_json)
    ctx.obj = state
    _STATE.set(state)
    configure_logging(state.log_level or "warning", json=bool(log_json))


# ------------------------------------------------------------------ run, demo


@app.command()
@_user_errors
def run(
    config: ConfigOption,
    dry_run: Annotated[
        bool | None,
        typer.Option("--dry-run/--no-dry-run",
                     help="Override emission.dry_run: translate and record, but send no acks."),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Process what is available now, then stop."),
    ] = False,
) -> None:
    """Run the sync job (the Spark application) with a config file."""
    cfg = _load_config(config)
    state = _state()
    configure_logging(
        state.log_level or cfg.logging.level,
        json=cfg.logging.json_format if state.log_json is None else state.log_json,
    )
    run_job = _load("cursorsync.app.job", "run_job", "cursorsync run")
    log.info("starting cursorsync job", extra={"config": str(config), "once": once,
                                               "dry_run_override": dry_run})
    run_job(cfg, once=once, dry_run_override=dry_run)


@app.command()
@_user_errors
def demo(
    json_output: JsonOption = False,
    seconds: Annotated[
        float, typer.Option("--seconds", min=1, help="How long the workload produces.")
    ] = 8.0,
    evidence: Annotated[
        str, typer.Option("--evidence", help="Evidence strategies, comma-separated: "
                          "position-property, identity (default both).")
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
) -> None:
    """Two local Apache Pulsar clusters, a workload, cursorsync between them, then failover,
    beside Pulsar's own replicated subscriptions."""
    run_demo = _load(f"{DEVTOOLS}.demo", "run_demo", "cursorsync demo")
    WorkloadSpec = _load(f"{DEVTOOLS}.testbed.workload", "WorkloadSpec", "cursorsync demo")
    strategies = _strategies(evidence)
    with progress("demo: running", json_output=json_output):
        out = run_demo(json_output=json_output, spec=WorkloadSpec(produce_seconds=seconds),
                       strategies=strategies,
                       work_dir=None if work_dir is None else str(work_dir), keep=keep)
    typer.echo(out)


def _strategies(evidence: str) -> list[str]:
    strategies = [x.strip() for x in evidence.split(",") if x.strip()]
    unknown = sorted(set(strategies) - {"position-property", "identity"})
    if unknown or not strategies:
        raise typer.BadParameter(f"{', '.join(unknown) or 'nothing'}: use position-property "
                                 "and/or identity", param_hint="--evidence")
    return strategies


# ------------------------------------------------------------------ queries


@app.command()
@_user_errors
def status(
    config: ConfigOption,
    topic: Annotated[
        str | None,
        typer.Option("--topic", "-t",
                     help="Only this topic (all its partitions) or one <topic>-partition-N."),
    ] = None,
    subscription: Annotated[
        str | None, typer.Option("--subscription", "-s", help="Only this subscription.")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Where each subscription stands: source cursor, target cursor, lag, mapping coverage.

    Reads the Delta tables only (no Spark, no broker).
    """
    from cursorsync.app.render import render_status_table, status_json
    from cursorsync.app.status import subscription_status

    cfg = _load_config(config)
    with progress("status: reading tables", json_output=json_output):
        rows = subscription_status(
            _query_store(cfg), topic=topic, subscription=subscription,
            source_cluster=cfg.clusters.source.name, target_cluster=cfg.clusters.target.name,
        )
    typer.echo(status_json(rows) if json_output else render_status_table(rows))


@app.command()
@_user_errors
def lookup(
    config: ConfigOption,
    topic: Annotated[
        str, typer.Argument(metavar="TOPIC",
                            help="persistent://tenant/ns/topic, or <topic>-partition-N.")
    ],
    position: Annotated[str, typer.Argument(metavar="LEDGER:ENTRY",
                                            help="A source position, e.g. 123:45.")],
    partition: Annotated[
        int | None,
        typer.Option("--partition", "-p", min=-1,
                     help="Partition index (instead of a -partition-N suffix)."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Translate one source position to its target position using the mappings table.

    Exit status 0 when mapped exactly, 1 when unmapped or the topic is unknown.
    """
    from cursorsync.app.render import lookup_json, render_lookup_table
    from cursorsync.app.status import lookup as lookup_position
    from cursorsync.core.positions import Position

    pos = Position.parse(position)
    cfg = _load_config(config)
    with progress("lookup: reading mappings", json_output=json_output):
        result = lookup_position(
            _query_store(cfg), topic, pos, partition=partition,
            source_cluster=cfg.clusters.source.name, target_cluster=cfg.clusters.target.name,
        )
    typer.echo(lookup_json(result) if json_output else render_lookup_table(result))
    if result.outcome != "exact":
        raise typer.Exit(EXIT_NOT_FOUND)


# ------------------------------------------------------------------ bench


@bench_app.command("translate")
@_user_errors
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
    run_bench = _load(f"{DEVTOOLS}.bench", "bench_translate", "cursorsync bench translate")
    with progress(f"bench translate: {ranges} ranges", json_output=json_output):
        result = run_bench(ranges, oracle_entries=oracle_entries)
    if json_output:
        _echo_json(result)
        return
    from cursorsync.app.render import format_table

    typer.echo(format_table(("FIGURE", "VALUE"), list(result.items())))


@bench_app.command("failover")
@_user_errors
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
    command = "cursorsync bench failover"
    Workload = _load(f"{DEVTOOLS}.sim", "Workload", command)
    run_failover = _load(f"{DEVTOOLS}.sim", "run_failover", command)
    failover_table = _load(f"{DEVTOOLS}.reports", "failover_table", command)
    workload = Workload(seed=seed, partitions=partitions, messages=messages)
    with progress("bench failover: simulating", json_output=json_output):
        report = run_failover(workload)
    if json_output:
        _echo_json(report.to_dict())
    else:
        typer.echo(failover_table(report))
    if report.cursorsync.losses:
        typer.echo(f"cursorsync lost {report.cursorsync.losses} messages: a safety bug "
                   f"(reproduce with --seed {seed} --partitions {partitions} "
                   f"--messages {messages})", err=True)
        raise typer.Exit(EXIT_NOT_FOUND)


@bench_app.command("e2e")
@_user_errors
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
                          "position-property, identity (default both).")
    ] = "position-property,identity",
    identity_scope: Annotated[
        str, typer.Option("--identity-scope", help="evidence.identity_scope: all, or batched "
                          "(brokers that stamp the source position).")
    ] = "all",
) -> None:
    """End to end on the real test bed: mapping ingestion beside plain Readers, sync lag
    beside Pulsar's replicated subscriptions, failover counts and CPU per process group."""
    run_e2e = _load(f"{DEVTOOLS}.bench_e2e", "run_e2e", "cursorsync bench e2e")
    strategies = tuple(_strategies(evidence))
    if identity_scope not in ("all", "batched"):
        raise typer.BadParameter(f"{identity_scope}: use all or batched",
                                 param_hint="--identity-scope")
    with progress("bench e2e: running", json_output=json_output):
        out = run_e2e(seconds=seconds, json_output=json_output, backlog=backlog,
                      strategies=strategies, identity_scope=identity_scope)
    typer.echo(out)


@bench_app.command("layout")
@_user_errors
def bench_layout(
    rows: Annotated[
        int, typer.Option("--rows", min=1, help="Evidence rows per collect (a mapping batch "
                          "of the e2e bench is 100000).")
    ] = 100_000,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Runs of each layout.")] = 5,
    json_output: JsonOption = False,
) -> None:
    """A Spark row per entry against layout=arrow: JVM CPU and wall time, alternated."""
    run_layout = _load(f"{DEVTOOLS}.bench_layout", "run_layout", "cursorsync bench layout")
    render_layout = _load(f"{DEVTOOLS}.reports", "layout_table", "cursorsync bench layout")
    from cursorsync.app.session import build_session
    from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, load_config

    with progress(f"bench layout: {rows} rows x {repeat}", json_output=json_output):
        spark = build_session(load_config(EMBEDDED_CONFIG_PATH))
        try:
            result = run_layout(spark, rows=rows, repeat=repeat)
        finally:
            spark.stop()
    if json_output:
        _echo_json(result)
        return
    typer.echo(render_layout(result, rows=rows, repeat=repeat))


# ------------------------------------------------------------------ entry point


def main() -> None:
    """The ``cursorsync`` console script."""
    app(prog_name="cursorsync")


if __name__ == "__main__":
    main()
