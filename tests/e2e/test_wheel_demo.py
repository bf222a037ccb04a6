"""The demo, the whole job on the test bed, run from the built wheels without the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.processes import run_outside


@pytest.mark.integration
@pytest.mark.spark
def test_the_demo_runs_from_the_wheel(wheel_venv: Path, tmp_path: Path) -> None:
    """`cursorsync-dev demo` from the installed wheels, outside the checkout: the local test
    bed, the workload, the sync, the failover count. Nothing lost."""
    r = run_outside([str(wheel_venv / "cursorsync-dev"), "demo", "--json", "--seconds", "3",
              "--work-dir", str(tmp_path / "demo")], cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    ours = report["cursorsync"]
    assert ours and all(v["losses"] == 0 and v["foreign_acked"] == 0 for v in ours.values()), ours
