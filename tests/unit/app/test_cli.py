"""The command line (typer's CliRunner) and the logging set-up it installs."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

import cursorsync.app.cli as cli
from cursorsync.app.logs import (
    JsonFormatter,
    KeyValueFormatter,
    configure_logging,
    parse_level,
)
from cursorsync.app.progress import Progress, progress
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, Config
from cursorsync.core.cursor import AckPlan, CursorState
from cursorsync.core.positions import Position
from cursorsync.core.ranges import RangeSet
from cursorsync.core.records import ObservedCursor, PartitionKey, SyncRecord
from cursorsync.core.segments import Segment, SegmentSet, TopicMapping
from cursorsync.errors import TopicNotFoundError
from cursorsync.tables import open_store
from cursorsync.tables.rows import cursor_state_rows, mapping_rows, sync_progress_rows
from tests.support.processes import fake_module

CONFIG = str(EMBEDDED_CONFIG_PATH)
ORDERS = "persistent://public/default/orders"
NOW = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)


pytestmark = pytest.mark.usefixtures("restore_logging")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli.app, list(args))


def write_config(tmp_path: Path, change: Any) -> Path:
    data = yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())
    change(data)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------ help


def test_help_lists_every_command() -> None:
    out = invoke("--help")
    assert out.exit_code == 0
    for word in ("run", "check", "status", "lookup", "resume", "--log-level", "--log-json"):
        assert word in out.stdout
    # The demo and the benchmarks are the development tools' (cursorsync-dev), not the product's.
    assert set(typer.main.get_group(cli.app).commands) == {
        "run", "check", "status", "lookup", "resume", "migrate", "retire"}
    for gone in ("demo", "bench"):
        out = invoke(gone)
        assert out.exit_code == 2, out.output
        assert out.stderr.startswith(f"error: no such command '{gone}'"), out.stderr


@pytest.mark.parametrize(("command", "words"), [
    (["run"], ["--config", "--dry-run", "--once", "CURSORSYNC_CONFIG"]),
    (["status"], ["--config", "--topic", "--subscription", "--json", "--ready", "--max-age"]),
    (["lookup"], ["TOPIC", "LEDGER:ENTRY", "--partition", "Exit status"]),
])
def test_command_help(command: list[str], words: list[str]) -> None:
    out = invoke(*command, "--help")
    assert out.exit_code == 0
    for word in words:
        assert word in out.stdout, word


def test_version() -> None:
    out = invoke("--version")
    assert out.exit_code == 0 and out.stdout.startswith("cursorsync ")


# ------------------------------------------------------------------ config errors


def test_missing_config_file_is_one_line_exit_2(tmp_path: Path) -> None:
    out = invoke("status", "-c", str(tmp_path / "nope.yaml"))
    assert out.exit_code == 2
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith("error: config file not found:")
    assert "nope.yaml" in out.stderr and "Traceback" not in out.stderr


def test_unparseable_config_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [unclosed\n")
    out = invoke("run", "-c", str(bad))
    assert out.exit_code == 2
    assert out.stderr.startswith(f"error: {bad}:") and "bad YAML" in out.stderr


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    path = write_config(tmp_path, lambda d: d["clusters"]["source"].update(colour="red"))
    out = invoke("run", "-c", str(path))
    assert out.exit_code == 2
    assert "clusters.source.colour: unknown key" in out.stderr
    assert "Traceback" not in out.stderr


def test_config_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(cli.CONFIG_ENV, str(tmp_path / "from-env.yaml"))
    out = invoke("status")
    assert out.exit_code == 2 and "from-env.yaml" in out.stderr


# ------------------------------------------------------------------ run


def test_run_dispatches_to_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    levels: list[int] = []
    calls = fake_module(monkeypatch, "cursorsync.app.job", "run_job",
                        lambda *a, **k: levels.append(logging.getLogger().level))
    assert invoke("run", "-c", CONFIG).exit_code == 0
    assert invoke("run", "-c", CONFIG, "--once", "--dry-run").exit_code == 0
    assert invoke("--log-level", "error", "run", "-c", CONFIG, "--no-dry-run").exit_code == 0
    assert [(c["once"], c["dry_run_override"]) for c in calls] == [
        (False, None), (True, True), (False, False)]
    config = calls[0]["args"][0]
    assert isinstance(config, Config) and config.clusters.source.name == "a"
    # The config's logging.level (INFO) applies unless --log-level is given.
    assert levels == [logging.INFO, logging.INFO, logging.ERROR]


def test_run_logs_as_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_module(monkeypatch, "cursorsync.app.job", "run_job", lambda *a, **k: None)
    out = invoke("--log-json", "--log-level", "info", "run", "-c", CONFIG, "--once")
    assert out.exit_code == 0
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    start = next(x for x in lines if x["msg"] == "starting cursorsync job")
    assert start["level"] == "info" and start["logger"] == "cursorsync.app.cli_run"
    assert start["once"] is True and start["config"] == CONFIG
    assert start["ts"].endswith("Z")


def test_job_errors_are_one_line_unless_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(*args: Any, **kwargs: Any) -> None:
        raise TopicNotFoundError("topic persistent://t/n/orders does not exist on cluster b")

    fake_module(monkeypatch, "cursorsync.app.job", "run_job", gone)
    out = invoke("--log-level", "warning", "run", "-c", CONFIG)  # the config says INFO
    assert out.exit_code == 2
    assert out.stderr == "error: topic persistent://t/n/orders does not exist on cluster b\n"
    debug = invoke("--log-level", "debug", "run", "-c", CONFIG)
    assert debug.exit_code == 2
    assert "Traceback" in debug.stderr and "TopicNotFoundError" in debug.stderr
    assert debug.stderr.rstrip().endswith("does not exist on cluster b")


def test_missing_job_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cursorsync.app.job", None)
    out = invoke("run", "-c", CONFIG)
    assert out.exit_code == 2
    assert "`cursorsync run` is not available" in out.stderr and "cursorsync.app.job" in out.stderr


# ------------------------------------------------------------------ status, lookup


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The embedded config's tables (under $CURSORSYNC_WORK_DIR) with one topic's rows."""
    monkeypatch.setenv("CURSORSYNC_WORK_DIR", str(tmp_path))
    store = open_store("delta-rs", str(tmp_path / "tables"))
    key = PartitionKey(ORDERS, -1)
    clusters = {"source_cluster": "a", "target_cluster": "b"}
    store.append("mappings", mapping_rows(key, TopicMapping(SegmentSet.of(
        [Segment(3, 0, 8, 10, 100, "identity")])), written_at=NOW, **clusters),
        app_id="m", batch_id=0)
    store.append("cursor_states", cursor_state_rows(
        [ObservedCursor(key, "billing", CursorState.parse("3:40", "[(3:41..3:50]]"), NOW)],
        **clusters), app_id="s", batch_id=0)
    plan = AckPlan(Position(8, 50), RangeSet.parse("[(8:51..8:60]]"),
                   RangeSet.parse("[(8:9..8:50],(8:51..8:60]]"), Position(8, 9), 0, 0, 0, 0,
                   "exact")
    store.append("sync_progress", sync_progress_rows(
        [SyncRecord(key, "billing", plan, 2, False, NOW, NOW)], **clusters),
        app_id="s", batch_id=0)
    return tmp_path


def test_status_table_and_json(tables: Path) -> None:
    out = invoke("status", "-c", CONFIG)
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("TOPIC") and "billing" in out.stdout and "8:50" in out.stdout
    data = json.loads(invoke("status", "-c", CONFIG, "--json").stdout)
    row = data["partitions"][0]
    assert (row["subscription"], row["source_mark_delete"], row["target_mark_delete"]) == (
        "billing", "3:40", "8:50")
    assert row["mapped_entries"] == 100
    assert data["subscriptions"][0]["max_lag_ms"] == 0
    empty = json.loads(invoke("status", "-c", CONFIG, "--json", "-s", "audit").stdout)
    assert empty == {"subscriptions": [], "partitions": [], "source_polls": None}


def test_status_ready_is_the_failover_gate(tables: Path) -> None:
    """Exit 0 when every partition shown is ready, 1 when one is not, with the reason; the
    JSON answer says it per subscription and partition."""
    # The fixture's sync is exact, with nothing unmapped, but written at NOW (long ago).
    old = invoke("status", "-c", CONFIG, "--ready")
    assert old.exit_code == 1, old.output
    assert old.stdout.startswith("NOT READY: 1 of 1 partitions") and "last synced" in old.stdout
    fresh = invoke("status", "-c", CONFIG, "--ready", "--max-age", "1e12")
    assert fresh.exit_code == 0, fresh.output
    assert fresh.stdout.startswith("READY: 1 partitions of 1 subscriptions")
    data = json.loads(invoke("status", "-c", CONFIG, "--ready", "--json",
                             "--max-age", "1e12").stdout)
    assert data["ready"] is True
    assert data["subscriptions"] == [
        {"subscription": "billing", "ready": True, "partitions_not_ready": 0}]
    # Nothing recorded for a subscription: not ready.
    none = invoke("status", "-c", CONFIG, "--ready", "-s", "audit")
    assert none.exit_code == 1 and none.stdout.startswith("NOT READY: no subscriptions")


def test_status_without_tables_is_a_user_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CURSORSYNC_WORK_DIR", str(tmp_path / "empty"))
    out = invoke("status", "-c", CONFIG)
    assert out.exit_code == 2 and "no cursorsync tables under" in out.stderr
    assert str(tmp_path / "empty") in out.stderr


def test_lookup_exit_status_follows_the_outcome(tables: Path) -> None:
    exact = invoke("lookup", "-c", CONFIG, ORDERS, "3:5")
    assert exact.exit_code == 0 and "8:15" in exact.stdout
    data = json.loads(invoke("lookup", "-c", CONFIG, "orders", "3:5", "--json").stdout)
    assert (data["outcome"], data["target"], data["evidence"]) == ("exact", "8:15", "identity")
    unmapped = invoke("lookup", "-c", CONFIG, ORDERS, "3:100", "--json")
    assert unmapped.exit_code == 1
    assert json.loads(unmapped.stdout)["mapped_before"] == "3:99"
    unknown = invoke("lookup", "-c", CONFIG, "persistent://t/ns/other", "1:1")
    assert unknown.exit_code == 1 and "unknown-topic" in unknown.stdout
    bad = invoke("lookup", "-c", CONFIG, ORDERS, "3-5")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: malformed position")


def test_resume_json(tables: Path) -> None:
    """What was resumed, per partition; nothing halted is an error (exit 2, one line)."""
    from cursorsync.core.records import HaltRecord
    from cursorsync.sync.halts import record_halts

    store = open_store("delta-rs", str(tables / "tables"))
    halts = [HaltRecord(PartitionKey(ORDERS, p), "billing", True, "source rewound", 3, NOW)
             for p in (0, 1)]
    record_halts(store, halts, source_cluster="a", target_cluster="b", app_id="s", batch_id=0)
    args = ["resume", "-c", CONFIG, "-t", ORDERS, "-s", "billing", "--json"]
    out = invoke(*args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"resumed": [
        {"topic": f"{ORDERS}-partition-{p}", "partition": p, "subscription": "billing"}
        for p in (0, 1)]}
    again = invoke(*args)
    assert again.exit_code == 2 and again.stdout == ""
    assert again.stderr.startswith("error: nothing is halted for subscription 'billing'")
    assert again.stderr.count("\n") == 1


# ------------------------------------------------------------------ logging, progress


def _record(**extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("cursorsync.sync.step", logging.WARNING, __file__, 1,
                               "sync stalled for %s", ("billing",), None)
    record.__dict__.update(extra)
    return record


def test_json_formatter_fields() -> None:
    line = JsonFormatter().format(_record(lag_ms=1200, topic=ORDERS, at=NOW))
    data = json.loads(line)
    assert list(data)[:4] == ["ts", "level", "logger", "msg"]
    assert data["msg"] == "sync stalled for billing" and data["level"] == "warning"
    assert (data["lag_ms"], data["topic"]) == (1200, ORDERS)
    assert data["at"] == str(NOW)


def test_key_value_formatter() -> None:
    line = KeyValueFormatter().format(_record(lag_ms=1200, note="two words"))
    assert " WARNING cursorsync.sync.step: sync stalled for billing " in line
    assert line.endswith('lag_ms=1200 note="two words"')


def test_configure_logging_levels_and_quiet_libraries() -> None:
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    assert logging.getLogger().level == logging.DEBUG
    for name in ("py4j", "pyspark", "pulsar"):
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING
    logging.getLogger("py4j.clientserver").info("Command to send: ...")
    logging.getLogger("cursorsync.x").debug("kept", extra={"k": 1})
    assert stream.getvalue().count("\n") == 1 and "kept k=1" in stream.getvalue()
    configure_logging("warn", json=True, stream=stream)  # replaces, never stacks handlers
    ours = [h for h in logging.getLogger().handlers if isinstance(h.formatter, JsonFormatter)]
    assert len(ours) == 1 and logging.getLogger().level == logging.WARNING
    with pytest.raises(ValueError, match="Valid values are: debug, info"):
        parse_level("loud")


def test_progress_line_is_erased(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with Progress("working", enabled=True, interval_s=0.01) as p:
        time.sleep(0.05)
        p.update("still working")
        time.sleep(0.05)
    text = err.getvalue()
    assert "working ... " in text and "still working ... " in text
    assert text.endswith("\r") and "\n" not in text
    assert not progress("x", json_output=True)._enabled
    assert not progress("x", json_output=False)._enabled  # StringIO is not a TTY
