"""The command line's contract: results on stdout, one ``error: ...`` line on stderr for
every failure, exit status 0 done, 1 the answer is no, 2 an error; help that reads well,
with examples that are valid command lines."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

import cursorsync.app.cli as cli
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH
from tests.support.processes import fake_module

CONFIG = str(EMBEDDED_CONFIG_PATH)
COMMANDS = ("run", "check", "status", "lookup", "resume", "migrate", "retire")

pytestmark = pytest.mark.usefixtures("restore_logging")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli.app, list(args))


def one_error_line(out: Result) -> str:
    """stderr, which must be exactly one ``error: ...`` line."""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def write_config(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    """The embedded config with real-looking URLs and these sections' keys changed."""
    data = yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())
    for key, changes in sections.items():
        node = data
        for part in key.split("."):
            node = node.setdefault(part, {})
        node.update(changes)
    data["tables"]["path"] = str(tmp_path / "tables")
    data["spark"]["checkpoint_dir"] = str(tmp_path / "checkpoints")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def closed_port() -> int:
    """A loopback port nothing listens on (a connection to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def unreachable_clusters(port: int) -> dict[str, dict[str, Any]]:
    return {f"clusters.{role}": {"service_url": f"pulsar://127.0.0.1:{port}",
                                 "admin_url": f"http://127.0.0.1:{port}"}
            for role in ("source", "target")}


# ------------------------------------------------------------------ run


def test_run_once_that_times_out_exits_2(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    """--once waits for two batches of each query; when they do not come in time, the run
    failed, whatever it did meanwhile."""
    import cursorsync.app.job as job_module

    monkeypatch.chdir(tmp_path)  # the job's lease goes under the config's relative tables.path

    class Idle:  # a query that runs no batch: its trigger is always busy
        name = "cursorsync-sync"
        lastProgress = None

        @property
        def status(self) -> dict[str, bool]:
            return {"isDataAvailable": True, "isTriggerActive": True}

        def exception(self) -> None:
            return None

        def stop(self) -> None:
            pass

    sinks: Any = {
        "mapping_sink": SimpleNamespace(last_batch=-1, builder=SimpleNamespace(hole_check=None)),
        "sync_sink": SimpleNamespace(last_batch=-1, step=SimpleNamespace(
            lookups=SimpleNamespace(close=lambda: None)))}
    job = job_module.RunningJob(spark=None, queries=[Idle(), Idle()], emitter=None, admin=None,
                                **sinks)
    monkeypatch.setattr(job_module, "start_job", lambda *a, **k: job)
    monkeypatch.setattr(job_module, "ONCE_TIMEOUT_S", 0.3)
    out = invoke("--log-level", "warning", "run", "-c", CONFIG, "--once")
    assert out.exit_code == 2, out.output
    assert one_error_line(out) == (
        "error: run --once: the queries did not complete two batches in 0.3 s; the batches "
        "they completed are kept, and the next run goes on from there")
    assert job.stopped


def test_a_busy_metrics_port_is_one_line_naming_it(tmp_path: Path) -> None:
    """The whole process, not only the command: one line naming the port, exit 2, before
    Spark starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write_config(tmp_path, metrics={"port": port})
        done = subprocess.run([sys.executable, "-m", "cursorsync.app.cli", "run", "-c",
                               str(path), "--skip-check"],
                              capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    # Log lines may come before it (the config logs at INFO); nothing else.
    lines = done.stderr.splitlines()
    assert [line for line in lines if not re.match(r"\d{4}-\d\d-\d\dT.* INFO ", line)] == [
        f"error: cannot serve metrics on 127.0.0.1:{port} (metrics.host, metrics.port): "
        "Address already in use"], done.stderr
    assert done.stdout == ""


def test_an_unexpected_error_is_one_line_and_its_traceback_only_when_debugging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("spark.master")

    fake_module(monkeypatch, "cursorsync.app.job", "run_job", broken)
    out = invoke("--log-level", "warning", "run", "-c", CONFIG)
    assert out.exit_code == 2
    assert one_error_line(out) == (
        "error: KeyError: 'spark.master' (unexpected; `cursorsync --log-level debug ...` "
        "prints the traceback)")
    debug = invoke("--log-level", "debug", "run", "-c", CONFIG)
    assert debug.exit_code == 2
    assert "Traceback" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("error: KeyError: 'spark.master'")


def test_an_unexpected_error_of_many_lines_shows_its_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Py4J error's text is the whole Java stack trace."""
    def java(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("An error occurred while calling o42.start.\n"
                           ": java.io.IOException: No FileSystem for scheme: s3a\n"
                           "\tat org.apache.hadoop.fs.FileSystem.getFileSystemClass")

    fake_module(monkeypatch, "cursorsync.app.job", "run_job", java)
    out = invoke("--log-level", "warning", "run", "-c", CONFIG)
    assert out.exit_code == 2
    assert one_error_line(out).startswith(
        "error: RuntimeError: An error occurred while calling o42.start. (unexpected;")


def test_a_config_with_several_problems_lists_them_under_one_error_line(
        tmp_path: Path) -> None:
    path = write_config(tmp_path, **{"clusters.source": {"colour": "red"},
                                     "emission": {"mode": "fast"}})
    out = invoke("status", "-c", str(path))
    assert out.exit_code == 2 and out.stdout == ""
    first, *rest = out.stderr.splitlines()
    assert first == f"error: invalid configuration {path}: 2 problems"
    assert [line.split(":")[0] for line in rest] == [
        "  clusters.source.colour", "  emission.mode"]


def test_an_os_error_names_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", "/ckpt/sync/offsets/7")

    fake_module(monkeypatch, "cursorsync.app.job", "run_job", unreadable)
    out = invoke("--log-level", "warning", "run", "-c", CONFIG)
    assert out.exit_code == 2
    assert one_error_line(out).startswith(
        "error: PermissionError: Permission denied: '/ckpt/sync/offsets/7' (unexpected;")


def test_ctrl_c_is_exit_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    fake_module(monkeypatch, "cursorsync.app.job", "run_job", interrupted)
    out = invoke("--log-level", "warning", "run", "-c", CONFIG)
    assert out.exit_code == 130 and one_error_line(out) == "error: interrupted"


# ------------------------------------------------------------------ check


def test_check_prints_its_findings_on_stdout_and_one_error_line(tmp_path: Path) -> None:
    """Problems are results of `check` as much as oks: stdout; stderr only says it failed."""
    port = closed_port()
    path = write_config(tmp_path, **unreachable_clusters(port))
    out = invoke("check", "-c", str(path))
    assert out.exit_code == 2, out.output
    assert one_error_line(out) == "error: the preflight found 2 problem(s)"
    lines = out.stdout.splitlines()
    assert lines[0].startswith(
        f"problem  source cluster a admin API http://127.0.0.1:{port}: ")
    assert "Connection refused" in lines[0]
    assert lines[-1] == f"ok       tables path {tmp_path / 'tables'}"


def test_check_json(tmp_path: Path) -> None:
    port = closed_port()
    path = write_config(tmp_path, **unreachable_clusters(port))
    out = invoke("check", "-c", str(path), "--json")
    assert out.exit_code == 2
    one_error_line(out)
    data = json.loads(out.stdout)
    assert (data["ok"], data["problems"], data["warnings"]) == (False, 2, 0)
    assert [f["status"] for f in data["findings"]] == ["problem", "problem", "ok"]
    first = data["findings"][0]
    assert set(first) == {"status", "what", "detail"}
    assert first["what"] == f"source cluster a admin API http://127.0.0.1:{port}"
    assert data["findings"][2] == {"status": "ok", "what": f"tables path {tmp_path / 'tables'}",
                                   "detail": ""}


def test_run_prints_the_preflight_on_stderr_and_stops(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`run`'s preflight is a diagnostic of the run: stderr, then the one error line."""
    calls = fake_module(monkeypatch, "cursorsync.app.job", "run_job", lambda *a, **k: None)
    path = write_config(tmp_path, **unreachable_clusters(closed_port()))
    out = invoke("run", "-c", str(path))
    assert out.exit_code == 2 and out.stdout == "" and not calls
    lines = out.stderr.splitlines()
    assert [line.split()[0] for line in lines] == ["problem", "problem", "error:"]
    assert lines[-1] == "error: the preflight found 2 problem(s); nothing was started"


def test_a_missing_tls_file_is_named(tmp_path: Path) -> None:
    port = closed_port()
    clusters = unreachable_clusters(port)
    missing = tmp_path / "ca.pem"
    path = write_config(tmp_path, **clusters, **{
        "clusters.source.auth": {"tls": {"ca_file": str(missing)}}})
    out = invoke("check", "-c", str(path))
    assert out.exit_code == 2
    assert out.stdout.splitlines()[0] == (
        f"problem  source cluster a admin API: cluster a: auth.tls.ca_file: cannot read "
        f"'{missing}': No such file or directory")


# ------------------------------------------------------------------ usage


@pytest.mark.parametrize(("args", "message"), [
    (["--log-json", "true", "status", "-c", CONFIG],
     "error: no such command 'true' (flags take no value: write --flag or --no-flag, not "
     "--flag true) (`cursorsync --help` shows the usage)"),
    (["run", "-c", CONFIG, "--colour"],
     "error: no such option: --colour (`cursorsync run --help` shows the usage)"),
    (["lookup", "-c", CONFIG, "orders"],
     "error: missing argument 'LEDGER:ENTRY' (`cursorsync lookup --help` shows the usage)"),
    (["status", "-c", CONFIG, "--ready", "--max-age", "0"],
     "error: invalid value for '--max-age': Input should be greater than or equal to 1 "
     "(`cursorsync status --help` shows the usage)"),
    (["run", "-c", CONFIG, "--once=yes"],
     "error: option '--once' does not take a value (`cursorsync --help` shows the usage)"),
])
def test_usage_errors_are_one_line(args: list[str], message: str) -> None:
    out = invoke(*args)
    assert out.exit_code == 2 and out.stdout == ""
    assert one_error_line(out) == message


def test_no_command_shows_the_help_and_one_error_line() -> None:
    out = invoke()
    assert out.exit_code == 2 and out.stdout == ""
    assert "Commands:" in out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("error:")] == [
        "error: no command given"]


def test_log_json_is_a_flag_pair(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--no-log-json overrides the config's logging.json: true, --log-json its false."""
    fake_module(monkeypatch, "cursorsync.app.job", "run_job",
                lambda *a, **k: __import__("logging").getLogger("cursorsync.t").warning("x"))
    path = write_config(tmp_path, logging={"json": True})
    plain = invoke("--no-log-json", "run", "-c", str(path), "--skip-check")
    assert plain.exit_code == 0, plain.output
    assert plain.stderr.splitlines()[-1].endswith("WARNING cursorsync.t: x")
    as_json = invoke("run", "-c", str(path), "--skip-check")
    assert json.loads(as_json.stderr.splitlines()[-1])["msg"] == "x"


# ------------------------------------------------------------------ help


def test_help_shows_no_bool_placeholder_and_says_the_exit_codes() -> None:
    top = invoke("--help")
    assert top.exit_code == 0
    assert "--log-json / --no-log-json" in top.stdout
    assert "0" in top.stdout and "130 interrupted" in " ".join(top.stdout.split())
    for command in ("", *COMMANDS):
        out = invoke(*command.split(), "--help")
        assert out.exit_code == 0, out.output
        assert "<bool>" not in out.stdout and "╭" not in out.stdout, out.stdout
    # Each command's short help fits the list of commands whole.
    listed = top.stdout.split("Commands:")[1]
    assert "..." not in listed.split("Examples:")[0], listed


def _examples(help_text: str) -> list[list[str]]:
    """The example command lines of a help text, as arguments after ``cursorsync``."""
    block = help_text.split("Examples:\n", 1)[1]
    out = []
    for line in block.splitlines():
        line = line.split(" # ")[0].split(" | ")[0].strip()
        if not line:
            continue
        words = shlex.split(line)
        while re.fullmatch(r"[A-Z_]+=.*", words[0]):
            words.pop(0)
        assert words[0] == "cursorsync", line
        out.append(words[1:])
    return out


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_help_has_examples_that_parse(command: str) -> None:
    """Each example's options exist and take what it gives them: the example with --help
    appended parses (an unknown option or a missing value would be a usage error)."""
    text = invoke(*command.split(), "--help").stdout
    examples = _examples(text)
    assert len(examples) >= 2, text
    for args in examples:
        assert not command or command in args, args
        out = invoke(*args, "--help")
        assert out.exit_code == 0, (args, out.output)


def test_the_commands_registered_are_the_ones_checked() -> None:
    assert set(typer.main.get_group(cli.app).commands) >= set(COMMANDS)
