"""Two real Pulsar clusters, ``a`` and ``b``, geo-replicated both ways (or three, with ``c``).

Usage::

    with TestBed(TestBedConfig(work_dir=path)) as bed:
        bed.create_topic("orders", partitions=3)
        producer = bed.client("a").create_producer(bed.topic("orders"))
        ...
        bed.wait_replicated(["orders"])

Each cluster is an Apache Pulsar standalone (:mod:`cursorsync_devtools.testbed.standalone`).
On start both are launched at once; when both answer, each registers the other
cluster, and the tenant and namespace are created on both with replication to
``[a, b]``, so every topic in the namespace is replicated a -> b and b -> a and
Pulsar's replicated subscriptions work (they need both directions). Ledgers roll
at a different entry count on each side, and ``b`` starts with a few ledgers
made on purpose, so a source position and its target position rarely have the
same ids: mixing the two up shows.

A third cluster ``c`` is opt-in (``TestBedConfig(clusters=("a", "b", "c"))``): the
three form a full mesh, each registering the other two, the tenant allowed on all
three and the namespace replicated to all three on every cluster. ``c`` rolls its
ledgers at its own entry count and starts with ledgers of its own made first
(:data:`THIRD_LEDGER_OFFSET`), fewer than ``b``'s: its ledger ids run just ahead of
``a``'s and behind ``b``'s, so the ledger ids of ``c``'s topics fall among ``a``'s. A
stamp ``c`` writes on its copies (``c``'s own ``ledger:entry``) then reads as a
position inside ``a``'s topic, now and then a real one: what a synchronizer that takes
every stamp for a position on ``a`` gets wrong. A workload that wants it for sure gives
ledgers the same id on ``a`` and ``c`` with :meth:`TestBed.align_ledger_ids` (the
three-cluster workload does, for each topic partition's first ledger).

cursorsync's optional broker plugin (streaming/broker-plugin, built with
:data:`BROKER_PLUGIN_BUILD`) is opt-in too: ``TestBedConfig(broker_plugin=path)`` loads
that NAR into every cluster's broker as the additional servlet :data:`BROKER_PLUGIN_NAME`
(:func:`broker_plugin_path` is where the build leaves it in this checkout).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cursorsync.core.positions import Position
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.client import connect
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed.standalone import Standalone, StandaloneSpec

SOURCE, TARGET = "a", "b"
#: The broker plugin's build, run from the checkout's root, and its additional servlet's
#: name (streaming/broker-plugin/src/main/resources/META-INF/services/additional_servlet.yml).
BROKER_PLUGIN_BUILD = "mvn -q -f streaming/broker-plugin/pom.xml package"
BROKER_PLUGIN_NAME = "cursorsync"
#: The opt-in third cluster, and what it gets when the config's tuples name only a and b.
THIRD = "c"
THIRD_ENTRIES_PER_LEDGER = 50
THIRD_MAX_MESSAGE_SIZE = 512 * 1024
THIRD_LEDGER_OFFSET = 3


class TestBedError(CursorSyncError):
    """The test bed could not do what was asked; the message names the cluster and call."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class TestBedConfig:
    """What the test bed starts."""

    __test__ = False

    work_dir: Path | None = None
    #: The clusters, a (source) and b (target) first; ("a", "b", "c") adds the third.
    clusters: tuple[str, ...] = (SOURCE, TARGET)
    tenant: str = "cursorsync"
    namespace: str = "geo"
    #: managedLedgerMaxEntriesPerLedger on a and on b (and c, if given; else
    #: THIRD_ENTRIES_PER_LEDGER): different, so ledgers roll at different places on each side.
    entries_per_ledger: tuple[int, ...] = (60, 45)
    #: Broker maxMessageSize on a and on b. a's is small, so a test's chunked messages
    #: need well under 1 MB. b's is larger: a chunk as large as a's limit, plus the source
    #: position the replicator adds to it, does not fit the same limit on b, and Pulsar
    #: 4.0.8's replicator then drops the chunk without a word (pinned in
    #: tests/integration/bed/test_pulsar_facts.py: with equal limits only each message's
    #: last, smaller chunk reaches b, which can then never deliver it). c's (THIRD_MAX_MESSAGE_SIZE
    #: unless given) is b's, for the same reason.
    max_message_size: tuple[int, ...] = (256 * 1024, 512 * 1024)
    #: Ledgers made on b before anything else, so b's ledger ids run ahead of a's.
    target_ledger_offset: int = 12
    #: Ledgers made on c before anything else (see the module doc).
    third_ledger_offset: int = THIRD_LEDGER_OFFSET
    #: More standalone.conf settings per cluster name.
    settings: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    ready_timeout_s: float = 180.0
    #: The broker plugin's NAR to load into every cluster's broker (None: none, as Pulsar
    #: ships); it must be built already (:data:`BROKER_PLUGIN_BUILD`).
    broker_plugin: Path | None = None
    #: PULSAR_MEM of every standalone (None: DEFAULT_MEMORY, for two beside Spark).
    memory: str | None = None
    #: The operation timeout of the clients :meth:`TestBed.client` makes: a consumer of a
    #: topic of thousands of partitions waits for the broker to load every one.
    operation_timeout_s: int = 30

    def __post_init__(self) -> None:
        names = self.clusters
        if names[:2] != (SOURCE, TARGET) or len(set(names)) != len(names) or not (
                2 <= len(names) <= 3):
            raise TestBedError(f"clusters {names!r}: the test bed runs ({SOURCE!r}, "
                               f"{TARGET!r}) or ({SOURCE!r}, {TARGET!r}, {THIRD!r})")
        if len(names) == 3 and names[2] != THIRD:
            raise TestBedError(f"clusters {names!r}: the third cluster is {THIRD!r}")

    def shape(self, cluster: str) -> tuple[int, int, int]:
        """(entries per ledger, max message size, ledgers made first) of one cluster."""
        i = self.clusters.index(cluster)
        entries = (*self.entries_per_ledger, THIRD_ENTRIES_PER_LEDGER)[i]
        size = (*self.max_message_size, THIRD_MAX_MESSAGE_SIZE)[i]
        offset = (0, self.target_ledger_offset, self.third_ledger_offset)[i]
        return entries, size, offset


def broker_plugin_path() -> Path:
    """Where :data:`BROKER_PLUGIN_BUILD` leaves the plugin's NAR in this checkout."""
    root = Path(__file__).resolve().parents[4]
    return root / "streaming" / "broker-plugin" / "target" / "cursorsync-broker-plugin.nar"


def _plugin_settings(directory: Path, extract_to: Path) -> dict[str, str]:
    """standalone.conf settings that load the plugin as an additional servlet (Pulsar's
    AdditionalServlets.load reads these three keys), unpacked in the cluster's own directory
    rather than the JVM's temporary directory."""
    return {"additionalServletDirectory": str(directory),
            "additionalServlets": BROKER_PLUGIN_NAME,
            "narExtractionDirectory": str(extract_to)}


class TestBed:
    """Clusters a (source) and b (target), and c if configured, geo-replicated in full
    mesh; a context manager."""

    __test__ = False

    def __init__(self, config: TestBedConfig | None = None) -> None:
        self.config = config or TestBedConfig()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if self.config.work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cursorsync-testbed-")
            self.work_dir = Path(self._tmp.name)
        else:
            self.work_dir = Path(self.config.work_dir)
        self.source, self.target = SOURCE, TARGET
        plugins = self._plugin_directory()
        self.clusters: dict[str, Standalone] = {}
        for name in self.config.clusters:
            entries, size, _ = self.config.shape(name)
            settings = {"managedLedgerMaxEntriesPerLedger": str(entries),
                        "maxMessageSize": str(size),
                        **({} if plugins is None else _plugin_settings(
                            plugins, self.work_dir / name / "nar")),
                        **self.config.settings.get(name, {})}
            self.clusters[name] = Standalone(StandaloneSpec(
                name, self.work_dir, settings, ready_timeout_s=self.config.ready_timeout_s,
                **({} if self.config.memory is None else {"memory": self.config.memory})))
        self._http: dict[str, httpx.Client] = {}
        # Weak: a client its user has dropped is freed at once (a session-long bed would
        # otherwise keep every test's clients, three descriptors each, until it stops).
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self.start_seconds: dict[str, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (a workload run in a process of its own): it reaches
        the same clusters, with clients and admin connections of its own, and neither owns
        the clusters nor the work dir, so its ``stop()`` leaves them running."""
        return {**self.__dict__, "_tmp": None, "_http": {}, "_clients": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._clients = weakref.WeakSet()
        self._http = {name: httpx.Client(base_url=c.admin_url, timeout=30.0)
                      for name, c in self.clusters.items()}

    def _plugin_directory(self) -> Path | None:
        """The directory the brokers load the plugin from: a copy of the configured NAR
        alone in it (a rebuild during the run changes nothing), or None without one."""
        nar = self.config.broker_plugin
        if nar is None:
            return None
        if not Path(nar).is_file():
            raise TestBedError(
                f"broker plugin {nar}: no such file; build it first, from the checkout's "
                f"root: {BROKER_PLUGIN_BUILD}")
        directory = self.work_dir / "broker-plugins"
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(nar, directory / Path(nar).name)
        return directory

    # -- lifecycle
    def start(self) -> TestBed:
        try:
            for c in self.clusters.values():
                c.launch()
            for name, c in self.clusters.items():
                self.start_seconds[name] = c.wait_ready()
            self._http = {name: httpx.Client(base_url=c.admin_url, timeout=30.0)
                          for name, c in self.clusters.items()}
            self._replicate()
            for name in self.clusters:
                self._offset_ledgers(name, self.config.shape(name)[2])
        except BaseException:
            self.stop()
            raise
        return self

    def crash_and_restart(self, cluster: str, *, writable_timeout_s: float = 120.0) -> float:
        """SIGKILL one cluster's standalone and start it again on its stored state and
        ports, as a broker that crashed and came back; seconds until it took a write.

        Its admin API answers before its bookie takes writes again, so this waits for a
        message sent to a topic outside the replicated namespace. The standalone keeps its
        metadata in RocksDB, and the killed bookie's registration outlives it: the new
        bookie's registration then flaps for as long as it runs (Pulsar logs "Bookie ...
        deleted" / "created" thousands of times a minute), so writes to the cluster fail
        now and then afterwards. Give a crash test a test bed of its own."""
        self._cluster(cluster).kill()
        return self._relaunch(cluster, writable_timeout_s)

    def restart(self, cluster: str, *, writable_timeout_s: float = 120.0) -> float:
        """Stop one cluster's standalone cleanly (SIGTERM) and start it again on its stored
        state and ports, as in a rolling restart; seconds until it took a write."""
        self._cluster(cluster).stop(timeout_s=90.0)  # brokerShutdownTimeoutMs is 60 s
        return self._relaunch(cluster, writable_timeout_s)

    def _relaunch(self, cluster: str, writable_timeout_s: float) -> float:
        c = self._cluster(cluster)
        started = time.monotonic()
        c.launch(keep_state=True)
        c.wait_ready()
        deadline = started + writable_timeout_s
        probe = f"persistent://public/default/testbed-restart-probe-{int(started * 1000)}"
        while True:
            client = self.client(cluster, operation_timeout_seconds=10)
            try:
                client.create_producer(probe, send_timeout_millis=10_000).send(b"probe")
                return time.monotonic() - started
            except Exception as err:  # pulsar.Timeout and friends: the bookie not back yet
                if time.monotonic() > deadline:
                    raise TestBedError(
                        f"cluster {cluster}: restarted, but took no write within "
                        f"{writable_timeout_s:.0f} s ({err}); its log: {c.log_path}") from err
                time.sleep(1.0)
            finally:
                client.close()

    def stop(self) -> None:
        """Close clients, stop the clusters (in parallel), remove a temporary work dir."""
        for client in list(self._clients):
            with contextlib.suppress(Exception):  # the broker may be gone already
                client.close()
        self._clients.clear()
        for h in self._http.values():
            h.close()
        self._http.clear()
        with ThreadPoolExecutor(len(self.clusters)) as pool:
            list(pool.map(lambda c: c.stop(), self.clusters.values()))
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> TestBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def remove(self) -> None:
        """Stop and delete the work directory, even one given in the config."""
        self.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- set-up
    def _replicate(self) -> None:
        ns = self.namespace
        for here in self.clusters:
            for other, c in self.clusters.items():
                if other != here:
                    self.admin_call(here, "PUT", f"/admin/v2/clusters/{other}", json={
                        "serviceUrl": c.admin_url, "brokerServiceUrl": c.service_url})
            self.admin_call(here, "PUT", f"/admin/v2/tenants/{self.config.tenant}", json={
                "adminRoles": [], "allowedClusters": list(self.clusters)})
            self.admin_call(here, "PUT", f"/admin/v2/namespaces/{ns}")
            self.admin_call(here, "POST", f"/admin/v2/namespaces/{ns}/replication",
                            json=list(self.clusters))

    def _offset_ledgers(self, cluster: str, count: int, name: str = "offset") -> None:
        """``count`` ledgers made on ``cluster`` outside the namespace: its ledger ids start
        that much later."""
        if not count:
            return
        client = self.client(cluster)
        for i in range(count):
            p = client.create_producer(f"persistent://public/default/testbed-ledger-{name}-{i}")
            p.send(b"offset")
            p.close()

    def next_ledger_id(self, cluster: str) -> int:
        """About the id ``cluster``'s next ledger gets: one more than a probe ledger made
        now (outside the namespace)."""
        probe = f"persistent://public/default/testbed-ledger-probe-{time.time_ns()}"
        producer = self.client(cluster).create_producer(probe)
        producer.send(b"probe")
        producer.close()
        return int(self.internal_stats(cluster, probe)["ledgers"][-1]["ledgerId"]) + 1

    def align_ledger_ids(self, cluster: str, like: str) -> int:
        """Ledgers made on whichever of ``cluster`` and ``like`` is behind until their next
        ledger ids meet (give or take the ledgers others make meanwhile): from here on,
        the two clusters' new ledgers get about the same ids. How many were made."""
        behind = self.next_ledger_id(like) - self.next_ledger_id(cluster)
        lagging = cluster if behind > 0 else like
        self._offset_ledgers(lagging, abs(behind), f"align-{time.time_ns()}")
        return behind

    # -- addresses, clients, admin
    @property
    def namespace(self) -> str:
        return f"{self.config.tenant}/{self.config.namespace}"

    def topic(self, name: str) -> str:
        """The full name of a topic of the replicated namespace (full names pass through)."""
        return name if "://" in name else f"persistent://{self.namespace}/{name}"

    def _cluster(self, cluster: str) -> Standalone:
        try:
            return self.clusters[cluster]
        except KeyError:
            raise TestBedError(f"unknown cluster {cluster!r}; the test bed has "
                               f"{', '.join(self.clusters)}") from None

    def service_url(self, cluster: str) -> str:
        return self._cluster(cluster).service_url

    def admin_url(self, cluster: str) -> str:
        return self._cluster(cluster).admin_url

    def client(self, cluster: str, **kwargs: Any) -> Any:
        """A new ``pulsar.Client`` for the cluster, closed by ``stop()`` if still open."""
        kwargs.setdefault("operation_timeout_seconds", self.config.operation_timeout_s)
        client = connect(self.service_url(cluster), **kwargs)
        self._clients.add(client)
        return client

    def admin_call(self, cluster: str, method: str, path: str, *, json: Any = None,
                   ok: Iterable[int] = (200, 204, 409)) -> Any:
        """An admin REST call; its JSON answer (or None). 409 (exists) counts as done."""
        self._cluster(cluster)
        r = self._http[cluster].request(method, path, json=json)
        if r.status_code not in set(ok):
            log = f" (its log: {self.clusters[cluster].log_path})" if r.status_code >= 500 else ""
            raise TestBedError(f"cluster {cluster}: {method} {path} answered {r.status_code}"
                               f"{log}: {r.text[:500]}")
        return r.json() if r.content and "json" in r.headers.get("content-type", "") else None

    def internal_stats(self, cluster: str, topic: str) -> dict[str, Any]:
        t = TopicName.parse(self.topic(topic))
        found: dict[str, Any] = self.admin_call(cluster, "GET", t.admin_path("internalStats"),
                                                ok=(200,))
        return found

    def partitions(self, name: str) -> list[str]:
        """The topic partitions of ``name`` on a (the topic itself when not partitioned)."""
        t = TopicName.parse(self.topic(name))
        meta = self.admin_call(self.source, "GET", t.admin_path("partitions"), ok=(200,))
        n = int(meta.get("partitions", 0)) if meta else 0
        return [str(t.with_partition(i)) for i in range(n)] if n else [str(t)]

    def create_topic(self, name: str, partitions: int = 0) -> list[str]:
        """Create the topic on every cluster; its partitions (or itself)."""
        t = TopicName.parse(self.topic(name))
        for cluster in self.clusters:
            if partitions:
                self.admin_call(cluster, "PUT", t.admin_path("partitions"), json=partitions)
            else:
                self.admin_call(cluster, "PUT", t.admin_path(""))
        return [str(t.with_partition(i)) for i in range(partitions)] if partitions else [str(t)]

    # -- waiting
    def last_entry(self, cluster: str, topic: str) -> Position:
        return Position.parse(self.internal_stats(cluster, topic)["lastConfirmedEntry"])

    def _stats_until(self, cluster: str, topic: str, deadline: float) -> dict[str, Any]:
        """internalStats, asked again while the broker answers with an error until
        ``deadline``: a broker back from a crash fails to open a topic now and then while
        its bookie's registration flaps (:meth:`crash_and_restart`)."""
        while True:
            try:
                return self.internal_stats(cluster, topic)
            except TestBedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def wait_replicated(self, topics: Iterable[str], *, origin: str | None = SOURCE,
                        timeout_s: float = 120.0) -> float:
        """Wait until every entry the topics' partitions hold now on ``origin`` has been
        sent to every other cluster (each replicator cursor has passed it); seconds waited.
        ``origin`` None: from every cluster to every other."""
        origins = list(self.clusters) if origin is None else [self._cluster(origin).cluster]
        parts = [p for t in topics for p in self.partitions(t)]
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        goal = {(o, p): Position.parse(
                    self._stats_until(o, p, deadline)["lastConfirmedEntry"])
                for o in origins for p in parts}
        while True:
            behind = []
            for o in origins:
                for p in parts:
                    cursors = self._stats_until(o, p, deadline).get("cursors", {})
                    for other in self.clusters:
                        if other == o:
                            continue
                        cursor = f"pulsar.repl.{other}"
                        md = cursors.get(cursor, {}).get("markDeletePosition")
                        if goal[o, p].entry < 0 and md is None:
                            continue  # nothing to send yet
                        if md is None or Position.parse(md) < goal[o, p]:
                            behind.append((o, other, f"{p} ({cursor} at {md}, "
                                                     f"goal {goal[o, p]})"))
            if not behind:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                o, other, _ = behind[0]
                raise TestBedError(f"replication {o} -> {other} did not catch up within "
                                   f"{timeout_s:.0f} s: "
                                   f"{'; '.join(b[2] for b in behind[:5])}")
            time.sleep(0.2)
