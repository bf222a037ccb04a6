"""``cursorsync retire``: remove what a job created on both clusters and in its storage
(what that is: :mod:`cursorsync.app.retire`)."""

from __future__ import annotations

from typing import Annotated

import typer

from cursorsync.app.cli_base import ConfigOption, app, examples, load_config_file, user_errors


@app.command(
    short_help="Remove what the job created on both clusters and in storage.",
    epilog=examples("cursorsync retire -c cursorsync.yaml --dry-run",
                    "cursorsync retire -c cursorsync.yaml",
                    "cursorsync retire -c cursorsync.yaml --keep-tables"),
)
@user_errors
def retire(
    config: ConfigOption,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; change nothing."),
    ] = False,
    keep_tables: Annotated[
        bool, typer.Option("--keep-tables",
                           help="Keep the Delta tables (tables.path); remove the rest."),
    ] = False,
) -> None:
    """Remove what the job of this config created, the job stopped: its own subscriptions
    on both clusters (cursorsync-mapping-source, cursorsync-mapping-target,
    cursorsync-probe), its checkpoints and its tables. Never the synced subscriptions,
    topics or messages.

    One line per item on stdout, saying what and on which cluster or path. Exit status 0
    when done; 2 while a job holds the tables' lease (nothing changed), or when anything
    could not be removed (the rest is; run it again once the cause is fixed).
    """
    from cursorsync.app.retire import retire as run_retire

    cfg = load_config_file(config)
    cfg.require_resolved()
    run_retire(cfg, dry_run=dry_run, keep_tables=keep_tables, echo=typer.echo)
