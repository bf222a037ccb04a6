"""``cursorsync run``: the job itself."""

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
from cursorsync.app.logs import configure_logging

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
) -> None:
    """Run the sync job (the Spark application) with a config file."""
    cfg = load_config_file(config)
    state = cli_state()
    configure_logging(
        state.log_level or cfg.logging.level,
        json=cfg.logging.json_format if state.log_json is None else state.log_json,
    )
    run_job = load_lazily("cursorsync.app.job", "run_job", "cursorsync run")
    log.info("starting cursorsync job", extra={"config": str(config), "once": once,
                                               "dry_run_override": dry_run})
    run_job(cfg, once=once, dry_run_override=dry_run)
