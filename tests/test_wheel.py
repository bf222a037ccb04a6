"""The built wheel runs without the source checkout: package data ships, the CLI works.

The wheel goes into a new virtualenv that sees this interpreter's site-packages for the
dependencies (installing pyspark and the rest again would take minutes and prove
nothing about cursorsync); cursorsync itself comes from the wheel, and every command
runs from a directory outside the checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, run_outside


def test_the_package_and_its_data_come_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    probe = (
        "import json, cursorsync, cursorsync_devtools\n"
        "from cursorsync.app.settings import EMBEDDED_CONFIG_PATH, load_config\n"
        "from cursorsync.app.session import driver_java_options\n"
        "from cursorsync.tables import TABLES\n"
        "from cursorsync.tables.schema import load_schema\n"
        "cfg = load_config(EMBEDDED_CONFIG_PATH)\n"
        "print(json.dumps({'package': cursorsync.__file__,\n"
        "                  'devtools': cursorsync_devtools.__file__,\n"
        "                  'config': str(EMBEDDED_CONFIG_PATH), 'source': cfg.source.name,\n"
        "                  'tables': {t: load_schema(t).version for t in TABLES},\n"
        "                  'java': driver_java_options(cfg)}))\n"
    )
    r = run_outside([str(wheel_venv / "python"), "-c", probe], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    venv_root = str(wheel_venv.parent)
    for key in ("package", "devtools", "config"):
        assert got[key].startswith(venv_root), (key, got[key])
    assert not got["config"].startswith(str(ROOT))
    assert got["source"] == "a" and set(got["tables"]) == {
        "mappings", "cursor_states", "sync_progress", "halts", "builtin_updates"}
    log4j = got["java"].split("-Dlog4j2.configurationFile=")[1].split()[0]
    assert log4j.startswith(venv_root) and Path(log4j).is_file()


def test_the_cli_runs_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    r = run_outside([str(wheel_venv / "cursorsync"), "--help"], cwd=tmp_path)
    assert r.returncode == 0 and "demo" in r.stdout and "run" in r.stdout, r.stderr
    config = run_outside([str(wheel_venv / "python"), "-c",
                   "from cursorsync.app.settings import EMBEDDED_CONFIG_PATH as p; print(p)"],
                  cwd=tmp_path).stdout.strip()
    # The tables commands read Delta tables with no Spark and no broker: an empty status.
    r = run_outside([str(wheel_venv / "cursorsync"), "status", "-c", config, "--json"],
                    cwd=tmp_path)
    assert r.returncode in (0, 2), r.stderr
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.integration
@pytest.mark.spark
def test_the_demo_runs_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    """`cursorsync demo` from the installed wheel, outside the checkout: the local test bed,
    the workload, the sync, the failover count. Nothing lost."""
    r = run_outside([str(wheel_venv / "cursorsync"), "demo", "--json", "--seconds", "3",
              "--work-dir", str(tmp_path / "demo")], cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    ours = report["cursorsync"]
    assert ours and all(v["losses"] == 0 and v["foreign_acked"] == 0 for v in ours.values()), ours
