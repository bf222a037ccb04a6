"""``cursorsync migrate``: bring the tables to this release's schema versions, the job
stopped (the rule: :mod:`cursorsync.tables.migrate`)."""

from __future__ import annotations

from typing import Annotated

import typer

from cursorsync.app.cli_base import (
    ConfigOption,
    app,
    examples,
    load_config_file,
    query_store,
    user_errors,
)


@app.command(
    short_help="Bring the tables to this release's schema (the job stopped).",
    epilog=examples("cursorsync migrate -c cursorsync.yaml --dry-run",
                    "cursorsync migrate -c cursorsync.yaml"),
)
@user_errors
def migrate(
    config: ConfigOption,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what each table needs; change nothing.")
    ] = False,
) -> None:
    """Bring every table to this release's schema version, with the job stopped.

    Adds new nullable columns and records versions (what the job's start does by itself),
    and rewrites the tables whose rows need converting (a column widened, a new topic
    bucket count), one commit each. Plans every table before changing any: a table nothing
    migrates (a column dropped, a version newer than this release's) changes none.
    Exit status 0 when done, 2 when a table cannot be migrated (nothing changed).
    """
    from cursorsync.tables import TABLES
    from cursorsync.tables.migrate import TableVersionError, plan
    from cursorsync.tables.migrate import migrate as migrate_table

    store = query_store(load_config_file(config))
    plans = [plan(store, table) for table in TABLES]
    for m in plans:
        typer.echo(m.describe())
    if stuck := [m for m in plans if m.action in ("newer", "refused")]:
        raise TableVersionError(stuck[0].refusal())
    if dry_run:
        return
    for m in plans:
        if m.action not in ("absent", "current"):
            migrate_table(store, m.table)
    typer.echo(f"migrated: {sum(m.action not in ('absent', 'current') for m in plans)} tables")
