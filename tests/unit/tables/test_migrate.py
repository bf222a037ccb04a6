"""Table schema versions on delta-rs: tables written by an earlier schema file, opened by
this one (cursorsync.tables.migrate); delta-spark's cases are in
tests/integration/tables/test_migrate.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable
from typer.testing import CliRunner

import cursorsync.app.cli as cli
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH
from cursorsync.tables import SCHEMAS_ENV, RowFilter, TableStore, open_reader, open_store
from cursorsync.tables import schema as schema_module
from cursorsync.tables.migrate import (
    BUCKETS_PROPERTY,
    VERSION_PROPERTY,
    TableVersionError,
    migrate,
    plan,
)
from tests.support.table_rows import TOPICS, make_cursor_states, make_progress

Edit = Callable[[dict[str, Any]], None]
SHIPPED = Path(schema_module.__file__).parent / "schemas"


def schema_files(tmp_path: Path, name: str, table: str, edit: Edit) -> Path:
    """A copy of the shipped schema files with ``table``'s edited."""
    directory = tmp_path / name
    shutil.copytree(SHIPPED, directory)
    path = directory / f"{table}.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return directory


def bump(then: Edit | None = None) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        doc["version"] += 1
        if then is not None:
            then(doc)
    return edit


def add_column(name: str, type_: str = "string", *, nullable: bool = True,
               before: str | None = None) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        column = {"name": name, "type": type_, "nullable": nullable, "doc": "new"}
        names = [f["name"] for f in doc["fields"]]
        doc["fields"].insert(names.index(before) if before else len(names), column)
    return edit


def retype(name: str, type_: str) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        next(f for f in doc["fields"] if f["name"] == name)["type"] = type_
    return edit


def written_before_versions(root: str, table: str, rows: pa.Table) -> TableStore:
    """A table as releases before recorded versions wrote it: created by the backend alone,
    no properties, rows appended as batch 4."""
    store = open_store("delta-rs", root)
    store._ensure(table)  # type: ignore[arg-type]
    assert store.append(table, rows, app_id="sync", batch_id=4)  # type: ignore[arg-type]
    return store


def properties(root: str, table: str) -> dict[str, str]:
    return dict(DeltaTable(f"{root}/{table}").metadata().configuration)


def test_a_table_without_a_recorded_version_is_adopted_at_its_rows_version(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "tables")
    rows = make_cursor_states(TOPICS[0], ["s1", "s2"])
    written_before_versions(root, "cursor_states", rows)
    assert VERSION_PROPERTY not in properties(root, "cursor_states")
    m = plan(open_store("delta-rs", root), "cursor_states")
    assert (m.action, m.stored_version, m.recorded) == ("record", 1, False)

    store = open_store("delta-rs", root)
    store.ensure("cursor_states")
    assert properties(root, "cursor_states") == {VERSION_PROPERTY: "1", BUCKETS_PROPERTY: "16"}
    assert plan(store, "cursor_states").action == "current"
    assert store.read("cursor_states").num_rows == 2
    assert store.last_batch("sync") == 4


def test_a_new_table_records_its_version(tmp_path: Path) -> None:
    store = open_store("delta-rs", str(tmp_path / "tables"))
    store.ensure_all()
    assert properties(store.root, "mappings") == {VERSION_PROPERTY: "4", BUCKETS_PROPERTY: "64"}
    assert {plan(store, t).action for t in ("mappings", "halts", "sync_progress")} == {"current"}


def test_new_nullable_columns_are_added_in_place_when_the_table_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "tables")
    old = make_progress(TOPICS[1], "billing")
    written_before_versions(root, "sync_progress", old)
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v2", "sync_progress", bump(add_column("broker")))))

    store = open_store("delta-rs", root)
    store.ensure("sync_progress")
    assert properties(root, "sync_progress")[VERSION_PROPERTY] == "2"
    rows = store.read("sync_progress")
    assert rows.num_rows == 1 and rows.column("broker").to_pylist() == [None]
    for name in old.column_names:  # every value the old release wrote is still there
        assert rows.column(name).to_pylist() == old.column(name).to_pylist(), name
    assert rows.column("schema_version").to_pylist() == [1]  # the version that wrote it
    new = make_progress(TOPICS[1], "audit").append_column("broker", pa.array(["b-1"]))
    assert store.append("sync_progress", new, app_id="sync", batch_id=5)
    read = store.read("sync_progress", RowFilter.of(subscription="audit"))
    assert read.column("broker").to_pylist() == ["b-1"]
    assert read.column("schema_version").to_pylist() == [2]


def test_a_widened_column_refuses_to_open_and_migrate_rewrites_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous release wrote lag_ms as int; this one wants long: the table does not
    open (the message names it, its version and the command) until ``migrate`` rewrites
    every row, keeping values and the batch watermark."""
    root = str(tmp_path / "tables")
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v1", "sync_progress", retype("lag_ms", "int"))))
    store = written_before_versions(root, "sync_progress", make_progress(TOPICS[2], "billing"))
    store.ensure("sync_progress")  # the old release records its version
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(tmp_path, "v2", "sync_progress", bump())))

    with pytest.raises(TableVersionError) as refused:
        open_store("delta-rs", root).ensure("sync_progress")
    message = str(refused.value)
    assert message.startswith(f"table sync_progress at {root}/sync_progress is at version 1 ")
    assert "needs version 2" in message and "lag_ms: type int32 -> int64" in message
    assert "`cursorsync migrate -c FILE`" in message and "\n" not in message

    dry = migrate(store, "sync_progress", dry_run=True)
    assert (dry.action, dry.stored_version, dry.version) == ("rewrite", 1, 2)
    assert properties(root, "sync_progress")[VERSION_PROPERTY] == "1"  # nothing changed

    migrate(store, "sync_progress")
    assert properties(root, "sync_progress")[VERSION_PROPERTY] == "2"
    reopened = open_store("delta-rs", root)
    reopened.ensure("sync_progress")
    rows = reopened.read("sync_progress")
    assert rows.schema.field("lag_ms").type == pa.int64()
    assert rows.column("lag_ms").to_pylist() == [250]
    assert rows.column("subscription").to_pylist() == ["billing"]
    assert reopened.last_batch("sync") == 4
    # The batch already written is still recognised as written: no duplicate on a replay.
    assert not reopened.append("sync_progress", make_progress(TOPICS[2], "billing"),
                               app_id="sync", batch_id=4)


def test_a_new_topic_bucket_count_is_a_rewrite_that_moves_rows_to_their_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "tables")
    store = written_before_versions(root, "cursor_states",
                                    make_cursor_states(TOPICS[3], ["s1"]))
    store.ensure("cursor_states")

    def buckets(doc: dict[str, Any]) -> None:
        doc["topic_buckets"] = 7
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(tmp_path, "v2", "cursor_states",
                                                     bump(buckets))))
    with pytest.raises(TableVersionError, match=r"topic buckets 16 -> 7"):
        open_store("delta-rs", root).ensure("cursor_states")
    migrate(store, "cursor_states")
    assert properties(root, "cursor_states")[BUCKETS_PROPERTY] == "7"
    rows = open_store("delta-rs", root).read("cursor_states", RowFilter.of(topic=TOPICS[3]))
    assert rows.column("subscription").to_pylist() == ["s1"]


@pytest.mark.parametrize(("edit", "reason"), [
    (bump(add_column("broker", nullable=False)), "new columns broker are not nullable"),
    (bump(retype("lag_ms", "int")), "lag_ms: type int64 -> int32"),
    (bump(lambda doc: doc["fields"].pop(-2)), "columns lag_ms are not in the schema file"),
])
def test_a_change_nothing_migrates_is_refused_by_open_and_by_migrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Edit, reason: str
) -> None:
    root = str(tmp_path / "tables")
    store = written_before_versions(root, "sync_progress", make_progress(TOPICS[0], "x"))
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(tmp_path, "v2", "sync_progress", edit)))
    for attempt in (lambda: open_store("delta-rs", root).ensure("sync_progress"),
                    lambda: migrate(store, "sync_progress")):
        with pytest.raises(TableVersionError) as refused:
            attempt()
        assert reason in str(refused.value)
        assert "(its rows'; no version recorded) and no migration leads to version 2" in str(
            refused.value)
    assert VERSION_PROPERTY not in properties(root, "sync_progress")
    monkeypatch.delenv(SCHEMAS_ENV)  # the release that wrote it reads it as it was
    assert open_store("delta-rs", root).read("sync_progress", columns=["subscription"]
                                             ).num_rows == 1


def test_a_table_newer_than_this_release_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "tables")
    store = open_store("delta-rs", root)
    store.ensure("halts")
    DeltaTable(f"{root}/halts").alter.set_table_properties(
        {VERSION_PROPERTY: "9"}, raise_if_not_exists=False)
    with pytest.raises(TableVersionError, match=r"table halts .* is at version 9, newer than "
                       r"this cursorsync's schema version 1: run the release that wrote it"):
        open_store("delta-rs", root).ensure("halts")


# ------------------------------------------------------------------ the command


def test_migrate_command_plans_every_table_then_migrates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())))
    monkeypatch.setenv("CURSORSYNC_WORK_DIR", str(work))
    root = str(work / "tables")
    written_before_versions(root, "sync_progress", make_progress(TOPICS[0], "x"))
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v2", "sync_progress", bump(add_column("broker")))))

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli.app, ["migrate", "-c", str(config), *args])

    dry = run("--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "mappings: absent (the job creates it)" in dry.stdout
    assert ("sync_progress: at version 1 (its rows'; no version recorded): adds nullable "
            "columns broker, records version 2") in dry.stdout
    assert VERSION_PROPERTY not in properties(root, "sync_progress")

    done = run()
    assert done.exit_code == 0, done.output
    assert done.stdout.endswith("migrated: 1 tables\n")
    assert properties(root, "sync_progress")[VERSION_PROPERTY] == "2"
    assert "sync_progress: at version 2, current" in run("--dry-run").stdout

    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(tmp_path, "v3", "sync_progress",
                                                     retype("lag_ms", "int"))))
    refused = run()
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: table sync_progress at ")
    assert "no migration leads to version 1" not in refused.stderr  # the stored one is newer
    assert "newer than this cursorsync's schema version 1" in refused.stderr


def test_status_reads_a_table_the_job_has_not_upgraded_yet_and_refuses_one_needing_migrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-only commands open no table for writing: a new nullable column reads as
    null and the table stays as it is; a table only ``migrate`` brings to this release
    is one error line naming it and the command, never the query engine's message."""
    work = tmp_path / "work"
    config = tmp_path / "config.yaml"
    doc = yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())
    doc["clusters"]["source"]["name"], doc["clusters"]["target"]["name"] = "A", "B"
    config.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("CURSORSYNC_WORK_DIR", str(work))
    root = str(work / "tables")
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v1", "sync_progress", retype("lag_ms", "int"))))
    store = written_before_versions(root, "sync_progress", make_progress(TOPICS[0], "billing"))
    store.ensure("sync_progress")
    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v2", "sync_progress", bump(lambda doc: (retype("lag_ms", "int")(doc),
                                                          add_column("broker")(doc))))))

    def status() -> Any:
        return CliRunner().invoke(cli.app, ["status", "-c", str(config), "--json"])

    shown = status()
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.stdout)["partitions"]
    assert row["subscription"] == "billing" and row["lag_ms"] == 250
    assert properties(root, "sync_progress")[VERSION_PROPERTY] == "1"  # not upgraded
    read = open_reader(root).read("sync_progress", columns=["subscription", "broker"])
    assert read.column("broker").to_pylist() == [None]

    monkeypatch.setenv(SCHEMAS_ENV, str(schema_files(
        tmp_path, "v3", "sync_progress", bump(add_column("broker")))))  # lag_ms long
    refused = status()
    assert refused.exit_code == 2
    assert refused.stderr.startswith(f"error: table sync_progress at {root}/sync_progress is "
                                     "at version 1 and this cursorsync needs version 2")
    assert "`cursorsync migrate -c FILE`" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "DataFusion" not in refused.stderr
