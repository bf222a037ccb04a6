"""JSON logs mean every line: the lines for the user (the preflight, the final error), an
exception nothing caught, other processes' output relayed, and the pulsar client's C++ log."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from cursorsync.app.logs import (
    CLI_LOGGER,
    JVM_LOGGER,
    configure_logging,
    echo,
    json_output,
    relay_lines,
)
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, load_config
from cursorsync.pulsar.client import CLIENT_LOGGER, log_client_line
from tests.support.json_lines import json_lines

pytestmark = pytest.mark.usefixtures("restore_logging")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def back_to_text() -> Any:
    yield
    configure_logging("warning", json=False)


# ------------------------------------------------------------------ echo


def test_echo_writes_one_json_object_per_line_whatever_the_level(
        capsys: pytest.CaptureFixture[str], back_to_text: None) -> None:
    configure_logging("critical", json=True)
    assert json_output()
    echo("problem  source cluster a admin API\nok       tables path /x", level="error",
         status="problem")
    try:
        raise ValueError("boom")
    except ValueError as err:
        echo("error: it broke", level="error", exc=err)
    echo("ok       done", err=False)
    out = capsys.readouterr()
    err = json_lines(out.err)
    assert [e["msg"] for e in err] == ["problem  source cluster a admin API",
                                       "ok       tables path /x", "error: it broke"]
    assert {e["logger"] for e in err} == {CLI_LOGGER}
    assert [e["level"] for e in err] == ["error", "error", "error"]
    assert err[0]["status"] == "problem" and "exc" not in err[0]
    assert "ValueError: boom" in err[2]["exc"]
    assert [e["msg"] for e in json_lines(out.out)] == ["ok       done"]


def test_echo_in_text_prints_the_line_as_it_is_after_its_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", json=False)
    assert not json_output()
    try:
        raise ValueError("boom")
    except ValueError as err:
        echo("error: it broke", level="error", exc=err)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("Traceback") and lines[-2] == "ValueError: boom"
    assert lines[-1] == "error: it broke"


# ------------------------------------------------------------------ uncaught exceptions


def test_an_uncaught_exception_is_one_record_with_json_and_the_default_without(
        capsys: pytest.CaptureFixture[str], back_to_text: None) -> None:
    default = sys.excepthook
    configure_logging("warning", json=True)
    try:
        raise RuntimeError("the driver died")
    except RuntimeError:
        sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
    thread = threading.Thread(target=lambda: 1 / 0, name="worker-1")
    thread.start()
    thread.join()
    records = json_lines(capsys.readouterr().err)
    assert [r["msg"] for r in records] == [
        "RuntimeError: the driver died", "thread worker-1: ZeroDivisionError: division by zero"]
    assert all(r["level"] == "critical" for r in records)
    assert "raise RuntimeError" in records[0]["exc"]
    configure_logging("warning", json=False)
    assert sys.excepthook is default


# ------------------------------------------------------------------ relayed output


def test_relayed_lines_pass_json_through_and_turn_the_rest_into_records(
        capsys: pytest.CaptureFixture[str], back_to_text: None) -> None:
    configure_logging("warning", json=True)
    log4j = '{"ts": "2026-01-02T03:04:05.678Z", "level": "error", "logger": "o.a.s.X", "msg": "x"}'
    relay_lines(["WARNING: Using incubator modules: jdk.incubator.vector\n", log4j + "\n",
                 "\n", "ERROR something bad\n", "Traceback (most recent call last):\n",
                 '{"not": "closed"\n'], JVM_LOGGER)
    lines = capsys.readouterr().err.splitlines()
    assert lines[1] == log4j  # as the JVM wrote it
    records = json_lines("\n".join(lines))
    assert [(r["level"], r["logger"]) for r in records] == [
        ("warning", JVM_LOGGER), ("error", "o.a.s.X"), ("error", JVM_LOGGER),
        ("warning", JVM_LOGGER), ("warning", JVM_LOGGER)]
    assert records[0]["msg"] == "WARNING: Using incubator modules: jdk.incubator.vector"
    assert records[4]["msg"] == '{"not": "closed"'


# ------------------------------------------------------------------ the pulsar client's log


def test_a_client_log_line_becomes_a_record_with_its_level_and_source(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    log_client_line("2026-11-28 17:30:17.169 ERROR [140226] ClientConnection:485 | "
                    "[<none> -> pulsar://127.0.0.1:1] Failed to establish connection: "
                    "Connection refused\n")
    log_client_line("2026-11-28 17:30:17.169 WARN  [1] ClientImpl:739 | a | b\n")
    log_client_line("a continuation line\n")
    log_client_line("\n")
    got = [(r.name, r.levelno, r.getMessage(), getattr(r, "source", None))
           for r in caplog.records]
    assert got == [
        (CLIENT_LOGGER, logging.ERROR, "[<none> -> pulsar://127.0.0.1:1] Failed to establish "
         "connection: Connection refused", "ClientConnection:485"),
        (CLIENT_LOGGER, logging.WARNING, "a | b", "ClientImpl:739"),
        (CLIENT_LOGGER, logging.WARNING, "a continuation line", None),
    ]


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, check=False)


CLIENT_TO_A_REFUSED_PORT = """
from cursorsync.app.logs import configure_logging
from cursorsync.pulsar.client import ClientSettings
configure_logging("warning", json={json})
client = ClientSettings("pulsar://127.0.0.1:{port}", operation_timeout_s=2,
                        connection_timeout_ms=1000).connect()
try:
    client.get_topic_partitions("persistent://public/default/x")
except Exception as err:
    print(type(err).__name__)
client.close()
"""


def test_the_pulsar_clients_own_lines_are_json_records_of_the_pulsar_logger(
        tmp_path: Path) -> None:
    """A fresh process: the C++ client keeps the logger of its first client."""
    out = _run(CLIENT_TO_A_REFUSED_PORT.format(json=True, port=free_port()), tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("Timeout", "ConnectError"), out.stdout
    records = json_lines(out.stderr)
    refused = [r for r in records if "Connection refused" in r["msg"]]
    assert refused, out.stderr
    assert all(r["logger"] == CLIENT_LOGGER and r["level"] in ("warning", "error")
               and r["source"].startswith("ClientConnection:") for r in refused)


def test_the_pulsar_clients_lines_follow_the_text_format_too(tmp_path: Path) -> None:
    out = _run(CLIENT_TO_A_REFUSED_PORT.format(json=False, port=free_port()), tmp_path)
    assert out.returncode == 0, out.stderr
    refused = [line for line in out.stderr.splitlines() if "Connection refused" in line]
    assert refused, out.stderr
    assert all(" pulsar: " in line and "source=ClientConnection:" in line for line in refused)


# ------------------------------------------------------------------ the command line


def _config(tmp_path: Path, **logging_: Any) -> Path:
    data = yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())
    for role in ("source", "target"):
        data["clusters"][role].update(service_url=f"pulsar://127.0.0.1:{free_port()}",
                                      admin_url=f"http://127.0.0.1:{free_port()}")
    data["tables"]["path"] = str(tmp_path / "tables")
    data["spark"]["checkpoint_dir"] = str(tmp_path / "checkpoints")
    data["logging"].update(logging_)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_failed_preflight_with_json_logs_is_json_on_every_line(tmp_path: Path) -> None:
    config = _config(tmp_path)
    out = subprocess.run([sys.executable, "-m", "cursorsync", "--log-json", "check", "-c",
                          str(config)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, check=False)
    assert out.returncode == 2, out.stderr
    # check's findings go to stdout whatever they are, its one error line to stderr.
    records = json_lines(out.stdout)
    assert [r["status"] for r in records] == ["problem", "problem", "ok"]
    assert [r["level"] for r in records] == ["error", "error", "info"]
    assert "source cluster a admin API" in records[0]["msg"]
    (error,) = json_lines(out.stderr)
    assert error["level"] == "error"
    assert error["msg"] == "error: the preflight found 2 problem(s)"


def test_the_run_preflight_follows_the_configs_json_setting(tmp_path: Path) -> None:
    """``run`` takes logging.json from the config: its preflight lines and its final
    error are JSON without --log-json."""
    config = _config(tmp_path, json=True)
    out = subprocess.run([sys.executable, "-m", "cursorsync", "run", "-c", str(config)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         check=False)
    assert out.returncode == 2, out.stderr
    records = json_lines(out.stdout + out.stderr)
    assert records[-1]["msg"].startswith("error: the preflight found 2 problem(s)")
    assert load_config(config).logging.json_format


# ------------------------------------------------------------------ the Spark JVM


def test_the_session_picks_the_json_appender_of_our_log4j_file_when_logs_are_json(
        back_to_text: None) -> None:
    from cursorsync.app.session import LOG4J_APPENDER_PROPERTY, driver_java_options

    cfg = load_config(EMBEDDED_CONFIG_PATH)
    flag = f"-D{LOG4J_APPENDER_PROPERTY}=json"
    assert flag in driver_java_options(cfg, json_logs=True).split()
    assert flag not in driver_java_options(cfg, json_logs=False).split()
    configure_logging("warning", json=True)
    assert flag in driver_java_options(cfg).split()  # follows our own logs
    log4j = Path(driver_java_options(cfg).split()[0].split("=", 1)[1]).read_text()
    assert f"${{sys:{LOG4J_APPENDER_PROPERTY}:-console}}" in log4j
    assert "appender.json.layout.type = JsonTemplateLayout" in log4j
