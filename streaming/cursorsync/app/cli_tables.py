"""``cursorsync status``, ``lookup`` and ``resume``: the commands that read (and, for
``resume``, write) the tables, without Spark or a broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from cursorsync.app.cli_base import (
    EXIT_NOT_FOUND,
    ConfigOption,
    JsonOption,
    app,
    examples,
    load_config_file,
    query_store,
    user_errors,
)
from cursorsync.app.progress import progress

# ------------------------------------------------------------------ queries

#: ``status --ready`` by default lets a partition's last sync be this many times as old as
#: the interval at which a running job writes an unchanged cursor's rows again
#: (tables.unchanged_rows_every_batches x spark.trigger_interval_s), and never less than
#: READY_MIN_AGE_S.
READY_AGE_FACTOR = 2
READY_MIN_AGE_S = 120.0


@app.command(
    short_help="Where each subscription stands; the failover gate (--ready).",
    epilog=examples(
        "cursorsync status -c cursorsync.yaml",
        "cursorsync status -c cursorsync.yaml -s billing --json",
        "cursorsync status -c cursorsync.yaml -s billing --ready   # exit 0 ready, 1 not",
        "cursorsync status -c cursorsync.yaml --ready --json --max-age 300",
    ),
)
@user_errors
def status(
    config: ConfigOption,
    topic: Annotated[
        str | None,
        typer.Option("--topic", "-t", metavar="TOPIC",
                     help="Only this topic (all its partitions) or one <topic>-partition-N."),
    ] = None,
    subscription: Annotated[
        str | None, typer.Option("--subscription", "-s", metavar="NAME",
                                 help="Only this subscription.")
    ] = None,
    json_output: JsonOption = False,
    ready: Annotated[
        bool, typer.Option("--ready", help="The failover gate: exit 0 when every partition "
                           "shown is ready to fail over, 1 when not, with the reasons.")
    ] = False,
    max_age: Annotated[
        float | None, typer.Option(
            "--max-age", min=1, metavar="SECONDS",
            help="With --ready: the oldest last sync a partition may have (default: twice "
                 "the interval at which the job writes an unchanged cursor's rows).")
    ] = None,
    forecast: Annotated[
        bool, typer.Option("--forecast", help="The redelivery forecast: messages a failover "
                           "now would deliver again, per cause, each exact, a bound or "
                           "unknown; reads the source cursors and entries now.")
    ] = False,
) -> None:
    """Where each subscription stands: source cursor, target cursor, lag, mapping coverage.

    Reads the Delta tables only (no Spark, no broker). With --ready: whether failing over
    now is safe to rest on (exit 0) or not (exit 1): every partition's last sync exact,
    nothing acked on the source unmapped, no dry run, the last sync recent. With
    --forecast: how many messages each subscription would get again if it failed over now.
    """
    from cursorsync.app.readiness import readiness
    from cursorsync.app.render import (
        readiness_json,
        render_polls,
        render_readiness,
        render_status_table,
        status_json,
    )
    from cursorsync.app.status import subscription_status
    from cursorsync.sync import poll_health

    if ready and forecast:
        from cursorsync.errors import ConfigError

        raise ConfigError("status: give --ready or --forecast, not both")
    cfg = load_config_file(config)
    store = query_store(cfg)
    with progress("status: reading tables", json_output=json_output):
        rows = subscription_status(
            store, topic=topic, subscription=subscription,
            source_cluster=cfg.clusters.source.name, target_cluster=cfg.clusters.target.name,
        )
    if forecast:
        from cursorsync.app.forecast_read import forecast_now
        from cursorsync.app.render import forecast_json, render_forecast

        with progress("status: reading the source", json_output=json_output):
            parts = forecast_now(store, rows, cfg)
        typer.echo(forecast_json(parts) if json_output else render_forecast(parts))
        return
    polls = poll_health.read(Path(cfg.spark.checkpoint_dir) / poll_health.POLLS_DIR)
    if not ready:
        if json_output:
            typer.echo(status_json(rows, polls))
        else:
            warning = render_polls(polls)
            typer.echo(render_status_table(rows) + ("" if warning is None else f"\n\n{warning}"))
        return
    if max_age is None:
        every = cfg.tables.unchanged_rows_every_batches * cfg.spark.trigger_interval_s
        max_age = max(READY_MIN_AGE_S, READY_AGE_FACTOR * every)
    gate = readiness(rows, datetime.now(tz=UTC), max_age, polls)
    typer.echo(readiness_json(gate) if json_output else render_readiness(gate))
    if not gate.ready:
        raise typer.Exit(1)


@app.command(
    short_help="Translate a source position to the target's.",
    epilog=examples(
        "cursorsync lookup -c cursorsync.yaml persistent://tenant/ns/orders-partition-3 "
        "1042:17",
        "cursorsync lookup -c cursorsync.yaml persistent://tenant/ns/orders 1042:17 -p 3 "
        "--json",
    ),
)
@user_errors
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
        typer.Option("--partition", "-p", min=-1, metavar="N",
                     help="Partition index (instead of a -partition-N suffix)."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Translate one source position to its target position using the mappings table.

    Exit status 0 when mapped exactly, 1 when unmapped or the topic is unknown.
    """
    from cursorsync.app.lookup import lookup as lookup_position
    from cursorsync.app.render import lookup_json, render_lookup_table
    from cursorsync.core.positions import Position

    pos = Position.parse(position)
    cfg = load_config_file(config)
    with progress("lookup: reading mappings", json_output=json_output):
        result = lookup_position(
            query_store(cfg), topic, pos, partition=partition,
            source_cluster=cfg.clusters.source.name, target_cluster=cfg.clusters.target.name,
        )
    typer.echo(lookup_json(result) if json_output else render_lookup_table(result))
    if result.outcome != "exact":
        raise typer.Exit(EXIT_NOT_FOUND)


@app.command(
    short_help="Clear a halt after a source rewind.",
    epilog=examples(
        "cursorsync resume -c cursorsync.yaml --topic persistent://tenant/ns/orders "
        "--subscription billing",
        "cursorsync resume -c cursorsync.yaml -t persistent://tenant/ns/orders-partition-3 "
        "-s billing --json",
    ),
)
@user_errors
def resume(
    config: ConfigOption,
    topic: Annotated[
        str, typer.Option("--topic", "-t", metavar="TOPIC", help="The topic (all its "
                          "partitions) or one <topic>-partition-N.")
    ],
    subscription: Annotated[str, typer.Option("--subscription", "-s", metavar="NAME",
                                              help="The halted subscription.")],
    json_output: JsonOption = False,
) -> None:
    """Clear a halt: a subscription's sync goes on after a source rewind.

    The sync of a subscription halts when its source cursor moves back (rewind_policy
    halt) and stays halted, across restarts, until this clears it. Reset the target
    cursor first if the target must follow the source back: acks already sent cannot be
    taken back. Prints each partition resumed, or with --json {"resumed": [{"topic",
    "partition", "subscription"}]}. Exit status 2 when nothing is halted for the topic
    and subscription.
    """
    from cursorsync.sync.halts import resume as resume_halts
    from cursorsync.tables import open_reader

    cfg = load_config_file(config)
    store = open_reader(cfg.tables.path, storage_options=dict(cfg.tables.storage_options))
    resumed = resume_halts(store, source_cluster=cfg.clusters.source.name,
                           target_cluster=cfg.clusters.target.name, topic=topic,
                           subscription=subscription, operator="cursorsync resume")
    if json_output:
        typer.echo(json.dumps({"resumed": [
            {"topic": r.key.concrete_topic(), "partition": r.key.partition,
             "subscription": r.subscription} for r in resumed]}, indent=2))
        return
    for r in resumed:
        typer.echo(f"resumed {r.key.concrete_topic()} {r.subscription}")
