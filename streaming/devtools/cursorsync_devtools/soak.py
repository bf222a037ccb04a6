"""The soak: ``cursorsync run`` for half an hour under live traffic, one broker crash.

1. A test bed of its own (two Apache Pulsar clusters, geo-replicated), a partitioned
   topic, the target subscription on b at the earliest position.
2. The job as an operator runs it: ``python -m cursorsync run -c FILE`` in a process of
   its own, with its metrics endpoint on.
3. Live traffic on a for ``minutes``: batched and unbatched entries at a paced rate; a
   Shared consumer acks most entries at once, some late (delayed by up to a minute, so
   out of order) and a few never (holes for good).
4. Halfway, one broker is stopped and restarted on its stored state (b by default:
   the cluster the job reads entries from and acks on), or SIGKILLed with ``crash``.
5. Meanwhile, every ``sample_interval_s``: the job's memory (resident set of its process
   tree: the driver, Spark's JVM, the Python workers) and its own metrics; b's cursor is
   polled for the lag of every acked entry (:mod:`cursorsync_devtools.testbed.lag`).
6. After the last ack, until b covers everything a acked; the job is stopped (SIGTERM,
   as systemd or Kubernetes stop it) and b's subscription is drained: duplicates and
   losses are counted (:mod:`cursorsync_devtools.testbed.failover`).

The report splits the run into windows by ack time. The first window is the baseline
the later ones are read against: lag and memory are flat when the last window looks
like the second (the first includes Spark's warm-up).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.soak_table import table
from cursorsync_devtools.testbed.cpu import read_stat

log = logging.getLogger(__name__)

SUBSCRIPTION = "soak-sync"


class SoakError(CursorSyncError):
    """The soak could not run to its end; the message names the step and why."""


@dataclass(frozen=True)
class SoakSpec:
    """What the soak runs. The defaults are ``cursorsync-dev bench soak``."""

    minutes: float = 30.0
    topic: str = "soak"
    partitions: int = 2
    rate_per_s: float = 100.0
    batched_fraction: float = 0.2
    batch_size: int = 5
    late_fraction: float = 0.1
    late_delay_s: tuple[float, float] = (1.0, 60.0)
    never_fraction: float = 0.01
    #: The cluster whose broker is restarted halfway; None: no restart.
    restart: str | None = "b"
    #: SIGKILL instead of a clean stop (see TestBed.crash_and_restart: after a crash the
    #: standalone's bookie registration flaps, and writes fail now and then).
    crash: bool = False
    windows: int = 6
    sample_interval_s: float = 10.0
    poll_interval_s: float = 0.25
    trigger_interval_s: float = 1.0
    #: How long after the last ack b may take to cover everything a acked.
    settle_timeout_s: float = 300.0
    seed: int = 31

    def __post_init__(self) -> None:
        if self.minutes <= 0 or self.windows < 2 or self.restart not in (None, "a", "b"):
            raise SoakError("minutes > 0, windows >= 2 and restart in (a, b, none) needed")

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0


# ------------------------------------------------------------------ measurements


def tree_rss(root: int) -> dict[str, float]:
    """Resident memory (MiB) of a process and its descendants, from /proc: the process
    itself (``driver``), Java processes (``jvm``) and the rest (``workers``)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").glob("[0-9]*"):
        stat = read_stat(d / "stat")
        if stat is not None:
            parents[int(d.name)] = int(stat[1][1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(kids)
        frontier += kids
    out = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    for pid in tree:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        kib = next((int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("VmRSS:")), 0)
        group = "driver" if pid == root else "jvm" if comm == "java" else "workers"
        out[group] += kib / 1024
    out["total"] = sum(out.values())
    return out


def scrape(url: str) -> dict[str, float]:
    """The job's metrics as ``name{label="v",...}`` -> value."""
    text = httpx.get(url, timeout=5.0).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def metric_sum(scraped: Mapping[str, float], name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in scraped.items()
               if k.partition("{")[0] == name and all(w in k for w in want))


@dataclass(frozen=True)
class Sample:
    at: float
    rss_mib: dict[str, float]
    #: Per query, the job's cumulative (batches, seconds in batches); empty on a miss.
    batches: dict[str, tuple[float, float]]


# ------------------------------------------------------------------ the job process


@dataclass
class JobProcess:
    """``cursorsync run`` in a process of its own, as an operator starts it."""

    config_path: Path
    log_path: Path
    metrics_url: str
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> JobProcess:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cursorsync", "run", "--config", str(self.config_path)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_syncing(self, timeout_s: float) -> dict[str, float]:
        """Wait until the job has completed a sync batch; its metrics then."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise SoakError(f"the job exited with {self.process and self.process.returncode}"
                                f" before its first sync batch; its log ends:\n{self.tail()}")
            try:
                m = scrape(self.metrics_url)
                if metric_sum(m, "cursorsync_batch_duration_seconds_count", query="sync") >= 1:
                    return m
            except httpx.HTTPError:
                pass  # not serving yet
            time.sleep(1.0)
        raise SoakError(f"the job completed no sync batch within {timeout_s:.0f} s; its log "
                        f"ends:\n{self.tail()}")

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, as systemd or Kubernetes stops it; SIGKILL if it does not end in time."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(bed: Any, root: Path, spec: SoakSpec, metrics_port: int) -> Path:
    """The embedded config with the test bed's URLs, the soak topic, the metrics on."""
    from cursorsync.app.settings import load_config
    from cursorsync_devtools.demo import demo_config

    cfg = demo_config(bed, root, topics=[spec.topic], subscriptions=[SUBSCRIPTION])
    data = cfg.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spark"]["trigger_interval_s"] = spec.trigger_interval_s
    data["metrics"] = {"port": metrics_port, "host": "127.0.0.1"}
    path = root / "cursorsync.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    load_config(path)  # what the job will read must load
    return path


# ------------------------------------------------------------------------ the run


def soak(spec: SoakSpec | None = None, *, bed: Any = None, work_dir: str | None = None,
         progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the soak (see the module doc) and return its report."""
    from cursorsync_devtools.testbed import PULSAR_VERSION, TestBed, TestBedConfig

    spec = spec or SoakSpec()
    say = progress or (lambda msg: log.info("soak: %s", msg))
    root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cursorsync-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    own = bed is None
    try:
        if own:
            say("starting the test bed")
            bed = TestBed(TestBedConfig(work_dir=root / "pulsar")).start()
        try:
            report = _run(bed, root, spec, say)
        finally:
            if own:
                bed.stop()
    except SoakError as err:  # the job's log and the brokers' stay for a look
        raise SoakError(f"{err}\n(the job's log and the brokers' are kept in {root})") from err
    if not work_dir:
        shutil.rmtree(root, ignore_errors=True)
    report.update(pulsar=PULSAR_VERSION, total_s=round(time.monotonic() - t0, 1),
                  spec=asdict(spec), cores=os.cpu_count())
    return report


def _run(bed: Any, root: Path, spec: SoakSpec, say: Callable[[str], None]) -> dict[str, Any]:
    import pulsar

    from cursorsync_devtools.testbed.lag import CursorPoller, LiveSpec, run_live

    bed.create_topic(spec.topic, spec.partitions)
    # b keeps what its subscriptions acked, so every message can be found there afterwards
    # (the lag needs each one's position on b).
    bed.admin_call("b", "POST", TopicName.parse(bed.topic(spec.topic)).admin_path("retention"),
                   json={"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    for cluster in ("a", "b"):  # the consumers' subscription exists before the job starts
        bed.client(cluster).subscribe(bed.topic(spec.topic), SUBSCRIPTION,
                                      consumer_type=pulsar.ConsumerType.Shared,
                                      initial_position=pulsar.InitialPosition.Earliest,
                                      receiver_queue_size=1).close()
    port = _free_port()
    job = JobProcess(write_config(bed, root, spec, port), root / "job.log",
                     f"http://127.0.0.1:{port}/metrics")
    say("starting the job (cursorsync run)")
    job.start()
    try:
        job.wait_syncing(240)
        live = LiveSpec(spec.topic, spec.partitions, spec.rate_per_s, spec.seconds,
                        spec.batched_fraction, spec.batch_size, spec.late_fraction,
                        spec.late_delay_s, spec.never_fraction, seed=spec.seed)
        poller = CursorPoller(bed.admin_url("b"), bed.topic(spec.topic), (SUBSCRIPTION,),
                              spec.poll_interval_s).start()
        try:
            say(f"live traffic for {spec.minutes:g} min at {spec.rate_per_s:g} msg/s")
            result, samples, restart = _live(bed, job, spec, live, run_live, say)
            say("waiting for b to cover every ack")
            settled_s, on_b = _settle(bed, job, spec, result, poller)
        finally:
            poller.stop()
        last = scrape(job.metrics_url)
    finally:
        code = job.stop()
    say("failover: draining b")
    return _report(bed, spec, result, samples, restart, settled_s, on_b, poller, last, code)


def _live(bed: Any, job: JobProcess, spec: SoakSpec, live: Any, run_live: Any,
          say: Callable[[str], None]) -> tuple[Any, list[Sample], dict[str, Any]]:
    """The workload and the sampler in threads; the broker restart in this one (a
    standalone dies with the thread that launched it, so not in a short-lived one)."""
    out: dict[str, Any] = {}

    def workload() -> None:
        try:
            out["result"] = run_live(bed, live, {SUBSCRIPTION: False})
        except BaseException as err:  # reported below
            out["error"] = err

    samples: list[Sample] = []
    done = threading.Event()

    def sampler() -> None:
        while not done.is_set():
            samples.append(Sample(time.time(), tree_rss(job.pid), _batches(job.metrics_url)))
            done.wait(spec.sample_interval_s)

    worker = threading.Thread(target=workload, name="soak-workload", daemon=True)
    sampling = threading.Thread(target=sampler, name="soak-sampler", daemon=True)
    restart: dict[str, Any] = {"cluster": spec.restart, "crash": spec.crash}
    halfway = time.monotonic() + spec.seconds / 2
    worker.start()
    sampling.start()
    try:
        while worker.is_alive():
            if not job.alive():
                raise SoakError(f"the job exited with {job.process and job.process.returncode}"
                                f" during the run; its log ends:\n{job.tail()}")
            if spec.restart and "at" not in restart and time.monotonic() > halfway:
                say(f"restarting cluster {spec.restart}{' (SIGKILL)' if spec.crash else ''}")
                restart["at"] = time.time()
                how = bed.crash_and_restart if spec.crash else bed.restart
                restart["writable_after_s"] = round(how(spec.restart), 1)
            worker.join(1.0)
    finally:
        done.set()
        sampling.join()
    if "error" in out:
        raise SoakError(f"the live workload failed: {out['error']}") from out["error"]
    return out["result"], samples, restart


def _batches(url: str) -> dict[str, tuple[float, float]]:
    try:
        m = scrape(url)
    except httpx.HTTPError:
        return {}  # the job restarting its queries: a gap in the series
    return {q: (metric_sum(m, "cursorsync_batch_duration_seconds_count", query=q),
                metric_sum(m, "cursorsync_batch_duration_seconds_sum", query=q))
            for q in ("mapping", "sync")}


def _batch_means(samples: list[Sample]) -> dict[str, float | None]:
    """Per query, the mean batch duration between the first and last of ``samples``."""
    got = [s.batches for s in samples if s.batches]
    out: dict[str, float | None] = {}
    for q in ("mapping", "sync"):
        n = got[-1][q][0] - got[0][q][0] if len(got) > 1 else 0
        out[q] = round((got[-1][q][1] - got[0][q][1]) / n, 3) if n > 0 else None
    return out


def _settle(bed: Any, job: JobProcess, spec: SoakSpec, result: Any,
            poller: Any) -> tuple[float, dict[str, Any]]:
    """Seconds from the last ack until b's cursor covered every entry acked on a."""
    from collections import Counter

    from cursorsync_devtools.testbed.lag import uncovered
    from cursorsync_devtools.testbed.readers import positions_by_key

    bed.wait_replicated([spec.topic], timeout_s=spec.settle_timeout_s)
    on_b = positions_by_key(bed, "b", Counter(m.topic for m in result.messages))
    deadline = time.monotonic() + spec.settle_timeout_s
    while (left := uncovered(result, SUBSCRIPTION, on_b, poller.changes, individual=True)):
        if not job.alive():
            raise SoakError(f"the job exited while b still missed {left} acks; its log "
                            f"ends:\n{job.tail()}")
        if time.monotonic() > deadline:
            raise SoakError(f"b's cursor still missed {left} entries acked on a "
                            f"{spec.settle_timeout_s:.0f} s after the last ack")
        time.sleep(1.0)
    return time.time() - result.last_ack_at, on_b


# ------------------------------------------------------------------------ report


def _report(bed: Any, spec: SoakSpec, result: Any, samples: list[Sample],
            restart: dict[str, Any], settled_s: float, on_b: Mapping[str, Any],
            poller: Any, last: Mapping[str, float], exit_code: int | None) -> dict[str, Any]:
    from cursorsync_devtools.testbed.failover import count, drain
    from cursorsync_devtools.testbed.lag import lag_by_ack_time

    counts = count(result, SUBSCRIPTION, drain(bed, spec.topic, SUBSCRIPTION, "Shared"))
    acked_at, lag = lag_by_ack_time(result, SUBSCRIPTION, on_b, poller.changes,
                                    individual=True)
    edges = np.linspace(result.started_at, result.started_at + spec.seconds, spec.windows + 1)
    edges[-1] = max(edges[-1], float(acked_at.max(initial=edges[-1]))) + 1e-6
    windows = []
    for i in range(spec.windows):
        lo, hi = edges[i], edges[i + 1]
        mine = lag[(acked_at >= lo) & (acked_at < hi)]
        covered = mine[~np.isnan(mine)]
        rss = [s.rss_mib for s in samples if lo <= s.at < hi]
        windows.append({
            "window": i + 1, "from_s": round(lo - result.started_at),
            "to_s": round(min(hi, edges[-2] + spec.seconds / spec.windows)
                          - result.started_at),
            "entries": len(mine), "never_covered": int(np.isnan(mine).sum()),
            "lag_p50_s": _pct(covered, 50), "lag_p99_s": _pct(covered, 99),
            "lag_max_s": _pct(covered, 100),
            "rss_mib": {k: round(float(np.mean([r[k] for r in rss])), 1) for k in rss[0]}
            if rss else {},
            "batch_s": _batch_means([s for s in samples if lo <= s.at < hi]),
            "restart": bool(restart.get("at") and lo <= restart["at"] < hi)})
    errors = {k.split('"')[1]: v for k, v in last.items()
              if k.startswith("cursorsync_errors_total{")}
    outcomes = {k.split('result="')[1].split('"')[0]: v for k, v in last.items()
                if k.startswith("cursorsync_sync_outcomes_total{")}
    return {
        "topic": bed.topic(spec.topic), "messages": len(result.messages),
        "acked_on_a": len(result.acked.get(SUBSCRIPTION, {})),
        "workload_s": round(result.finished_at - result.started_at, 1),
        "settled_after_last_ack_s": round(settled_s, 1), "polls": poller.polls,
        "poll_errors": poller.errors, "started_at": result.started_at,
        "restart": {**restart, "at_s": round(restart["at"] - result.started_at)
                    if "at" in restart else None}, "windows": windows, "samples": len(samples),
        "rss_mib_peak": round(max((s.rss_mib["total"] for s in samples), default=0.0), 1),
        "job": {"errors": errors, "outcomes": outcomes, "exit_code": exit_code,
                "acks_sent": metric_sum(last, "cursorsync_acks_sent_total"),
                "sync_batches": metric_sum(last, "cursorsync_batch_duration_seconds_count",
                                           query="sync")},
        "failover": counts.to_dict(),
    }


def _pct(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def run_soak(*, minutes: float = 30.0, json_output: bool = False,
             restart: str | None = "b", crash: bool = False, spec: SoakSpec | None = None,
             bed: Any = None) -> str:
    """``cursorsync-dev bench soak``: the text report, or JSON."""
    from dataclasses import replace

    spec = replace(spec or SoakSpec(), minutes=minutes, restart=restart, crash=crash)
    report = soak(spec, bed=bed)
    return json.dumps(report, indent=2, sort_keys=True) if json_output else table(report)
