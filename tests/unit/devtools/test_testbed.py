"""The test bed's set-up: clear errors for what is missing (no JVM outliving its owner, on
a real bed: tests/integration/bed/test_testbed.py)."""

from __future__ import annotations

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


def test_a_wide_benchmark_keeps_its_harness_within_a_process_s_descriptors() -> None:
    from cursorsync_devtools.bench_partitions import clients_shared

    # The figures up to 1,000 partitions keep a client per partition; wider, the harness
    # stays at 1,000 clients (5,000 clients passed the machine's 20,000 descriptors).
    assert [clients_shared(n) for n in (1, 300, 1000, 1001, 3000, 5000)] == [1, 1, 1, 2, 3, 5]
    assert max(-(-n // clients_shared(n)) for n in (1000, 3000, 5000, 7777)) == 1000


def test_a_wide_benchmark_gives_its_brokers_memory_and_its_clients_time(
        tmp_path: Path) -> None:
    from cursorsync_devtools.bench_partitions import bed_size
    from cursorsync_devtools.testbed import TestBed, TestBedConfig
    from cursorsync_devtools.testbed.standalone import DEFAULT_MEMORY

    assert bed_size(1000) == {}
    wide = bed_size(3000)
    assert wide == {"memory": "-Xms768m -Xmx1920m -XX:MaxDirectMemorySize=1152m",
                    "operation_timeout_s": 180}
    beds = {m: TestBed(TestBedConfig(work_dir=tmp_path / str(m), **bed_size(m)))
            for m in (1000, 3000)}
    assert {c.spec.memory for c in beds[1000].clusters.values()} == {DEFAULT_MEMORY}
    assert {c.spec.memory for c in beds[3000].clusters.values()} == {wide["memory"]}
    assert beds[3000].config.operation_timeout_s == 180
    assert bed_size(1000, 2) == {"memory": "-Xms512m -Xmx1280m -XX:MaxDirectMemorySize=768m"}
    assert bed_size(3000, 1)["memory"] == "-Xms256m -Xmx640m -XX:MaxDirectMemorySize=384m"
