"""The job on a real Spark cluster, as the Helm chart deploys it.

A Spark standalone master and two workers on loopback, started from the installed
pyspark's own scripts. The job is submitted with ``spark-submit``, with the Spark conf
the chart's SparkApplication sets, from the installed wheel (not the checkout: the driver
and the executors' Python workers run the wheel's virtualenv), with emission spread
across executors, against the real test bed. Meanwhile b's subscription stats show which
processes hold the emitting consumers (their names carry host and pid): executors' Python
workers under the Spark workers, not the driver. A real Prometheus scrapes the driver's
metrics. After failover to b: nothing lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.workload import (
    WorkloadSpec,
    consumer_type,
    create_target_subscriptions,
    create_topics,
    run_workload,
    sync_subscription,
)
from tests.support.paths import ROOT
from tests.support.spark_cluster import SparkCluster, ancestors, free_port, spark_home

# Three minutes on 2 cores: with CURSORSYNC_SLOW=1. The failovers with emission on
# executors run in every run (tests/e2e/test_e2e.py, a local Spark).
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    cluster = SparkCluster(tmp_path / "spark").start()
    try:
        yield cluster
    finally:
        cluster.stop()


def chart_spark_conf() -> dict[str, str]:
    """The sparkConf of the SparkApplication the chart renders with its default values."""
    from tests.support.helm_tools import render, spark_application

    conf = spark_application(render())["spec"].get("sparkConf", {})
    return {str(k): str(v) for k, v in conf.items()}


class ConsumerWatch:
    """Keeps every emitting consumer b saw on the sync subscriptions, with the pid in its
    name and that process's ancestors at the time: from b's subscription stats, and from
    b's broker log, which names each consumer as it goes (an emitter may connect, ack and
    close between two polls of the stats)."""

    def __init__(self, bed: TestBed, partitions: list[str], subscriptions: list[str]) -> None:
        self.bed, self.partitions, self.subscriptions = bed, partitions, subscriptions
        self.seen: dict[int, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._log = bed.clusters["b"].log_path
        self._log_offset = self._log.stat().st_size if self._log.exists() else 0
        self._in_log = re.compile(
            r"topic=(persistent://\S+?), name=(\S+?)\}.*?consumerName=cursorsync-emitter-"
            r"\S+?-(\d+),")

    def _saw(self, pid: int) -> None:
        if pid not in self.seen:
            self.seen[pid] = ancestors(pid)

    def _read_log(self) -> None:
        with self._log.open("rb") as f:
            f.seek(self._log_offset)
            text = f.read().decode(errors="replace")
        complete = text.rfind("\n") + 1
        self._log_offset += len(text[:complete].encode())
        for topic, sub, pid in self._in_log.findall(text[:complete]):
            if topic in self.partitions and sub in self.subscriptions:
                self._saw(int(pid))

    def __enter__(self) -> ConsumerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from cursorsync.pulsar.topics import TopicName

        while not self._stop.is_set():
            for p in self.partitions:
                try:
                    stats = self.bed.admin_call("b", "GET", TopicName.parse(p).admin_path(
                        "stats"), ok=(200,))
                except Exception:  # b busy for a moment: the next poll tells
                    continue
                for sub in self.subscriptions:
                    for c in stats.get("subscriptions", {}).get(sub, {}).get("consumers", []):
                        name = c.get("consumerName", "")
                        if name.startswith("cursorsync-emitter-"):
                            self._saw(int(name.rsplit("-", 1)[1]))
            self._read_log()
            self._stop.wait(0.1)


def test_the_job_on_a_spark_standalone_cluster_from_the_wheel(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path,
        spark_cluster: SparkCluster, wheel_venv: Path) -> None:
    import pulsar

    from cursorsync_devtools.demo import caught_up, demo_config
    from cursorsync_devtools.testbed.delta_jars import ensure_delta_jars
    from cursorsync_devtools.testbed.failover import failover

    spec = WorkloadSpec(partitioned_topic=topic_name("orders"), plain_topic=topic_name("audit"),
                        chunked_topic=None, entries_per_partition=90, produce_seconds=4.0,
                        builtin=False)
    create_topics(testbed, spec)
    create_target_subscriptions(testbed, spec)
    subs = [sync_subscription(k) for k in spec.subscription_types]
    for name in spec.topics():  # the consumers' subscriptions on a exist before the job
        for kind in spec.subscription_types:
            testbed.client("a").subscribe(
                testbed.topic(name), sync_subscription(kind), consumer_type=consumer_type(kind),
                initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1).close()
    metrics_port = free_port()
    cfg = demo_config(testbed, tmp_path, topics=list(spec.topics()), subscriptions=subs,
                      spread=True, backend="delta-spark")
    data = cfg.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spark"].pop("master", None)  # spark-submit's
    data["spark"]["conf"] = {}  # the chart's, on spark-submit's command line
    data["spark"]["trigger_interval_s"] = 1.0
    data["metrics"] = {"port": metrics_port, "host": "127.0.0.1"}
    config_path = tmp_path / "cursorsync.yaml"
    config_path.write_text(yaml.safe_dump(data, sort_keys=False))

    conf = chart_spark_conf()
    conf.update({
        "spark.jars": ",".join(str(p) for p in ensure_delta_jars()),  # the image bakes them in
        "spark.pyspark.python": str(wheel_venv / "python"),
        "spark.pyspark.driver.python": str(wheel_venv / "python"),
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "768m", "spark.executor.cores": "1",
        "spark.ui.enabled": "false",
    })
    main = next((wheel_venv.parent / "lib").glob("python3*/site-packages/cursorsync/__main__.py"))
    assert not str(main).startswith(str(ROOT))
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", spark_cluster.master_url,
           "--deploy-mode", "client"]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    cmd += [str(main), "run", "--config", str(config_path)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CURSORSYNC_CONFIG")}
    env["PYSPARK_PYTHON"] = str(wheel_venv / "python")
    log_path = tmp_path / "driver.log"
    with log_path.open("ab") as out:
        driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    prometheus = _prometheus(tmp_path / "prometheus", metrics_port)
    partitions = [p for n in spec.topics() for p in testbed.partitions(n)]
    try:
        _wait_for_sync_batch(driver, metrics_port, log_path)
        apps = spark_cluster.state()["activeapps"]
        assert [a["name"] for a in apps] == [cfg.spark.app_name]  # the config names it
        with ConsumerWatch(testbed, partitions, subs) as watch:
            result = run_workload(testbed, spec)
            _wait_caught_up(caught_up, cfg, result, driver, log_path, partitions, spec)
        scraped = _prometheus_query(prometheus[1], "sum(cursorsync_sync_outcomes_total"
                                    '{result="emitted"})')
    finally:
        if driver.poll() is None:
            # Ctrl-C to the job's Python process, as `cursorsync run` takes it; spark-submit's
            # JVM exits with it (a signal to the whole group would stop the JVM first).
            for pid in _children(driver.pid):
                with contextlib.suppress(ProcessLookupError):  # it ended since it was listed
                    os.kill(pid, signal.SIGINT)
            try:
                driver.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(driver.pid, signal.SIGKILL)
        prometheus[0].terminate()
        prometheus[0].wait(30)
    driver_log = log_path.read_text(errors="replace")
    assert driver.returncode == 0, driver_log[-3000:]

    # The acks came from executors' Python workers, under the Spark workers' processes.
    assert watch.seen, "no emitting consumer was seen on b"
    for pid, above in watch.seen.items():
        assert pid != driver.pid and driver.pid not in above, (pid, above)
        assert set(above) & set(spark_cluster.worker_pids), (pid, above)
    # A real Prometheus scraped the driver's metrics.
    assert scraped > 0, scraped

    for kind in spec.subscription_types:
        counts = failover(testbed, result, sync_subscription(kind), kind,
                          synced_at=result.last_ack_at)
        assert counts.losses == 0, counts
        assert counts.foreign_acked == 0 and counts.unexplained == 0, counts


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _wait_for_sync_batch(driver: subprocess.Popen[bytes], port: int, log: Path,
                         timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert driver.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            if 'cursorsync_batch_duration_seconds_count{query="sync"}' in text:
                return
        except httpx.HTTPError:
            pass  # not serving yet
        time.sleep(1.0)
    raise AssertionError(f"no sync batch in {timeout_s:.0f} s: "
                         f"{log.read_text(errors='replace')[-3000:]}")


def _wait_caught_up(caught_up: Any, cfg: Any, result: Any, driver: subprocess.Popen[bytes],
                    log: Path, partitions: list[str], spec: WorkloadSpec,
                    timeout_s: float = 240.0) -> None:
    """Until the job's own sync_progress shows it caught up with the last ack on a (read
    with delta-rs while the job writes with delta-spark)."""
    from cursorsync.tables import open_store

    store = open_store("delta-rs", cfg.tables.path)
    by_topic: dict[str, list[str]] = {}
    for p in partitions:
        by_topic.setdefault(p.split("-partition-")[0], []).append(p)
    deadline = time.monotonic() + timeout_s
    waits: Any = None
    while time.monotonic() < deadline:
        assert driver.poll() is None, log.read_text(errors="replace")[-3000:]
        waits = caught_up(store, cfg, after=result.last_ack_at, since_batch=0,
                          partitions=by_topic, chunked=set())
        if not isinstance(waits, str):
            return
        time.sleep(2.0)
    raise AssertionError(f"not caught up in {timeout_s:.0f} s: waits on {waits}")


def _prometheus(work: Path, target_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """Debian's real Prometheus, scraping the driver's metrics every second."""
    import shutil

    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: apt-get install prometheus (.ci/run does)"
    work.mkdir(parents=True)
    (work / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "cursorsync",
                            "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}]}))
    port = free_port()
    with (work / "prometheus.log").open("ab") as out:
        p = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                              f"--storage.tsdb.path={work / 'data'}",
                              f"--web.listen-address=127.0.0.1:{port}"],
                             stdout=out, stderr=subprocess.STDOUT)
    return p, port


def _prometheus_query(port: int, query: str, timeout_s: float = 30.0) -> float:
    """The query's value once Prometheus has one (it scrapes every second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": query},
                      timeout=5).json()
        found = r.get("data", {}).get("result", [])
        if (found and float(found[0]["value"][1]) > 0) or time.monotonic() > deadline:
            return float(found[0]["value"][1]) if found else 0.0
        time.sleep(1.0)
