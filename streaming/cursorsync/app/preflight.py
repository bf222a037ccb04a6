"""The preflight: what ``cursorsync check`` and the start of ``cursorsync run`` verify.

Each check reaches one real thing (an admin API, a broker, a topic, a subscription,
the tables path) with short timeouts and one attempt, and says in one line what it
found, naming the thing. A problem stops ``run`` before Spark starts: an unreachable
cluster is one line, not a Spark traceback after several seconds.
"""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from cursorsync.app.connect import admin_config, client_settings
from cursorsync.app.settings import ClusterConfig, Config
from cursorsync.app.topology import topics_in_play, topology_watch
from cursorsync.core.topology import refusals
from cursorsync.errors import CursorSyncError, TopicNotFoundError
from cursorsync.pulsar.admin import AdminAuthError, AdminClient
from cursorsync.pulsar.reachable import endpoints
from cursorsync.pulsar.topics import TopicName

Status = Literal["ok", "warning", "problem"]
#: Seconds each request of the preflight may take (the job's own timeouts are longer).
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Finding:
    """One check's result: its status, what was checked, and what was found."""

    status: Status
    what: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.status:<8} {self.what}" + (f": {self.detail}" if self.detail else "")


def check(config: Config) -> list[Finding]:
    """Every check, the two clusters' in parallel; then the topics' replication against
    the evidence, when both admin APIs answered; the tables path last."""
    with ThreadPoolExecutor(2) as pool:
        per_cluster = list(pool.map(lambda role: _cluster(config, role), ("source", "target")))
    found = [f for found in per_cluster for f in found]
    if all(f.status != "problem" for f in found if "admin API" in f.what):
        found += _topology(config)
    return [*found, _tables(config)]


def _topology(config: Config) -> list[Finding]:
    """Each topic in play's replication clusters against the configured evidence."""
    what = f"evidence {', '.join(config.evidence.strategies)}"
    try:
        with _quick(config.source) as source, _quick(config.target) as target:
            found = topology_watch(config, source, target)
            topologies = [found.topology(t) for t in topics_in_play(config, source)]
    except CursorSyncError as err:
        return [Finding("problem", f"{what} against the topics' replication", str(err))]
    lines = refusals(topologies, config.evidence.strategies)
    if lines:
        return [Finding("problem", what, line) for line in lines]
    beyond = sum(not t.two_clusters for t in topologies)
    detail = (f"{len(topologies)} topics" + (f", {beyond} replicated beyond "
                                               f"{config.source.name} and {config.target.name}"
                                               if beyond else
                                               f", each replicated between "
                                               f"{config.source.name} and {config.target.name}"))
    return [Finding("ok", f"{what} holds on the topics' replication", detail)]


def problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status == "problem"]


def render(findings: list[Finding]) -> str:
    return "\n".join(f.line() for f in findings)


def findings_json(findings: list[Finding]) -> str:
    """``check --json``: whether nothing is a problem, the counts, and every finding."""
    return json.dumps({
        "ok": not problems(findings),
        "problems": len(problems(findings)),
        "warnings": sum(f.status == "warning" for f in findings),
        "findings": [{"status": f.status, "what": f.what, "detail": f.detail}
                     for f in findings],
    }, indent=2)


def _quick(cluster: ClusterConfig) -> AdminClient:
    cfg = admin_config(cluster)
    return AdminClient(replace(cfg, attempts=1, timeout_s=min(cfg.timeout_s, TIMEOUT_S)))


def _cluster(config: Config, role: Literal["source", "target"]) -> list[Finding]:
    cluster = config.source if role == "source" else config.target
    name = f"{role} cluster {cluster.name}"
    try:
        admin = _quick(cluster)
    except CursorSyncError as err:
        return [Finding("problem", f"{name} admin API", str(err))]
    with admin:
        try:
            admin.get_json("/admin/v2/clusters", "cluster list")
        except CursorSyncError as err:
            return [Finding("problem", f"{name} admin API {cluster.admin_url}", str(err))]
        out = [Finding("ok", f"{name} admin API {cluster.admin_url}")]
        topics = _topics(admin, config, role, name, out)
        out.append(_broker(cluster, name, topics[0] if topics else None))
        if role == "target" and topics and config.evidence.holes == "verified":
            out.append(_raw_entries(admin, name, topics[0], "evidence.holes: verified"))
        if role == "source" and topics and "snapshot" in config.evidence.strategies:
            out.append(_raw_entries(admin, name, topics[0], "snapshot markers"))
    return out


def _topics(admin: AdminClient, config: Config, role: str, name: str,
            out: list[Finding]) -> list[TopicName]:
    """Each configured topic's first partition, present; subscriptions on the source."""
    found: list[TopicName] = []
    for spec in config.topics:
        topic = TopicName.parse(spec.topic)
        try:
            n = admin.partitions(topic) if topic.partition < 0 else 0
            first = topic.with_partition(0) if n > 0 else topic
            cursors = admin.internal_stats(first).subscriptions
        except TopicNotFoundError:
            out.append(Finding("problem", f"topic {topic} on the {name}", "not found"))
            continue
        except CursorSyncError as err:
            out.append(Finding("problem", f"topic {topic} on the {name}", str(err)))
            continue
        found.append(first)
        if role == "source":
            missing = [s for s in spec.subscriptions if s not in cursors]
            for sub in missing:
                out.append(Finding("problem", f"subscription {sub} of {topic} on the {name}",
                                   "not found (nothing to follow)"))
            if not missing:
                out.append(Finding("ok", f"topic {topic} on the {name}",
                                   f"subscriptions {', '.join(spec.subscriptions)}"))
        else:
            missing = [s for s in spec.subscriptions if s not in cursors]
            out.append(Finding("ok", f"topic {topic} on the {name}",
                               f"the job creates {', '.join(missing)} at the earliest entry"
                               if missing else ""))
    for ns in config.namespaces:
        try:
            matched = admin.expand_topics(namespace=ns.namespace, pattern=ns.regex)
        except CursorSyncError as err:
            out.append(Finding("problem", f"namespace {ns.namespace} on the {name}", str(err)))
            continue
        if matched:
            out.append(Finding("ok", f"namespace {ns.namespace} on the {name}",
                               f"{len(matched)} topic partitions match {ns.regex!r}"))
            found.append(matched[0])
        else:
            out.append(Finding("warning", f"namespace {ns.namespace} on the {name}",
                               f"no topic matches {ns.regex!r} yet"))
    return found


def _broker(cluster: ClusterConfig, name: str, topic: TopicName | None) -> Finding:
    """A client with the configured auth asks the broker for a topic's partitions, once
    a broker of the service URL takes a TCP connection: the client retries a refused one
    until its timeout and then says only "TimeOut"."""
    what = f"{name} broker {cluster.service_url}"
    unreachable = _no_connection(cluster.service_url)
    if unreachable:
        return Finding("problem", what, unreachable)
    settings = replace(client_settings(cluster), operation_timeout_s=int(TIMEOUT_S),
                       connection_timeout_ms=int(TIMEOUT_S * 1000))
    client: Any = None
    try:
        client = settings.connect()
        client.get_topic_partitions(str(topic.base if topic else "persistent://public/default/x"))
    except Exception as err:  # pulsar's own errors (Timeout, ConnectError, AuthenticationError)
        detail = f"{type(err).__name__}: {err}"
        if type(err).__name__ == "Timeout":
            detail = (f"the broker took the connection but gave no answer in {TIMEOUT_S:.0f} s "
                      f"({detail}; is it a Pulsar broker, with TLS as the URL's scheme says?)")
        return Finding("problem", what, detail)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    return Finding("ok", what)


def _no_connection(service_url: str) -> str:
    """Why no broker of ``service_url`` takes a TCP connection, or "" when one does."""
    failures = []
    for endpoint in endpoints(service_url):
        if isinstance(endpoint, str):
            failures.append(endpoint)
            continue
        host, port = endpoint
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            with socket.create_connection((host, port), timeout=TIMEOUT_S):
                return ""
        except ConnectionRefusedError:
            failures.append(f"connection refused by {where}")
        except socket.gaierror as err:
            failures.append(f"cannot resolve {host!r} ({err.strerror})")
        except TimeoutError:
            failures.append(f"no connection to {where} in {TIMEOUT_S:.0f} s")
        except OSError as err:
            failures.append(f"cannot connect to {where}: {err.strerror or err}")
    return "; ".join(failures)


def _raw_entries(admin: AdminClient, name: str, topic: TopicName, why: str) -> Finding:
    """The hole check (evidence.holes: verified) reads single entries of the target, snapshot
    evidence single entries of the source."""
    what = f"single-entry reads on the {name} ({why})"
    try:
        admin.raw_entry(topic, 0, 0)
    except AdminAuthError as err:
        return Finding("problem", what, str(err))
    except CursorSyncError:
        pass  # any answer but a refusal shows the permission
    return Finding("ok", what)


def _tables(config: Config) -> Finding:
    path = config.tables.path
    scheme = urlparse(path).scheme
    what = f"tables path {path}"
    if scheme not in ("", "file"):
        return Finding("warning", what, f"not checked: {scheme}:// is reached by the table "
                                        "engine at start")
    root = Path(urlparse(path).path if scheme == "file" else path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".cursorsync-check-"):
            pass
    except OSError as err:
        return Finding("problem", what, f"not writable: {err.strerror or err}")
    return Finding("ok", what)
