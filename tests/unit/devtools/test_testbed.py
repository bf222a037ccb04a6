"""The test bed's set-up: clear errors for what is missing, and no JVM outliving its owner."""

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

from cursorsync_devtools.testbed.distribution import (
    Artifact,
    SetupError,
    maven_fetch,
    require_java,
    require_maven,
)


def test_a_missing_java_or_maven_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SetupError, match="openjdk-17-jdk-headless"):
        require_java()
    with pytest.raises(SetupError, match="apt-get install maven"):
        require_maven()


def test_an_old_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SetupError, match="is Java 11"):
        require_java()


def test_a_failed_download_names_the_artifact_and_maven_s_reason(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CURSORSYNC_CACHE_DIR", str(tmp_path))
    missing = Artifact("org.apache.pulsar", "pulsar-server-distribution", "0.0.0-no-such",
                       "tar.gz", "bin")
    with pytest.raises(SetupError) as err:
        maven_fetch([missing], label="Apache Pulsar 0.0.0-no-such")
    text = str(err.value)
    assert "could not fetch org.apache.pulsar:pulsar-server-distribution:0.0.0-no-such" in text
    assert "command: " in text and "maven-dependency-plugin" in text


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


def test_a_free_port_is_below_the_ephemeral_range_and_free() -> None:
    """A broker's port is never one an outgoing connection may take as its local port."""
    import socket

    from cursorsync_devtools.testbed.standalone import (
        LOOPBACK,
        LOWEST_PORT,
        _ephemeral_low,
        free_port,
    )

    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= p < _ephemeral_low() for p in ports), ports
    for p in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, p))
