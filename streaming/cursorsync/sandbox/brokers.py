"""Embedded pulsar-lite brokers, one per emulated cluster.

pulsar-lite speaks the Pulsar binary protocol, so the official client path
is real. We run its binary ourselves (not ``pulsar_lite.start_broker``, which
scans a fixed port range, shares one process per db path and logs to a fixed
file) so that two brokers run side by side on free loopback ports, each with
its own data directory, config file and log.

Each broker is started with ``default_partitions = 0`` (otherwise every
auto-created topic, including ``<t>-partition-<i>``, becomes partitioned
again) and ``[metrics] enabled = false`` (the metrics listener defaults to
port 8080, which two brokers cannot share). Behaviours of pulsar-lite the
sandbox relies on are pinned in ``tests/test_sandbox_brokers.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cursorsync.errors import CursorSyncError

LOOPBACK = "127.0.0.1"


class BrokerStartError(CursorSyncError):
    """An embedded broker did not start; the message names its log file."""


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def pulsar_lite_binary() -> str:
    """Path of the pulsar-lite executable shipped with the PyPI package."""
    from pulsar_lite.binary_finder import find_pulsar_lite_binary

    return str(find_pulsar_lite_binary())


def _config_text(cluster: str, default_partitions: int) -> str:
    return (
        f'cluster = "{cluster}"\n'
        f"default_partitions = {default_partitions}\n"
        "\n[metrics]\nenabled = false\n"
    )


@dataclass(frozen=True)
class BrokerSpec:
    """What to start: the cluster name and where its files live."""

    cluster: str
    work_dir: Path
    log_level: str = "warn"
    ready_timeout_s: float = 20.0


class Broker:
    """One running pulsar-lite process (a context manager; ``stop()`` is idempotent)."""

    def __init__(self, spec: BrokerSpec) -> None:
        self.spec = spec
        self.cluster = spec.cluster
        self.dir = Path(spec.work_dir) / f"cluster-{spec.cluster}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "pulsar-lite.toml"
        self.log_path = self.dir / "broker.log"
        self.data_path = self.dir / "data"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def service_url(self) -> str:
        return f"pulsar://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> Broker:
        """Start on a free port and wait until it accepts connections (retries port races)."""
        if self._proc is not None:
            raise BrokerStartError(f"broker {self.cluster} is already running on {self.port}")
        self.config_path.write_text(_config_text(self.cluster, 0))
        last_error = ""
        for _attempt in range(3):
            self.port = free_port()
            try:
                self._spawn_and_wait()
                return self
            except BrokerStartError as exc:
                last_error = str(exc)
        raise BrokerStartError(last_error)

    def _spawn_and_wait(self) -> None:
        cmd = [
            pulsar_lite_binary(),
            "--config",
            str(self.config_path),
            "--addr",
            f"{LOOPBACK}:{self.port}",
            "--db-path",
            str(self.data_path),
            "--log-level",
            self.spec.log_level,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.dir),
                env={**os.environ, "RUST_BACKTRACE": "1"},
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerStartError(
                    f"pulsar-lite for cluster {self.cluster} exited with {proc.returncode} "
                    f"before listening on {self.port}; see {self.log_path}"
                )
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=0.25):
                    self._proc = proc
                    return
            except OSError:
                time.sleep(0.05)
        _terminate(proc)
        raise BrokerStartError(
            f"pulsar-lite for cluster {self.cluster} did not listen on {self.port} within "
            f"{self.spec.ready_timeout_s}s; see {self.log_path}"
        )

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 5 s)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _terminate(proc)

    def __enter__(self) -> Broker:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def start_broker(cluster: str, work_dir: Path | str, *, log_level: str = "warn") -> Broker:
    """Start one broker for ``cluster`` with its files under ``work_dir/cluster-<name>``."""
    return Broker(BrokerSpec(cluster, Path(work_dir), log_level)).start()


class Brokers:
    """The brokers of several clusters, started together and stopped together."""

    def __init__(
        self,
        work_dir: Path | str,
        clusters: tuple[str, ...] = ("A", "B"),
        *,
        log_level: str = "warn",
    ) -> None:
        self.work_dir = Path(work_dir)
        self.clusters = clusters
        self.log_level = log_level
        self.by_cluster: dict[str, Broker] = {}

    def start(self) -> Brokers:
        try:
            for name in self.clusters:
                self.by_cluster[name] = start_broker(name, self.work_dir, log_level=self.log_level)
        except BaseException:
            self.stop()
            raise
        return self

    def __getitem__(self, cluster: str) -> Broker:
        try:
            return self.by_cluster[cluster]
        except KeyError:
            raise KeyError(
                f"no broker for cluster {cluster!r}; clusters: {sorted(self.by_cluster)}"
            ) from None

    def stop(self) -> None:
        for broker in reversed(list(self.by_cluster.values())):
            broker.stop()

    def __enter__(self) -> Brokers:
        if not self.by_cluster:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
