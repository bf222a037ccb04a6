"""``cursorsync run``: the job itself, and ``cursorsync check``: the preflight it runs first."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from cursorsync.app.cli_base import (
    ConfigOption,
    app,
    cli_state,
    load_config_file,
    load_lazily,
    user_errors,
)
from cursorsync.app.logs import LevelName, configure_logging, echo
from cursorsync.app.settings import Config

log = logging.getLogger(__name__)


@app.command()
@user_errors
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
    skip_check: Annotated[
        bool, typer.Option("--skip-check", help="Start without the preflight (`check`)."),
    ] = False,
) -> None:
    """Run the sync job (the Spark application) with a config file, after the preflight."""
    cfg = load_config_file(config)
    state = cli_state()
    configure_logging(
        state.log_level or cfg.logging.level,
        json=cfg.logging.json_format if state.log_json is None else state.log_json,
    )
    if not skip_check and _resolved(cfg):  # the job itself names an unresolved URL
        _preflight(cfg, quiet=True)
    run_job = load_lazily("cursorsync.app.job", "run_job", "cursorsync run")
    log.info("starting cursorsync job", extra={"config": str(config), "once": once,
                                               "dry_run_override": dry_run})
    run_job(cfg, once=once, dry_run_override=dry_run)


@app.command()
@user_errors
def check(config: ConfigOption) -> None:
    """The preflight: both clusters' admin APIs and brokers with the configured auth, the
    topics and subscriptions, single-entry reads, the tables path. One line per check;
    exit 2 on any problem."""
    _preflight(load_config_file(config), quiet=False)


def _resolved(cfg: Config) -> bool:
    from cursorsync.app.settings import EMBEDDED

    return all(getattr(c, key) != EMBEDDED for c in (cfg.source, cfg.target)
               for key in ("service_url", "admin_url"))


#: The log level a finding's line has in JSON logs.
_FINDING_LEVEL: dict[str, LevelName] = {"ok": "info", "warning": "warning", "problem": "error"}


def _preflight(cfg: Config, *, quiet: bool) -> None:
    """Print the findings (only the bad ones when ``quiet``); exit 2 on a problem."""
    from cursorsync.app.preflight import check as run_checks
    from cursorsync.app.preflight import problems

    cfg.require_resolved()
    findings = run_checks(cfg)
    bad = problems(findings)
    shown = [f for f in findings if f.status != "ok"] if quiet else findings
    for f in shown:
        echo(f.line(), err=bool(bad), level=_FINDING_LEVEL[f.status], status=f.status)
    if bad:
        echo(f"error: the preflight found {len(bad)} problem(s); nothing was started",
             level="error")
        raise typer.Exit(2)
