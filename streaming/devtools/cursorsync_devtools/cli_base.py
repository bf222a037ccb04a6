"""The development tools' command line apps, their global options and the figures'
printing, shared by the modules that register commands on them."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from cursorsync.app.cli_base import LogJsonOption, LogLevel, apply_global_options

app = typer.Typer(
    name="cursorsync-dev",
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


@app.callback()
def _global_options(
    ctx: typer.Context,
    log_level: Annotated[
        LogLevel | None,
        typer.Option("--log-level", case_sensitive=False,
                     help="Log level (default warning). debug also prints the traceback of "
                          "an error."),
    ] = None,
    log_json: LogJsonOption = None,
) -> None:
    """cursorsync's development tools: the demo on two local Apache Pulsar clusters, and
    the benchmarks.

    Results go to stdout, logs and errors to stderr. Exit status 2 means an error
    you can fix (the message says what); see each command's help for 1.
    """
    apply_global_options(ctx, log_level, log_json)


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def parse_strategies(evidence: str) -> list[str]:
    """The --evidence option's strategies, validated."""
    strategies = [x.strip() for x in evidence.split(",") if x.strip()]
    unknown = sorted(set(strategies) - {"position-property", "identity", "snapshot"})
    if unknown or not strategies:
        raise typer.BadParameter(f"{', '.join(unknown) or 'nothing'}: use any of "
                                 "position-property, identity, snapshot",
                                 param_hint="--evidence")
    return strategies


def steady_batch_rows(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """A batch benchmark's figures, then its last (steady) batch's."""
    rows = [(k, v) for k, v in result.items() if k != "batches"]
    return rows + [(f"steady batch: {k}", v) for k, v in result["batches"][-1].items()]


def print_figures(result: dict[str, Any], json_output: bool,
                  rows: list[tuple[str, Any]] | None = None) -> None:
    """A benchmark's figures: its JSON, or a FIGURE / VALUE table of ``rows`` (by default
    each top-level figure)."""
    if json_output:
        echo_json(result)
        return
    from cursorsync.app.render import format_table

    typer.echo(format_table(("FIGURE", "VALUE"), list(result.items()) if rows is None else rows))


__all__ = ["app", "bench_app", "echo_json", "parse_strategies", "print_figures",
           "steady_batch_rows"]
