"""The test bed started for real: no JVM outliving its owner, a used work dir starting a
bed that replicates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

_OWNER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from cursorsync_devtools.testbed.standalone import Standalone, StandaloneSpec
    s = Standalone(StandaloneSpec("solo", Path(sys.argv[1])))
    s.launch()
    s.wait_ready()
    print(json.dumps({"pid": s.pid}), flush=True)
    time.sleep(600)
""")


@pytest.mark.integration
@pytest.mark.slow  # the test bed's own housekeeping: CURSORSYNC_SLOW=1 runs it
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_standalone_never_outlives_the_process_that_started_it(
        tmp_path: Path, how: signal.Signals) -> None:
    """Killed outright (SIGKILL: the kernel ends the JVM), or interrupted (Ctrl-C: the
    interpreter stops it on its way out)."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, "the owner did not start its standalone"
    pid = json.loads(line)["pid"]
    assert _alive(pid)
    owner.send_signal(how)
    owner.wait(60)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid), f"the standalone's JVM {pid} outlived its owner ({how.name})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] != "Z"


@pytest.mark.integration
@pytest.mark.slow  # a bed of its own: the test bed tool, not the product
def test_a_work_dir_used_before_starts_a_bed_that_replicates(tmp_path: Path) -> None:
    """A bed stopped and started again on the same directory gets new ports; what the
    first start stored (b's registration on a, the bookies) must not outlive it."""
    from cursorsync_devtools.testbed import TestBed, TestBedConfig

    config = TestBedConfig(work_dir=tmp_path, target_ledger_offset=0)
    with TestBed(config):
        pass
    with TestBed(config) as bed:
        bed.create_topic("again")
        producer = bed.client("a").create_producer(bed.topic("again"))
        producer.send(b"x")
        assert bed.wait_replicated(["again"], timeout_s=60) >= 0
