"""With JSON logs, a local Spark session's JVM writes JSON lines too: log4j through our
JSON layout, the launcher's warnings and the Python workers' output relayed as records.
Each case is a fresh process: the JVM and its log set-up start once per process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cursorsync.app.logs import JVM_LOGGER
from cursorsync.app.settings import EMBEDDED_CONFIG_PATH
from tests.support.json_lines import json_lines
from tests.support.spark_cluster import free_port

pytestmark = pytest.mark.spark


SESSION_THAT_LOGS = """
import sys
from cursorsync.app.logs import configure_logging
from cursorsync.app.session import build_session
from cursorsync.app.settings import load_config

configure_logging("info", json=True)
spark = build_session(load_config({config!r}))
spark.sparkContext.setLogLevel("INFO")
def shout(x):
    print("a line from a python worker", file=sys.stderr, flush=True)
    if x == 1:
        raise ValueError("a worker fails")
    return x
assert spark.sparkContext.parallelize([0], 1).map(shout).collect() == [0]
try:
    spark.sparkContext.parallelize([1], 1).map(shout).collect()
except Exception:
    print("the job failed as it should")
spark.stop()
"""


def test_a_local_session_with_json_logs_writes_json_lines_only(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c",
                          SESSION_THAT_LOGS.format(config=str(EMBEDDED_CONFIG_PATH))],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "the job failed as it should"
    records = json_lines(out.stderr)
    spark = [r for r in records if r["logger"].startswith("org.apache.spark.")]
    # log4j at INFO once the level is lowered: many lines, each in our fields
    assert len(spark) > 10
    assert {"ts", "level", "logger", "msg", "thread"} <= set(spark[0])
    assert {r["level"] for r in spark} >= {"info"}
    failed = [r for r in spark if r["level"] == "error" and "exc" in r]
    assert failed and any("a worker fails" in r["exc"] for r in failed)
    worker = [r for r in records
              if r["logger"] == JVM_LOGGER and r["msg"] == "a line from a python worker"]
    assert worker, "the worker's own output is relayed as a record"


def test_a_run_that_fails_after_spark_started_is_json_on_every_line(tmp_path: Path) -> None:
    """``cursorsync run`` with logging.json in its config: the job's lines, the JVM's, and
    the final error (its mappings table's folder is a regular file; the tables' lease,
    beside it, is taken before Spark starts)."""
    data = yaml.safe_load(EMBEDDED_CONFIG_PATH.read_text())
    for role in ("source", "target"):
        data["clusters"][role].update(service_url=f"pulsar://127.0.0.1:{free_port()}",
                                      admin_url=f"http://127.0.0.1:{free_port()}")
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "mappings").write_text("")
    data["tables"]["path"] = str(tmp_path / "tables")
    data["spark"]["checkpoint_dir"] = str(tmp_path / "checkpoints")
    data["logging"]["json"] = True
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "cursorsync", "run", "--once", "--skip-check",
                          "-c", str(config)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, check=False)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stdout == ""
    records = json_lines(out.stderr)
    assert records[0]["msg"] == "starting cursorsync job"
    assert records[-1]["level"] == "error" and records[-1]["logger"] == "cursorsync.cli"
    assert records[-1]["msg"].startswith("error: cannot create or open table mappings")
