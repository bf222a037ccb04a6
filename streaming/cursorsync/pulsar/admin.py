"""A small Pulsar admin REST client: the stats cursorsync polls, and topic discovery.

Built on httpx. Connect errors, timeouts and 5xx answers are retried with
exponential backoff (tenacity); 4xx answers are not, because asking again
will not change them. Several base URLs may be given (the brokers of one
cluster): a request that cannot reach one tries the next. Errors name what a
user can act on: the URL that is unreachable, the auth that was refused, the
topic that does not exist on which cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from cursorsync.errors import (
    AdminError,
    AdminUnavailableError,
    ConfigError,
    MalformedAdminOutputError,
    TopicNotFoundError,
)
from cursorsync.pulsar.raw_entry import RawEntry, past_end, raw_entry_of
from cursorsync.pulsar.stats import (
    PartitionedInternalStats,
    TopicInternalStats,
    parse_creation_date,
    parse_internal_stats,
    parse_json,
    parse_partitioned_internal_stats,
    parse_partitions,
    parse_topic_list,
)
from cursorsync.pulsar.topic_stats import partition_docs
from cursorsync.pulsar.topics import TopicName, namespace_admin_path, parse_namespace

T = TypeVar("T")
K = TypeVar("K")

#: Topic stats without what the broker must count entry by entry or read from storage,
#: nor the producer and consumer lists (a subscription's counters are still summed over
#: its consumers; a broker without these options ignores them).
_CHEAP_STATS = ("?getPreciseBacklog=false&subscriptionBacklogSize=false"
                "&getEarliestTimeInBacklog=false&excludePublishers=true&excludeConsumers=true")


def parse_cluster_list(what: str, doc: Any) -> frozenset[str]:
    """A replication policy's cluster names; MalformedAdminOutputError naming ``what``
    for anything else."""
    if not isinstance(doc, list) or not all(isinstance(c, str) and c for c in doc):
        raise MalformedAdminOutputError(f"{what}: expected a list of cluster names, got "
                                        f"{str(doc)[:200]}")
    return frozenset(doc)


class AdminAuthError(AdminError):
    """The admin API refused our credentials (401) or our role (403)."""


@dataclass(frozen=True)
class AdminSettings:
    """How to reach one cluster's admin API."""

    urls: tuple[str, ...]
    cluster: str = ""
    token: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_allow_insecure: bool = False
    timeout_s: float = 10.0
    attempts: int = 4
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    max_workers: int = 8

    def __post_init__(self) -> None:
        if not self.urls:
            raise ConfigError("adminUrl: at least one admin URL is required")
        for u in self.urls:
            if not re.match(r"^https?://[^/\s]+", u):
                raise ConfigError(f"adminUrl: {u!r} is not an http(s):// URL")
        if self.timeout_s <= 0:
            raise ConfigError(f"adminTimeout: must be positive, got {self.timeout_s}")
        if self.attempts < 1:
            raise ConfigError(f"adminAttempts: must be at least 1, got {self.attempts}")
        if self.tls_key_file and not self.tls_cert_file:
            raise ConfigError("adminTlsKeyFile is set without adminTlsCertFile")

    @classmethod
    def from_urls(cls, urls: str | Sequence[str], **kwargs: Any) -> AdminSettings:
        """Accept a comma-separated string or a sequence of base URLs."""
        items = urls.split(",") if isinstance(urls, str) else list(urls)
        cleaned = tuple(u.strip().rstrip("/") for u in items if u.strip())
        return cls(urls=cleaned, **kwargs)


class _Retryable(Exception):
    """Internal: a transient failure (unreachable, timeout, 5xx) worth another attempt."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AdminClient:
    """Admin REST calls for one cluster. Thread-safe; use as a context manager or close()."""

    def __init__(self, config: AdminSettings) -> None:
        self.config = config
        verify: Any = True
        if config.tls_allow_insecure:
            verify = False
        elif config.tls_ca_file:
            verify = config.tls_ca_file
        cert: Any = None
        if config.tls_cert_file:
            cert = ((config.tls_cert_file, config.tls_key_file) if config.tls_key_file
                    else config.tls_cert_file)
        headers = {"Accept": "application/json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        try:
            self._http = httpx.Client(
                headers=headers, verify=verify, cert=cert,
                timeout=httpx.Timeout(config.timeout_s), follow_redirects=True,
            )
        except (OSError, ValueError) as e:
            raise ConfigError(f"admin TLS settings cannot be loaded: {e}") from e

    @property
    def cluster(self) -> str:
        return self.config.cluster or self.config.urls[0]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- transport -------------------------------------------------------

    def _once(self, path: str, what: str, topic: str | None,
              read: Callable[[httpx.Response], Any] | None = None,
              missing_ok: bool = False,
              none_if: Callable[[httpx.Response], bool] | None = None) -> Any:
        """One attempt over every base URL in turn; returns ``read(response)`` of a 2xx
        (default: the parsed JSON body), or None for a 404 when ``missing_ok`` and for any
        answer ``none_if`` accepts (not retried). ``read`` sees the response before its body
        is read, so it may take the headers alone (a raw entry can be megabytes)."""
        failures: list[str] = []
        for base in self.config.urls:
            url = base + path
            try:
                with self._http.stream("GET", url) as resp:
                    if resp.status_code < 300 and read is not None:
                        return read(resp)
                    resp.read()
                    if resp.status_code == 404 and missing_ok:
                        return None
                    if none_if is not None and none_if(resp):
                        return None
            except httpx.TimeoutException as e:
                failures.append(f"{url}: timed out after {self.config.timeout_s}s ({e!r})")
                continue
            except httpx.TransportError as e:
                failures.append(f"{url}: unreachable ({e!r})")
                continue
            if resp.status_code >= 500:
                failures.append(f"{url}: HTTP {resp.status_code} {resp.text[:200]!r}")
                continue
            if resp.status_code in (401, 403):
                kind = "authentication" if resp.status_code == 401 else "authorization"
                raise AdminAuthError(
                    f"cluster {self.cluster}: {what} refused by {url}: HTTP {resp.status_code} "
                    f"({kind} failed; check the admin token / TLS client certificate and the "
                    f"role's permissions)"
                )
            if resp.status_code == 404 and topic is not None:
                raise TopicNotFoundError(
                    f"topic {topic} not found on cluster {self.cluster} ({url}: HTTP 404 "
                    f"{resp.text[:200]!r})"
                )
            if resp.status_code >= 400:
                raise AdminError(
                    f"cluster {self.cluster}: {what} failed: {url}: HTTP {resp.status_code} "
                    f"{resp.text[:200]!r}"
                )
            return parse_json(f"{what} ({url})", resp.content)
        raise _Retryable("; ".join(failures))

    def get_json(self, path: str, what: str, topic: str | None = None,
                 read: Callable[[httpx.Response], Any] | None = None,
                 missing_ok: bool = False,
                 none_if: Callable[[httpx.Response], bool] | None = None) -> Any:
        """GET with retries on transient failures; AdminError when they run out."""
        cfg = self.config
        retrying = Retrying(
            stop=stop_after_attempt(cfg.attempts),
            wait=wait_exponential(multiplier=cfg.backoff_initial_s, max=cfg.backoff_max_s),
            retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
            reraise=False,
        )
        try:
            return retrying(self._once, path, what, topic, read, missing_ok, none_if)
        except RetryError as e:
            last = e.last_attempt.exception()
            detail = last.message if isinstance(last, _Retryable) else repr(last)
            raise AdminUnavailableError(
                f"cluster {self.cluster}: {what} failed after {cfg.attempts} attempts: {detail}"
            ) from last

    # -- calls -----------------------------------------------------------

    def internal_stats(self, topic: str | TopicName) -> TopicInternalStats:
        """internalStats of one topic partition (or non-partitioned topic)."""
        t = _topic(topic)
        doc = self.get_json(t.admin_path("internalStats"), f"internalStats of {t}", str(t))
        return parse_internal_stats(t, doc)

    def partitioned_internal_stats(self, topic: str | TopicName) -> PartitionedInternalStats:
        t = _topic(topic)
        doc = self.get_json(t.admin_path("partitioned-internalStats"),
                            f"partitioned-internalStats of {t}", str(t))
        return parse_partitioned_internal_stats(t, doc)

    def topic_stats(self, topic: str | TopicName) -> Any:
        """``stats`` of one topic partition (or non-partitioned topic), as the broker gives
        them (:mod:`cursorsync.pulsar.topic_stats` reads them); the backlog as the cursor's
        counters give it, not counted entry by entry."""
        t = _topic(topic)
        return self.get_json(t.admin_path("stats") + _CHEAP_STATS, f"stats of {t}", str(t))

    def partitioned_topic_stats(self, topic: str | TopicName) -> dict[str, Any]:
        """Each partition's ``stats`` by its full name, in one request."""
        t = _topic(topic)
        doc = self.get_json(t.admin_path("partitioned-stats") + _CHEAP_STATS
                            + "&perPartition=true", f"partitioned-stats of {t}", str(t))
        return partition_docs(str(t), doc)

    def creation(self, topic: str | TopicName) -> TopicCreation:
        """The topic partition's managed ledger as its internal-info tells it: its
        ``creationDate`` as written, and the ledgers created for it since (data and cursor
        ledgers), which tell the topic observed before from one deleted and created again
        without comparing clocks (:class:`TopicCreation`)."""
        t = _topic(topic)
        doc = self.get_json(t.admin_path("internal-info"), f"internal-info of {t}", str(t))
        return parse_topic_creation(t, doc)

    def replication_clusters(self, topic: str | TopicName) -> frozenset[str]:
        """The clusters a topic is replicated among as this cluster applies its policies:
        the topic's own replication policy (of its partitioned parent), else its
        namespace's. Topic policies switched off on the broker (405) or a topic it does not
        know read the namespace's."""
        t = _topic(topic).base
        what = f"replication clusters of {t}"
        doc = self.get_json(t.admin_path("replication") + "?applied=true", what,
                            missing_ok=True, none_if=lambda r: r.status_code in (405, 412))
        if doc is None:
            what = f"replication clusters of namespace {t.tenant}/{t.namespace}"
            doc = self.get_json("/admin/v2/namespaces/" + "/".join(
                quote(p, safe="") for p in (t.tenant, t.namespace)) + "/replication", what)
        return parse_cluster_list(what, doc)

    def partitions(self, topic: str | TopicName) -> int:
        """Partition count from the partitioned-topic metadata (0: not partitioned)."""
        t = _topic(topic)
        doc = self.get_json(t.admin_path("partitions"), f"partitions of {t}", str(t))
        return parse_partitions(t, doc)

    def list_topics(self, namespace: str) -> list[str]:
        """Every persistent topic of ``tenant/namespace`` (partitions listed one by one)."""
        parse_namespace(namespace)
        doc = self.get_json(namespace_admin_path(namespace), f"topic list of {namespace}")
        return parse_topic_list(namespace, doc)

    def list_partitioned_topics(self, namespace: str) -> list[str]:
        doc = self.get_json(namespace_admin_path(namespace, "partitioned"),
                            f"partitioned topic list of {namespace}")
        return parse_topic_list(namespace, doc)

    def raw_entry(self, topic: str | TopicName, ledger: int, entry: int, *,
                  past_end_ok: bool = False) -> RawEntry | None:
        """What one stored entry is, from its metadata headers, with a marker's body (None:
        no such entry).

        Markers are never dispatched to readers, but this endpoint returns them, so it
        is how a skipped id is told apart from the other ids readers skip (chunks).
        The broker answers an id past the last entry of a ledger with a 500 (the open
        ledger's: "LastConfirmedEntry is ..."; a closed one's: "No such entry"); with
        ``past_end_ok`` that answer is None at once, for callers that look past a tail
        (which is not written yet, or never will be, and asking again changes nothing).
        """
        t = _topic(topic)
        path = t.admin_path(f"ledger/{int(ledger)}/entry/{int(entry)}")
        what = f"entry {ledger}:{entry} of {t}"
        found: RawEntry | None = self.get_json(path, what, read=lambda r: raw_entry_of(what, r),
                                               missing_ok=True,
                                               none_if=past_end if past_end_ok else None)
        return found

    def map_concurrently(self, fn: Callable[[TopicName], T],
                         topics: Iterable[str | TopicName]) -> dict[str, T]:
        """Run ``fn`` for many topics on a thread pool; the first error is raised."""
        ts = [_topic(t) for t in topics]
        return {str(t): r for t, r in zip(ts, self.map_each(fn, ts), strict=True)}

    def map_each(self, fn: Callable[[K], T], items: Sequence[K]) -> list[T]:
        """``fn`` of each item, in order, run on up to ``max_workers`` threads (the
        requests this client makes at once); the first error is raised."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(self.config.max_workers, len(items))) as pool:
            return list(pool.map(fn, items))

    def internal_stats_many(self, topics: Iterable[str | TopicName]
                            ) -> dict[str, TopicInternalStats]:
        return self.map_concurrently(self.internal_stats, topics)

    def expand_topics(self, topics: Iterable[str] = (), *, namespace: str | None = None,
                      pattern: str | None = None) -> list[TopicName]:
        """Concrete topic partitions for topic names and/or a namespace (+ regex).

        A partitioned topic expands to ``<t>-partition-0..N-1`` from its
        metadata; a ``-partition-i`` name stays as given. ``pattern`` is
        matched (fullmatch) against the local name of the topic, without the
        partition suffix; without ``namespace`` it is an error.
        """
        out: set[TopicName] = set()
        explicit = [_topic(t) for t in topics]
        to_expand = [t for t in explicit if t.partition < 0]
        out.update(t for t in explicit if t.partition >= 0)
        counts = self.map_concurrently(self.partitions, to_expand)
        for t in to_expand:
            n = counts[str(t)]
            out.update([t.with_partition(i) for i in range(n)] if n > 0 else [t])
        if pattern is not None and namespace is None:
            raise ConfigError("topicPattern needs namespace")
        if namespace is not None:
            try:
                rx = re.compile(pattern) if pattern is not None else None
            except re.error as e:
                raise ConfigError(f"topicPattern {pattern!r} is not a valid regex: {e}") from e
            listed = [TopicName.parse(n) for n in self.list_topics(namespace)]
            partitioned = [TopicName.parse(n) for n in self.list_partitioned_topics(namespace)]
            partitioned = [t for t in partitioned if rx is None or rx.fullmatch(t.local)]
            counts = self.map_concurrently(self.partitions, partitioned)
            for t in partitioned:
                n = counts[str(t)]
                out.update([t.with_partition(i) for i in range(n)] if n > 0 else [t])
            out.update(t for t in listed if rx is None or rx.fullmatch(t.base.local))
        return sorted(out)


@dataclass(frozen=True)
class TopicCreation:
    """A topic partition's managed ledger, from ``GET .../internal-info``.

    ``created`` is its ``creationDate`` exactly as the broker wrote it: a topic deleted and
    created again has another one, an unload or a broker restart keeps it. ``ledgers`` are
    the ids of its data ledgers and of its cursors' ledgers. A cluster draws every ledger
    id, of any topic, from one increasing sequence, and a managed ledger exists before it
    creates any ledger; so a ledger of this topic with an id at or above
    :attr:`first_ledger` was created while this managed ledger existed, and is its own,
    whether it is still listed or was trimmed since.
    """

    created: str
    ledgers: tuple[int, ...]

    @property
    def first_ledger(self) -> int | None:
        """The lowest ledger id known to be this managed ledger's (None: none created yet)."""
        return min(self.ledgers) if self.ledgers else None


def parse_topic_creation(topic: str | TopicName, doc: Any) -> TopicCreation:
    """``GET .../internal-info`` -> :class:`TopicCreation`; MalformedAdminOutputError naming
    the field when the answer is not internal-info's."""
    name = str(topic)
    parse_creation_date(name, doc)  # checks the field and its form
    created = doc["creationDate"]
    ids = [_ledger_id(name, f"ledgers[{i}].ledgerId", lg.get("ledgerId") if isinstance(
        lg, dict) else None) for i, lg in enumerate(_items(name, doc, "ledgers", list))]
    for cursor, info in _items(name, doc, "cursors", dict).items():
        # A cursor without a ledger yet (after a load, until it next persists) shows -1.
        ids.append(_ledger_id(name, f"cursors.{cursor}.cursorsLedgerId",
                              info.get("cursorsLedgerId", -1) if isinstance(info, dict)
                              else None))
    return TopicCreation(created, tuple(sorted({i for i in ids if i >= 0})))


def _items(name: str, doc: dict[str, Any], field: str, kind: type) -> Any:
    value = doc.get(field, kind())
    if not isinstance(value, kind):
        raise MalformedAdminOutputError(
            f"{name}: internal-info field {field} is not a JSON {kind.__name__}")
    return value


def _ledger_id(name: str, field: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedAdminOutputError(
            f"{name}: internal-info field {field} is not an integer ({value!r})")
    return value


def _topic(topic: str | TopicName) -> TopicName:
    return topic if isinstance(topic, TopicName) else TopicName.parse(topic)
