"""One Apache Pulsar standalone process: broker, bookie and RocksDB metadata in one JVM.

Started from the cached distribution (:mod:`cursorsync_devtools.testbed.distribution`)
with a ``standalone.conf`` of its own, on free loopback ports, its data and logs
under its work directory, the functions worker and stream storage off.

No JVM outlives us: the process runs in a session of its own (a Ctrl-C in the
terminal reaches us, not the broker, and we stop it cleanly), it gets SIGKILL
from the kernel when the thread that started it dies (``PR_SET_PDEATHSIG``: a
test run killed outright), and ``atexit`` stops whatever is still running.
Start standalones from a thread that lives as long as they should.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cursorsync.errors import CursorSyncError
from cursorsync_devtools.testbed.distribution import ensure_pulsar, require_java

LOOPBACK = "127.0.0.1"
#: Heap and direct memory of one standalone: two of them beside Spark on a few GiB.
DEFAULT_MEMORY = "-Xms128m -Xmx640m -XX:MaxDirectMemorySize=384m"
#: G1 without pre-touching the heap (the distribution's default ZGC with AlwaysPreTouch
#: takes the whole heap up front).
DEFAULT_GC = "-XX:+UseG1GC -XX:+PerfDisableSharedMem"


class StandaloneError(CursorSyncError):
    """A standalone did not start or stop as asked; the message names its log."""


#: Ports handed out are drawn from here up to the kernel's ephemeral range.
LOWEST_PORT = 10_000


def free_port() -> int:
    """A TCP port on the loopback that nothing uses right now, below the kernel's ephemeral
    range: a port from that range can be taken, before a broker binds it (or binds it again
    after a restart), as the local port of any outgoing connection, and test beds make many."""
    top = _ephemeral_low()
    for _ in range(100):
        port = random.randrange(LOWEST_PORT, top) if top > LOWEST_PORT + 100 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise StandaloneError(f"no free port between {LOWEST_PORT} and {top} on {LOOPBACK}")


def _ephemeral_low() -> int:
    """The low end of the kernel's ephemeral port range (Linux's default when unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class StandaloneSpec:
    """What to start. ``settings`` override keys of the distribution's standalone.conf."""

    cluster: str
    work_dir: Path
    settings: Mapping[str, str] = field(default_factory=dict)
    memory: str = DEFAULT_MEMORY
    gc: str = DEFAULT_GC
    ready_timeout_s: float = 120.0
    pulsar_version: str | None = None


#: Settings every test-bed standalone gets (then the spec's own on top).
BASE_SETTINGS: dict[str, str] = {
    "bindAddress": LOOPBACK,
    "advertisedAddress": LOOPBACK,
    # Topics of a finished test stay (the tests read them after their consumers left).
    "brokerDeleteInactiveTopicsEnabled": "false",
    "webSocketServiceEnabled": "false",
    # Ledgers roll by entry count alone, so a test sees rollovers.
    "managedLedgerMinLedgerRolloverTimeMinutes": "0",
    # Replicated subscriptions as Pulsar ships them.
    "enableReplicatedSubscriptions": "true",
    "replicatedSubscriptionsSnapshotFrequencyMillis": "1000",
    # Small caches and pools: two standalones and Spark share a couple of cores.
    "managedLedgerCacheSizeMB": "64",
    "dbStorage_writeCacheMaxSizeMb": "32",
    "dbStorage_readAheadCacheMaxSizeMb": "32",
    "dbStorage_rocksDB_blockCacheSize": str(16 << 20),
    "numIOThreads": "2",
    "numHttpServerThreads": "4",
    "numOrderedExecutorThreads": "2",
    "bookkeeperNumberOfChannelsPerBookie": "4",
}

_RUNNING: weakref.WeakSet[Standalone] = weakref.WeakSet()
_KEY = re.compile(r"^([A-Za-z0-9_.]+)=")


def write_conf(template: Path, target: Path, settings: Mapping[str, str]) -> None:
    """``template`` with each key of ``settings`` set (in place, or appended when absent)."""
    left = dict(settings)
    lines = []
    for line in template.read_text().splitlines():
        m = _KEY.match(line)
        if m and m.group(1) in left:
            line = f"{m.group(1)}={left.pop(m.group(1))}"
        lines.append(line)
    lines += [f"{k}={v}" for k, v in left.items()]
    target.write_text("\n".join(lines) + "\n")


class Standalone:
    """One running standalone (a context manager; ``stop()`` may be called twice)."""

    def __init__(self, spec: StandaloneSpec) -> None:
        self.spec = spec
        self.cluster = spec.cluster
        self.dir = Path(spec.work_dir) / spec.cluster
        self.broker_port = 0
        self.web_port = 0
        self.bookie_port = 0
        self.log_path = self.dir / "logs" / "standalone.out"
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0

    def __getstate__(self) -> dict[str, Any]:
        """A copy in another process reaches this standalone on its ports; only the process
        that launched it holds its JVM (the copy's ``pid`` is None)."""
        return {**self.__dict__, "_proc": None}

    @property
    def service_url(self) -> str:
        return f"pulsar://{LOOPBACK}:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.web_port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def launch(self, *, keep_state: bool = False) -> None:
        """Start the JVM and return at once; :meth:`wait_ready` waits for it to answer.

        ``keep_state``: start again on the stored state of the last start, on its ports
        (the state names them: its bookie, the other cluster's registration). Otherwise
        each start begins with no state, on free ports.
        """
        if self._proc is not None:
            raise StandaloneError(f"cluster {self.cluster}: already started")
        home = ensure_pulsar(*([self.spec.pulsar_version] if self.spec.pulsar_version else []))
        java = require_java()
        if not keep_state or not self.broker_port:
            for state in ("metadata", "bookkeeper", "data"):
                shutil.rmtree(self.dir / state, ignore_errors=True)
            self.broker_port, self.web_port = free_port(), free_port()
            self.bookie_port = free_port()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        conf = self.dir / "standalone.conf"
        write_conf(home / "conf" / "standalone.conf", conf, {
            **BASE_SETTINGS, "clusterName": self.cluster,
            "brokerServicePort": str(self.broker_port), "webServicePort": str(self.web_port),
            **self.spec.settings})
        env = {**os.environ,
               "JAVA_HOME": str(Path(java).resolve().parents[1]),
               "PULSAR_STANDALONE_CONF": str(conf),
               "PULSAR_LOG_DIR": str(self.dir / "logs"),
               "PULSAR_MEM": self.spec.memory,
               "PULSAR_GC": self.spec.gc,
               "PULSAR_GC_LOG": " ",
               "PULSAR_LOG_LEVEL": "info"}
        cmd = [str(home / "bin" / "pulsar"), "standalone", "--no-functions-worker",
               "--no-stream-storage", "--advertised-address", LOOPBACK,
               "--metadata-dir", str(self.dir / "metadata"),
               "--bookkeeper-dir", str(self.dir / "bookkeeper"),
               "--bookkeeper-port", str(self.bookie_port)]
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, env=env, cwd=self.dir,
                                          preexec_fn=_die_with_parent)
        self._started_at = time.monotonic()
        _RUNNING.add(self)

    def ready(self) -> bool:
        """Answers its admin API with the ``public/default`` namespace (made last at start)."""
        if not self.running():
            raise StandaloneError(
                f"cluster {self.cluster}: the standalone exited with code "
                f"{None if self._proc is None else self._proc.returncode} before it was ready; "
                f"its log ({self.log_path}) ends:\n{self.log_tail()}")
        try:
            r = httpx.get(f"{self.admin_url}/admin/v2/namespaces/public", timeout=2.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and "public/default" in r.text

    def wait_ready(self) -> float:
        """Seconds from launch until it answered; StandaloneError (naming the log) if it
        exits or does not answer within the spec's timeout."""
        deadline = self._started_at + self.spec.ready_timeout_s
        while not self.ready():
            if time.monotonic() > deadline:
                self.stop()
                raise StandaloneError(
                    f"cluster {self.cluster}: no answer on {self.admin_url} within "
                    f"{self.spec.ready_timeout_s:.0f} s; its log ({self.log_path}) ends:\n"
                    f"{self.log_tail()}")
            time.sleep(0.25)
        return time.monotonic() - self._started_at

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``timeout_s``."""
        proc, self._proc = self._proc, None
        _RUNNING.discard(self)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def kill(self) -> None:
        """SIGKILL, as a crashed broker: nothing flushed, nothing closed cleanly."""
        proc, self._proc = self._proc, None
        _RUNNING.discard(self)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> Standalone:
        if self._proc is None:
            self.launch()
            self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    """No standalone outlives the interpreter (a failed run, an exception not caught)."""
    threads = [threading.Thread(target=s.stop, args=(5.0,)) for s in list(_RUNNING)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
