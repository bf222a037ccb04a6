"""``cursorsync run``: the job itself, and ``cursorsync check``: the preflight it runs first."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

import typer

from cursorsync.app.cli_base import (
    ConfigOption,
    JsonOption,
    app,
    cli_state,
    examples,
    fail,
    load_config_file,
    load_lazily,
    user_errors,
)
from cursorsync.app.logs import LevelName, configure_logging, echo
from cursorsync.app.settings import Config

if TYPE_CHECKING:
    from cursorsync.app.preflight import Finding

log = logging.getLogger(__name__)


@app.command(
    short_help="Run the sync job (the Spark application).",
    epilog=examples(
        "cursorsync run -c cursorsync.yaml",
        "cursorsync run -c cursorsync.yaml --dry-run",
        "cursorsync run -c cursorsync.yaml --once   # what is there now, then stop",
        "cursorsync --log-level debug run -c cursorsync.yaml --skip-check",
    ),
)
@user_errors
def run(
    config: ConfigOption,
    dry_run: Annotated[
        bool | None,
        typer.Option("--dry-run/--no-dry-run", show_default=False,
                     help="Override emission.dry_run: translate and record, but send no acks."),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Process what is available now, then stop; exit 2 "
                           "when two batches do not complete in 10 minutes."),
    ] = False,
    skip_check: Annotated[
        bool, typer.Option("--skip-check", help="Start without the preflight (`check`)."),
    ] = False,
) -> None:
    """Run the sync job (the Spark application) with a config file, after the preflight.

    The preflight's findings other than ok go to stderr; a problem stops the job before
    Spark starts (exit 2). The job runs until SIGTERM or Ctrl-C, or with --once until
    each query completed two batches.
    """
    cfg = load_config_file(config)
    state = cli_state()
    configure_logging(
        state.log_level or cfg.logging.level,
        json=cfg.logging.json_format if state.log_json is None else state.log_json,
    )
    if not skip_check and _resolved(cfg):  # the job itself names an unresolved URL
        findings = _findings(cfg)
        _show([f for f in findings if f.status != "ok"], err=True)
        _stop_on_problems(findings, "; nothing was started")
    run_job = load_lazily("cursorsync.app.job", "run_job", "cursorsync run")
    log.info("starting cursorsync job", extra={"config": str(config), "once": once,
                                               "dry_run_override": dry_run})
    run_job(cfg, once=once, dry_run_override=dry_run)


@app.command(
    short_help="The preflight: reach everything the job needs.",
    epilog=examples(
        "cursorsync check -c cursorsync.yaml",
        "cursorsync check -c cursorsync.yaml --json | jq '.findings[] | "
        "select(.status != \"ok\")'",
    ),
)
@user_errors
def check(config: ConfigOption, json_output: JsonOption = False) -> None:
    """The preflight: both clusters' admin APIs and brokers with the configured auth, the
    topics and subscriptions, single-entry reads, the tables path.

    One line per check on stdout (ok, warning or problem, naming the thing), or with
    --json one document: {"ok", "problems", "warnings", "findings": [{"status", "what",
    "detail"}]}. Exit status 0 when nothing is a problem, 2 otherwise (with one error
    line on stderr).
    """
    from cursorsync.app.preflight import findings_json

    findings = _findings(load_config_file(config))
    if json_output:
        typer.echo(findings_json(findings))
    else:
        _show(findings, err=False)
    _stop_on_problems(findings, "")


def _resolved(cfg: Config) -> bool:
    from cursorsync.app.settings import EMBEDDED

    return all(getattr(c, key) != EMBEDDED for c in (cfg.source, cfg.target)
               for key in ("service_url", "admin_url"))


#: The log level a finding's line has in JSON logs.
_FINDING_LEVEL: dict[str, LevelName] = {"ok": "info", "warning": "warning", "problem": "error"}


def _show(findings: list[Finding], *, err: bool) -> None:
    """One line per finding (one JSON object each with JSON logs)."""
    for f in findings:
        echo(f.line(), err=err, level=_FINDING_LEVEL[f.status], status=f.status)


def _findings(cfg: Config) -> list[Finding]:
    from cursorsync.app.preflight import check as run_checks

    cfg.require_resolved()
    return run_checks(cfg)


def _stop_on_problems(findings: list[Finding], after: str) -> None:
    """One error line and exit 2 when a finding is a problem."""
    from cursorsync.app.preflight import problems

    bad = problems(findings)
    if bad:
        fail(f"the preflight found {len(bad)} problem(s){after}")
