"""The cursorsync configuration: typed, validated, loaded from one YAML file.

Every section is a frozen pydantic model that rejects unknown keys, so a typo
(``clusters.source.colour``) is an error instead of a silently ignored
setting. :func:`load_config` turns every validation problem into one line
that names the full key path and what would be valid, and raises them all at
once as a :class:`ConfigValidationError` (a :class:`~cursorsync.errors.ConfigError`):

    emission.mode: 'fast' is not a valid mode. Valid values are: cumulative-where-allowed, ...
    clusters.source.colour: unknown key. Valid keys are: admin_url, auth, max_concurrency, ...

List items are written ``topics[0].subscriptions``. When the config came from a
file, each line ends with `` (file.yaml line N)``.

Environment variables
---------------------
String values (never keys) may reference environment variables, so secrets
stay out of the file:

* ``${NAME}``: the value of ``NAME``; an error naming the key if it is unset.
* ``${NAME:-default}``: the value of ``NAME``, or ``default`` if unset or empty.
* ``$$``: a literal ``$``. A ``$`` not followed by ``{`` or ``$`` is kept as is
  (regular expressions can end with ``$``).

Expansion happens after YAML parsing, on string scalars only, so a variable's
value can never change the structure of the file.

The embedded test bed
---------------------
``service_url: embedded`` and ``admin_url: embedded`` (:data:`EMBEDDED`) mean
"filled in at runtime by the test bed": ``cursorsync demo`` starts two local
Apache Pulsar clusters on free loopback ports and calls
:meth:`Config.with_cluster` with the real URLs. A job started with unresolved
``embedded`` URLs fails in :meth:`Config.require_resolved` with the key named.

Relative paths (``tables.path``, ``spark.checkpoint_dir``, TLS files) are
relative to the working directory of the process, not to the config file.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cursorsync.core.identity import REPL_SOURCE_POSITION_PROPERTY
from cursorsync.errors import ConfigError

#: The URL marker meaning "the embedded test bed fills this in at runtime".
EMBEDDED = "embedded"

#: The config ``cursorsync demo`` uses (a path in the source checkout).
EMBEDDED_CONFIG_PATH = Path(__file__).resolve().parents[3] / "conf" / "embedded.yaml"

#: The property recent brokers stamp on replicated entries ("ledgerId:entryId" of the source).
DEFAULT_SOURCE_POSITION_PROPERTY = REPL_SOURCE_POSITION_PROPERTY

EvidenceStrategy = Literal["position-property", "identity", "snapshot"]
IdentityScope = Literal["all", "batched"]
Holes = Literal["verified", "unacked"]
IdentityField = Literal[
    "producer_name",
    "publish_time",
    "event_time",
    "partition_key",
    "ordering_key",
    "properties",
    "payload",
]
EmissionMode = Literal["cumulative-where-allowed", "individual"]
SubscriptionType = Literal["Exclusive", "Failover", "Shared", "Key_Shared"]
RewindPolicy = Literal["halt", "report"]
TableBackend = Literal["delta-rs", "delta-spark"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
Partitioned = Literal["auto", True, False]

#: A key path inside the config: section and field names, list indexes.
Loc = tuple[str | int, ...]

#: Subscription types on which the broker accepts cumulative acks.
CUMULATIVE_ACK_TYPES: frozenset[str] = frozenset({"Exclusive", "Failover"})

_TOPIC_RE = re.compile(r"persistent://[^/\s]+/[^/\s]+/[^/\s]+")
_NAMESPACE_RE = re.compile(r"[^/\s]+/[^/\s]+")
_SERVICE_SCHEMES = ("pulsar://", "pulsar+ssl://")
_ADMIN_SCHEMES = ("http://", "https://")
_REPLICATOR_PREFIX = "pulsar.repl."
_PARTITION_SUFFIX_RE = re.compile(r"-partition-\d+$")


def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is shown to the user verbatim."""
    return PydanticCustomError("cursorsync", message)


class _Section(BaseModel):
    """Base of every section: immutable, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- clusters


class TlsConfig(_Section):
    """TLS towards the broker and the admin API; cert_file + key_file = mutual TLS auth."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    allow_insecure: bool = False

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise _invalid("cert_file and key_file must be given together (mutual TLS)")
        return self


class AuthConfig(_Section):
    """Credentials: a token (inline or from a file), TLS, or TLS plus a token."""

    token: SecretStr | None = None
    token_file: str | None = None
    tls: TlsConfig | None = None

    @model_validator(mode="after")
    def _one_token_source(self) -> Self:
        if self.token is not None and self.token_file is not None:
            raise _invalid("give either token or token_file, not both")
        return self

    def resolve_token(self) -> str | None:
        """The bearer token, read from token_file at call time (so rotated tokens are seen)."""
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is not None:
            try:
                return Path(self.token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(
                    f"auth.token_file: cannot read {self.token_file!r}: {exc.strerror}"
                ) from exc
        return None


class ClusterConfig(_Section):
    """One Pulsar cluster: its binary-protocol service URL and its admin REST URL."""

    name: str = Field(min_length=1)
    service_url: str
    admin_url: str
    auth: AuthConfig = Field(default_factory=AuthConfig)
    request_timeout_s: float = Field(default=30.0, gt=0)
    max_concurrency: int = Field(default=8, ge=1, le=1024)
    #: Messages a mapping reader may hold in its receiver queue (memory: this many
    #: messages per task).
    receiver_queue_size: int = Field(default=1000, ge=1, le=100_000)

    @field_validator("service_url")
    @classmethod
    def _service_url(cls, value: str) -> str:
        if value != EMBEDDED and not value.startswith(_SERVICE_SCHEMES):
            raise _invalid(
                f"{value!r} is not a valid service URL. Valid forms are: "
                f"pulsar://host:port, pulsar+ssl://host:port, {EMBEDDED}"
            )
        return value

    @field_validator("admin_url")
    @classmethod
    def _admin_url(cls, value: str) -> str:
        if value != EMBEDDED and not value.startswith(_ADMIN_SCHEMES):
            raise _invalid(
                f"{value!r} is not a valid admin URL. Valid forms are: "
                f"http://host:port, https://host:port, {EMBEDDED}"
            )
        return value.rstrip("/") if value != EMBEDDED else value

    @property
    def is_embedded(self) -> bool:
        """True while a URL still waits for the test bed to fill it in."""
        return EMBEDDED in (self.service_url, self.admin_url)


class ClustersConfig(_Section):
    """The two clusters: acks are read on source and written on target."""

    source: ClusterConfig
    target: ClusterConfig

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        if self.source.name == self.target.name:
            raise _invalid(
                f"source and target have the same name {self.source.name!r}; "
                "they must be the two different clusters of the replication"
            )
        return self


# --------------------------------------------------------------------------- topics


#: The mapping query reads each cluster on durable subscriptions named
#: ``cursorsync-mapping-<side>``; synced, they would ack what the mapping has not read.
MAPPING_SUBSCRIPTION_PREFIX = "cursorsync-mapping"


def _check_subscriptions(names: list[str]) -> list[str]:
    seen: set[str] = set()
    for name in names:
        if not name.strip():
            raise _invalid("subscription names must not be empty")
        if name.startswith(MAPPING_SUBSCRIPTION_PREFIX):
            raise _invalid(
                f"{name!r} is cursorsync's own mapping subscription, not one to sync "
                f"(names starting with {MAPPING_SUBSCRIPTION_PREFIX!r} are reserved)"
            )
        if name.startswith(_REPLICATOR_PREFIX):
            raise _invalid(
                f"{name!r} is a replicator cursor, not a subscription "
                f"(names starting with {_REPLICATOR_PREFIX!r} are reserved)"
            )
        if name in seen:
            raise _invalid(f"subscription {name!r} is listed twice")
        seen.add(name)
    return names


class TopicSpec(_Section):
    """One topic and the subscriptions on it to keep in step."""

    topic: str
    subscriptions: list[str] = Field(min_length=1)
    partitioned: Partitioned = "auto"

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if value.startswith("non-persistent://"):
            raise _invalid(f"{value!r} is non-persistent: only persistent topics have cursors")
        if not _TOPIC_RE.fullmatch(value):
            raise _invalid(
                f"{value!r} is not a full topic name. Expected persistent://tenant/namespace/topic"
            )
        return value

    @field_validator("subscriptions")
    @classmethod
    def _subscriptions(cls, value: list[str]) -> list[str]:
        return _check_subscriptions(value)


class NamespaceSpec(_Section):
    """Every topic of a namespace whose local name matches ``regex`` (full match)."""

    namespace: str
    regex: str = ".*"
    subscriptions: list[str] = Field(min_length=1)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _NAMESPACE_RE.fullmatch(value):
            raise _invalid(f"{value!r} is not a namespace. Expected tenant/namespace")
        return value

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise _invalid(f"{value!r} is not a valid regular expression: {exc}") from None
        return value

    @field_validator("subscriptions")
    @classmethod
    def _subscriptions(cls, value: list[str]) -> list[str]:
        return _check_subscriptions(value)

    def matches(self, topic: str) -> bool:
        """Whether a full topic name is in this namespace and its local name matches.

        A partition (``<name>-partition-<i>``) matches as its partitioned parent does.
        """
        prefix = f"persistent://{self.namespace}/"
        if not topic.startswith(prefix):
            return False
        local = _PARTITION_SUFFIX_RE.sub("", topic[len(prefix) :])
        return re.fullmatch(self.regex, local) is not None


# --------------------------------------------------------------------------- evidence, emission


_ALL_IDENTITY_FIELDS: tuple[IdentityField, ...] = get_args(IdentityField)
_ALL_STRATEGIES: tuple[EvidenceStrategy, ...] = get_args(EvidenceStrategy)
_DEFAULT_STRATEGIES: tuple[EvidenceStrategy, ...] = ("position-property", "identity")


class EvidenceConfig(_Section):
    """How source entries are matched to target entries, strongest strategy first."""

    # snapshot-marker evidence is not read yet (see the README); the builder refuses it.
    strategies: list[EvidenceStrategy] = Field(
        default_factory=lambda: list(_DEFAULT_STRATEGIES), min_length=1
    )
    source_position_property: str = Field(default=DEFAULT_SOURCE_POSITION_PROPERTY, min_length=1)
    identity_fields: list[IdentityField] = Field(
        default_factory=lambda: list(_ALL_IDENTITY_FIELDS), min_length=1
    )
    alignment_window: int = Field(default=10_000, ge=1)
    #: Which entries identity evidence digests and matches. ``batched``: the source
    #: brokers stamp the position property (>= 3.0.11 / 3.3.6 / 4.0.4), which consumers
    #: see on every unbatched replica, so only batched entries need identity; the source
    #: stream then hands on only batched entries. An unbatched replica without the
    #: stamp stays unmapped (a duplicate after failover, never a loss).
    identity_scope: IdentityScope = "all"
    #: What to do with the entry ids a target reader skips: broker markers, or the
    #: chunks of a chunked message before its last one. ``verified``: ask the target's
    #: admin API (one raw-entry request per skipped id, stopping at a run's first
    #: non-marker) and ack only markers, after the entry before them; chunked messages
    #: are never mapped. ``unacked``: ack none (the target's markDeletePosition then
    #: stops at the first marker). Nothing takes a skipped id for a marker unchecked: a
    #: chunk acked that way would lose its message after a failover.
    holes: Holes = "verified"

    @property
    def claims_holes(self) -> bool:
        """Skipped target ids may be acked, once the target's admin API says they are
        markers."""
        return self.holes != "unacked"

    @model_validator(mode="after")
    def _scope_needs_both(self) -> Self:
        if self.identity_scope == "batched" and not {"position-property", "identity"} <= set(
                self.strategies):
            raise _invalid("identity_scope batched needs both position-property and identity "
                           "in strategies (the property maps the unbatched entries)")
        return self

    @field_validator("strategies", "identity_fields")
    @classmethod
    def _no_duplicates(cls, value: list[str]) -> list[str]:
        dupes = sorted({v for v in value if value.count(v) > 1})
        if dupes:
            raise _invalid(f"{', '.join(dupes)} listed more than once")
        return value


class EmissionConfig(_Section):
    """How acks are sent to the target subscriptions."""

    mode: EmissionMode = "cumulative-where-allowed"
    dry_run: bool = False
    subscription_type: SubscriptionType = "Shared"
    ack_batch_size: int = Field(default=1000, ge=1)
    spread_across_executors: bool = False
    rewind_policy: RewindPolicy = "halt"

    @property
    def cumulative(self) -> bool:
        """Whether cumulative acks will be used (the broker refuses them on Shared/Key_Shared)."""
        return (
            self.mode == "cumulative-where-allowed"
            and self.subscription_type in CUMULATIVE_ACK_TYPES
        )


# --------------------------------------------------------------------------- tables, spark


class TablesConfig(_Section):
    """Where the Delta tables live and which writer writes them."""

    backend: TableBackend = "delta-rs"
    path: str = Field(min_length=1)
    storage_options: dict[str, str] = Field(default_factory=dict)
    #: How often the job compacts and vacuums its tables and expires old history rows.
    maintenance_interval_s: float = Field(default=3600.0, gt=0)
    #: cursor_states rows older than this are deleted, but each key's newest row.
    cursor_states_retention_s: float = Field(default=604800.0, gt=0)
    #: sync_progress rows older than this are deleted, but each key's newest row.
    sync_progress_retention_s: float = Field(default=2592000.0, gt=0)

    @field_validator("path")
    @classmethod
    def _scheme_fits_backend(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("backend") == "delta-rs" and value.startswith("s3a://"):
            raise _invalid(
                f"{value!r}: delta-rs does not understand s3a:// (a Hadoop scheme); "
                "use s3:// with delta-rs, or backend delta-spark"
            )
        return value

    def table_uri(self, table: str) -> str:
        """The URI of one table (``mappings``, ``cursor_states``, ``sync_progress``) under path."""
        return f"{self.path.rstrip('/')}/{table}"


def _spark_conf_value(value: Any) -> Any:
    """Spark conf values are strings; YAML gives ints and bools, which Spark writes lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


class SparkConfig(_Section):
    """The Spark application that runs the mapping and sync queries."""

    master: str = "local[2]"
    app_name: str = Field(default="cursorsync", min_length=1)
    trigger_interval_s: float = Field(default=10.0, gt=0)
    #: The mapping query's trigger (default: trigger_interval_s). A source ack can be
    #: synced only once its entry is mapped, so a shorter one cuts the sync lag.
    mapping_trigger_interval_s: float | None = Field(default=None, gt=0)
    checkpoint_dir: str = Field(min_length=1)
    conf: dict[str, str] = Field(default_factory=dict)
    max_entries_per_batch: int = Field(default=100_000, ge=1)
    #: Small ranges share a Spark task up to this many entries / ranges (see
    #: cursorsync.mapping.entries.pack_ranges): a task per topic partition does not scale.
    entries_per_task: int = Field(default=10_000, ge=1)
    ranges_per_task: int = Field(default=32, ge=1)

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: _spark_conf_value(v) for k, v in value.items()}
        return value


# --------------------------------------------------------------------------- metrics, logging


class MetricsConfig(_Section):
    """The Prometheus endpoint; port 0 turns it off."""

    port: int = Field(default=0, ge=0, le=65535)
    host: str = Field(default="127.0.0.1", min_length=1)

    @property
    def enabled(self) -> bool:
        return self.port != 0


class LoggingConfig(_Section):
    """Log level and format (``json: true`` for one JSON object per line)."""

    level: LogLevel = "INFO"
    json_format: bool = Field(default=False, alias="json")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


# --------------------------------------------------------------------------- the whole


class Config(_Section):
    """The whole configuration (see conf/production.example.yaml for every key)."""

    clusters: ClustersConfig
    topics: list[TopicSpec] = Field(default_factory=list)
    namespaces: list[NamespaceSpec] = Field(default_factory=list)
    evidence: EvidenceConfig = Field(default_factory=EvidenceConfig)
    emission: EmissionConfig = Field(default_factory=EmissionConfig)
    tables: TablesConfig
    spark: SparkConfig
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _something_to_sync(self) -> Self:
        if not self.topics and not self.namespaces:
            raise _invalid("nothing to sync: give at least one entry in topics or namespaces")
        seen: set[str] = set()
        for spec in self.topics:
            if spec.topic in seen:
                raise _invalid(f"topic {spec.topic!r} is listed twice in topics")
            seen.add(spec.topic)
        return self

    @property
    def source(self) -> ClusterConfig:
        return self.clusters.source

    @property
    def target(self) -> ClusterConfig:
        return self.clusters.target

    def with_cluster(
        self, role: Literal["source", "target"], *, service_url: str, admin_url: str
    ) -> Config:
        """A copy with one cluster's URLs filled in (how the test bed resolves ``embedded``)."""
        if role not in ("source", "target"):
            raise ConfigError(f"{role!r} is not a cluster role. Valid values are: source, target")
        cluster = getattr(self.clusters, role)
        data = {
            **cluster.model_dump(by_alias=True, exclude_none=True),
            "service_url": service_url,
            "admin_url": admin_url,
        }
        try:
            resolved = ClusterConfig.model_validate(data)
        except ValidationError as exc:
            problems = [_describe(e, prefix=("clusters", role)) for e in exc.errors()]
            raise ConfigValidationError("<with_cluster>", problems) from None
        clusters = self.clusters.model_copy(update={role: resolved})
        return self.model_copy(update={"clusters": clusters})

    def require_resolved(self) -> None:
        """Fail, naming the key, if a cluster URL is still the ``embedded`` marker."""
        problems = [
            f"clusters.{role}.{key}: {EMBEDDED!r} is filled in only by the embedded test bed "
            "(cursorsync demo); give a real URL to run against real clusters"
            for role in ("source", "target")
            for key in ("service_url", "admin_url")
            if getattr(getattr(self.clusters, role), key) == EMBEDDED
        ]
        if problems:
            raise ConfigValidationError("<config>", problems)


# --------------------------------------------------------------------------- loading


class ConfigValidationError(ConfigError):
    """Every problem in a config, one line each; ``problems`` holds the lines."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        count = len(self.problems)
        header = f"invalid configuration {source}: {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n".join([header, *(f"  {p}" for p in self.problems)]))


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, expand ``${VARS}`` in, and validate one YAML config file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file not found: {str(file)!r} (conf/embedded.yaml and "
            "conf/production.example.yaml in the source tree are examples)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"config path {str(file)!r} is a directory, not a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(file)!r}: {exc.strerror}") from None
    return load_config_text(text, source=str(file))


def load_config_text(text: str, *, source: str = "<string>") -> Config:
    """Validate YAML text; ``source`` names it in errors."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        what = "; ".join(p for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"{where}: bad YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: bad YAML: {exc}") from None
    if data is None:
        raise ConfigError(f"{source}: the file is empty; expected the sections {_SECTION_LIST}")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections ({_SECTION_LIST}), "
            f"found a {type(data).__name__}"
        )
    return parse_config(data, source=source, lines=_LineFinder(text))


def parse_config(
    data: Mapping[str, Any], *, source: str = "<dict>", lines: _LineFinder | None = None
) -> Config:
    """Validate already-parsed data (after ``${VAR}`` expansion)."""
    env_problems: list[tuple[str, Loc]] = []
    expanded = _expand_env(data, (), env_problems)
    if env_problems:
        raise ConfigValidationError(source, _with_lines(env_problems, lines))
    try:
        return Config.model_validate(expanded)
    except ValidationError as exc:
        problems = [(_describe(err), tuple(err["loc"])) for err in exc.errors()]
        raise ConfigValidationError(source, _with_lines(problems, lines)) from None


_SECTION_LIST = ", ".join(
    (field.alias or name) for name, field in Config.model_fields.items()
)


# --------------------------------------------------------------------------- env vars

_ENV_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any, loc: Loc, problems: list[tuple[str, Loc]]) -> Any:
    if isinstance(value, str):
        return _expand_string(value, loc, problems)
    if isinstance(value, Mapping):
        return {k: _expand_env(v, (*loc, k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, (*loc, i), problems) for i, v in enumerate(value)]
    return value


def _expand_string(text: str, loc: Loc, problems: list[tuple[str, Loc]]) -> str:
    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        found = os.environ.get(name)
        if found is None or (found == "" and default is not None):
            if default is not None:
                return default
            problems.append((
                f"{_format_loc(loc)}: environment variable {name} is not set "
                f"(write ${{{name}:-default}} to give a default)",
                loc,
            ))
            return ""
        return found

    return _ENV_RE.sub(substitute, text)


# --------------------------------------------------------------------------- error lines


def _format_loc(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


#: How a field's values are named in "X is not a valid <noun>" messages.
_NOUNS = {
    "strategies": "evidence strategy",
    "identity_fields": "identity field",
    "subscription_type": "subscription type",
    "rewind_policy": "rewind policy",
    "backend": "table backend",
    "level": "log level",
    "partitioned": "partitioned setting",
}


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the interesting type."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def _field_for(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return name, field.annotation
    return None


def _walk(loc: Sequence[str | int]) -> tuple[type[BaseModel] | None, Any, bool]:
    """(model holding the last key, annotation at loc, whether every key was known)."""
    model: type[BaseModel] | None = Config
    parent: type[BaseModel] | None = None
    annotation: Any = Config
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(part, int):
            args = get_args(annotation)
            annotation = args[0] if get_origin(annotation) is list and args else None
        else:
            model = annotation if isinstance(annotation, type) and issubclass(
                annotation, BaseModel) else None
            if model is None:
                return parent, None, get_origin(annotation) is dict
            parent = model
            found = _field_for(model, part)
            if found is None:
                return parent, None, False
            annotation = found[1]
    return parent, _unwrap(annotation), True


def _valid_keys(model: type[BaseModel]) -> str:
    return ", ".join(sorted((f.alias or n) for n, f in model.model_fields.items()))


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _yaml_word(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def _describe(err: Mapping[str, Any], prefix: Loc = ()) -> str:
    """One line for one pydantic error: the key path, then what is wrong and what is valid."""
    loc = (*prefix, *err["loc"])
    path = _format_loc(loc)
    kind = err["type"]
    given = err.get("input")
    parent, annotation, _ = _walk(loc)
    if kind == "extra_forbidden":
        valid = f". Valid keys are: {_valid_keys(parent)}" if parent is not None else ""
        return f"{path}: unknown key{valid}"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind == "literal_error" and get_origin(annotation) is Literal:
        key = next((p for p in reversed(loc) if isinstance(p, str)), "value")
        noun = _NOUNS.get(key, key.replace("_", " "))
        valid = ", ".join(_yaml_word(a) for a in get_args(annotation))
        return f"{path}: {_show(given)} is not a valid {noun}. Valid values are: {valid}"
    if kind == "cursorsync":
        return f"{path}: {err['msg']}"
    if kind == "too_short" and isinstance(given, list | dict | str):
        return f"{path}: must not be empty"
    if kind in ("model_type", "model_attributes_type"):
        return f"{path}: expected a mapping of keys, got {_show(given)}"
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    msg = msg[:1].lower() + msg[1:]
    msg = msg.replace("input should be", "should be")
    return f"{path}: {msg}, got {_show(given)}"


def _with_lines(problems: Sequence[tuple[str, Loc]], lines: _LineFinder | None) -> list[str]:
    if lines is None:
        return [text for text, _ in problems]
    out = []
    for text, loc in problems:
        line = lines.line_of(loc)
        out.append(f"{text} (line {line})" if line else text)
    return out


class _LineFinder:
    """Maps a key path back to its line in the YAML text (only computed on error)."""

    def __init__(self, text: str) -> None:
        self._text = text

    def line_of(self, loc: Loc) -> int | None:
        try:
            node = yaml.compose(self._text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            return None
        line = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                match = next(((k, v) for k, v in node.value if k.value == part), None)
                if match is None:
                    return line
                line = match[0].start_mark.line + 1
                node = match[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    return line
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line
        return line


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that rejects a key given twice in one mapping (YAML would keep the last)."""


def _construct_unique_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                f"while reading a mapping (first {key!r} on line {seen[key]})",
                node.start_mark,
                f"key {key!r} is given twice",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=True)
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)
