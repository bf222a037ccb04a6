"""The built wheels run without the source checkout: package data ships, the CLIs work, and
the product's wheel holds the product alone (the development tools are a wheel of their own).

The wheels go into a new virtualenv that sees this interpreter's site-packages for the
dependencies (installing pyspark and the rest again would take minutes and prove
nothing about cursorsync); cursorsync and its development tools come from the wheels, and
every command runs from a directory outside the checkout.
"""

from __future__ import annotations

import json
import zipfile
from email.parser import Parser
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.processes import run_outside


def _wheel_files(wheel: Path) -> tuple[list[str], list[str]]:
    """A wheel's files: the packages', and its .dist-info's."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    info = [n for n in names if n.split("/")[0].endswith(".dist-info")]
    return [n for n in names if n not in info], info


def _metadata(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        info = next(n for n in z.namelist() if n.endswith(f".dist-info/{name}"))
        return z.read(info).decode()


def test_the_product_wheel_ships_the_product_alone(wheels: dict[str, Path]) -> None:
    files, _ = _wheel_files(wheels["cursorsync"])
    assert "cursorsync/app/cli.py" in files and "cursorsync/tables/schemas/mappings.json" in files
    devtools = [f for f in files if "cursorsync_devtools" in f or f.startswith("devtools/")]
    assert not devtools, f"the product's wheel ships the development tools: {devtools[:5]}"
    assert all(f.startswith("cursorsync/") for f in files), sorted(
        f for f in files if not f.startswith("cursorsync/"))
    entry_points = _metadata(wheels["cursorsync"], "entry_points.txt")
    assert "cursorsync = cursorsync.app.cli:main" in entry_points
    assert "cursorsync-dev" not in entry_points
    requires = Parser().parsestr(_metadata(wheels["cursorsync"], "METADATA")).get_all(
        "Requires-Dist") or []
    assert not [r for r in requires if "devtools" in r or "grpcio-tools" in r], requires


def test_the_devtools_wheel_ships_the_tools_and_requires_the_product(
        wheels: dict[str, Path]) -> None:
    files, _ = _wheel_files(wheels["cursorsync-devtools"])
    assert {"cursorsync_devtools/cli.py", "cursorsync_devtools/testbed/__init__.py"} <= set(files)
    assert all(f.startswith("cursorsync_devtools/") for f in files), sorted(
        f for f in files if not f.startswith("cursorsync_devtools/"))
    assert "cursorsync-dev = cursorsync_devtools.cli:main" in _metadata(
        wheels["cursorsync-devtools"], "entry_points.txt")
    meta = Parser().parsestr(_metadata(wheels["cursorsync-devtools"], "METADATA"))
    product = Parser().parsestr(_metadata(wheels["cursorsync"], "METADATA"))
    assert meta["Version"] == product["Version"]
    assert f"cursorsync=={product['Version']}" in (meta.get_all("Requires-Dist") or [])


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
        "mappings", "cursor_states", "sync_progress", "halts", "builtin_updates",
        "mapping_waits"}
    log4j = got["java"].split("-Dlog4j2.configurationFile=")[1].split()[0]
    assert log4j.startswith(venv_root) and Path(log4j).is_file()


def test_the_cli_runs_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    r = run_outside([str(wheel_venv / "cursorsync"), "--help"], cwd=tmp_path)
    assert r.returncode == 0 and "run" in r.stdout and "status" in r.stdout, r.stderr
    # The demo and the benchmarks are the development tools' command line, not the product's.
    assert "demo" not in r.stdout and "bench" not in r.stdout, r.stdout
    r = run_outside([str(wheel_venv / "cursorsync-dev"), "--help"], cwd=tmp_path)
    assert r.returncode == 0 and "demo" in r.stdout and "bench" in r.stdout, r.stderr
    config = run_outside([str(wheel_venv / "python"), "-c",
                   "from cursorsync.app.settings import EMBEDDED_CONFIG_PATH as p; print(p)"],
                  cwd=tmp_path).stdout.strip()
    # The tables commands read Delta tables with no Spark and no broker: an empty status.
    r = run_outside([str(wheel_venv / "cursorsync"), "status", "-c", config, "--json"],
                    cwd=tmp_path)
    assert r.returncode in (0, 2), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
