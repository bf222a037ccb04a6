"""`cursorsync retire` and the tables' lease on the real test bed: while a job runs, a second
`cursorsync run` and `retire` are refused naming it; once it stopped, a dry run lists what
the job created and changes nothing, and retire removes it on both clusters and in storage,
leaving the synced subscription where it was."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest
import yaml

from cursorsync.app.settings import Config
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from tests.support.job_on_bed import (
    SUB,
    consumer_on_a,
    mark_delete,
    running,
    send_and_ack,
    shared_topic,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

#: What the job creates on each cluster, per partition (a: the source, b: the target).
OWN = {"a": {"cursorsync-mapping-source"},
       "b": {"cursorsync-mapping-target", "cursorsync-probe"}}


def subscriptions(bed: TestBed, cluster: str, partitions: list[str]) -> dict[str, set[str]]:
    """Each partition's subscriptions on ``cluster`` (replicator cursors left out)."""
    return {p: {c for c in bed.internal_stats(cluster, p)["cursors"]
                if not c.startswith("pulsar.repl.")} for p in partitions}


def cursorsync(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command line in a process of its own, as an operator runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("CURSORSYNC_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "cursorsync", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def config_file(config: Config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True)))
    return path


def test_retire_removes_what_the_job_created_and_nothing_else(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path) -> None:
    topic = shared_topic(testbed, topic_name("retire"), partitions=2)
    partitions = testbed.partitions(topic)
    config = demo_config(testbed, tmp_path / "work", topics=[topic], subscriptions=[SUB],
                         holes="probe")
    path = config_file(config, tmp_path / "config.yaml")
    consumer = consumer_on_a(testbed, topic)
    send_and_ack(testbed, topic, consumer, 20)
    consumer.close()

    def own_in_place() -> bool:
        return all(OWN[c] <= subs for c in "ab"
                   for subs in subscriptions(testbed, c, partitions).values())

    with running(config):
        wait_for("the job's own subscriptions on every partition of a and b", own_in_place,
                 timeout_s=240)
        second = cursorsync("run", "-c", str(path), "--skip-check")
        refused = cursorsync("retire", "-c", str(path))
        refused_dry = cursorsync("retire", "-c", str(path), "--dry-run")
    print(second.stderr, refused.stderr, refused_dry.stderr, sep="\n")

    # While the job ran: a second job and retire were refused, naming it, and exit 2.
    for result in (second, refused, refused_dry):
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2, result.stderr
        assert len(errors) == 1 and errors == result.stderr.splitlines()[-1:], result.stderr
        assert "are in use by cursorsync run on host " in errors[0], errors
        assert f", pid {os.getpid()} (started " in errors[0] and "expires at" in errors[0]
    assert refused.stdout == refused_dry.stdout == ""

    before = {c: subscriptions(testbed, c, partitions) for c in "ab"}
    synced = {c: {p: mark_delete(testbed, c, p, SUB) for p in partitions} for c in "ab"}
    work = tmp_path / "work"
    stored = sorted(p.name for p in (work / "tables").iterdir())
    assert {"mappings", "sync_progress", "lease"} <= set(stored), stored

    # A dry run lists each thing, with its cluster, and changes nothing.
    dry = cursorsync("retire", "-c", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    listed = dry.stdout.splitlines()
    wanted_subs = [f"would remove subscription {s} on {p} (cluster {c}, "
                   f"{'source' if c == 'a' else 'target'})"
                   for c in "ab" for p in partitions for s in sorted(OWN[c])]
    assert [line for line in listed if "subscription" in line] == wanted_subs, listed
    assert f"would remove checkpoint mapping at {work / 'checkpoints' / 'mapping'}" in listed
    assert f"would remove table mappings at {work / 'tables' / 'mappings'}" in listed
    assert listed[-1] == f"would remove table lease at {work / 'tables' / 'lease'}"
    assert {c: subscriptions(testbed, c, partitions) for c in "ab"} == before
    assert sorted(p.name for p in (work / "tables").iterdir()) == stored

    # Retire with --keep-tables removes the rest, says so line by line, and leaves SUB where
    # it was; a subscription with a consumer connected stays (never forced), named, and
    # retire exits 2.
    busy = testbed.client("b").subscribe(partitions[0], "cursorsync-mapping-target",
                                         consumer_type=pulsar.ConsumerType.Failover,
                                         receiver_queue_size=0)
    try:
        done = cursorsync("retire", "-c", str(path), "--keep-tables")
    finally:
        busy.close()
    print(done.stdout, done.stderr)
    assert done.returncode == 2, done.stderr
    tables = [line for line in listed if line.startswith("would remove table ")]
    assert done.stderr.splitlines()[-1] == (
        f"error: 1 of {len(listed) - len(tables)} not removed (listed above); run retire "
        "again once the cause is fixed")
    kept = (f"subscription cursorsync-mapping-target on {partitions[0]} (cluster b, target)")
    lines = done.stdout.splitlines()
    (refusal,) = [line for line in lines if line.startswith("not removed: ")]
    assert refusal.startswith(f"not removed: {kept}: ") and "consumer connected" in refusal
    assert [line.replace("removed ", "would remove ", 1) for line in lines
            if line != refusal] == [line for line in listed
                                    if not line.endswith(kept) and line not in tables]
    assert sorted(p.name for p in (work / "tables").iterdir()) == stored  # kept
    for c in "ab":
        assert subscriptions(testbed, c, partitions) == {
            p: subs - OWN[c] | ({"cursorsync-mapping-target"}
                                if (c, p) == ("b", partitions[0]) else set())
            for p, subs in before[c].items()}
        assert {p: mark_delete(testbed, c, p, SUB) for p in partitions} == synced[c]
    assert not list((work / "checkpoints").rglob("*.json")), list(work.rglob("*"))

    # Once its consumer is gone, retire again removes it, the tables, and the directories
    # left empty.
    again = cursorsync("retire", "-c", str(path))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"removed {kept}", *(line.replace("would remove", "removed", 1) for line in tables),
        f"removed directory {work / 'checkpoints'} (empty)",
        f"removed directory {work / 'tables'} (empty)"]
    assert subscriptions(testbed, "b", partitions) == {
        p: subs - OWN["b"] for p, subs in before["b"].items()}
    assert not any(work.iterdir()), list(work.rglob("*"))

    last = cursorsync("retire", "-c", str(path))
    assert last.returncode == 0, last.stderr
    assert last.stdout.splitlines() == [
        "nothing to remove: no subscription, table or checkpoint of this job is left"]
    assert not any(work.iterdir()), list(work.rglob("*"))
