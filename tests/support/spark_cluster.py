"""A Spark standalone cluster on loopback: a master and workers started with the installed
pyspark's own ``bin/spark-class``, each in a process of its own, stopped at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pyspark


def spark_home() -> Path:
    """The installed pyspark is a Spark distribution: bin/, jars/, sbin/."""
    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SparkCluster:
    """``workers`` workers of ``cores`` cores and ``memory`` each, under ``work_dir``."""

    work_dir: Path
    workers: int = 2
    cores: int = 2
    memory: str = "2g"
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_LOG_DIR": str(self.work_dir / "logs"),
               "SPARK_WORKER_DIR": str(self.work_dir / name)}
        env.pop("PYTHONPATH", None)
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        with (self.work_dir / "logs" / f"{name}.log").open("ab") as out:
            p = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(p)
        return p

    def start(self, timeout_s: float = 90.0) -> SparkCluster:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for i in range(self.workers):
            self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
                        "--host", "127.0.0.1", "--cores", str(self.cores),
                        "--memory", self.memory, "--webui-port", str(free_port()),
                        "--work-dir", str(self.work_dir / f"worker-{i}"), self.master_url)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                alive = [w for w in self.state().get("workers", []) if w["state"] == "ALIVE"]
                if len(alive) == self.workers:
                    return self
            except (httpx.HTTPError, ValueError):
                pass  # the master is not serving yet (or not its JSON yet)
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                raise RuntimeError(f"the Spark cluster did not come up in {timeout_s:.0f} s; "
                                   f"see {self.work_dir / 'logs'}")
            time.sleep(1.0)

    def state(self) -> dict[str, Any]:
        """The master's view (its web UI's JSON): workers, applications."""
        r = httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5.0)
        r.raise_for_status()  # a 404 while the master's web UI is still starting
        found: dict[str, Any] = r.json()
        return found

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.processes[1:]]

    def stop(self) -> None:
        for p in reversed(self.processes):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def ancestors(pid: int) -> list[int]:
    """The pids above ``pid`` up to init, from /proc (empty once it has exited)."""
    out = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
        out.append(pid)
    return out
