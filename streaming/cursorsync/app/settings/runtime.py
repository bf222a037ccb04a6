"""Where the job runs and writes: the Delta tables, Spark, metrics, logging."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Self
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from cursorsync.app.settings.base import LogLevel, TableBackend, _invalid, _Section

#: Credentials are read from the environment by Spark's s3a and delta-rs alike; one given
#: as a storage option would reach delta-rs alone.
_CREDENTIAL_OPTIONS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                       "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN")


class TablesConfig(_Section):
    """Where the Delta tables live and which writer writes them."""

    backend: TableBackend = "delta-rs"
    path: str = Field(min_length=1)
    storage_options: dict[str, str] = Field(default_factory=dict)
    #: How often the job compacts and vacuums its tables and expires old history rows.
    maintenance_interval_s: float = Field(default=3600.0, gt=0)
    #: Each query also compacts its tables after this many of its batches (each adds a
    #: file per table), so the number of files stays bounded between maintenance runs;
    #: 0 compacts only every maintenance_interval_s.
    compact_every_batches: int = Field(default=600, ge=0)
    #: cursor_states rows older than this are deleted, but each key's newest row.
    cursor_states_retention_s: float = Field(default=604800.0, gt=0)
    #: sync_progress rows older than this are deleted, but each key's newest row.
    sync_progress_retention_s: float = Field(default=2592000.0, gt=0)
    #: A cursor that did not change since the previous batch has its cursor_states and
    #: sync_progress rows written again only every this many batches (1: every batch), so
    #: the tables grow with the cursors that move. At most 40: a restart reads the last 50
    #: batches' rows for each cursor's last state.
    unchanged_rows_every_batches: int = Field(default=20, ge=1, le=40)

    @field_validator("path")
    @classmethod
    def _scheme_fits_backend(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("backend") == "delta-rs" and value.startswith("s3a://"):
            raise _invalid(
                f"{value!r}: delta-rs does not understand s3a:// (a Hadoop scheme); "
                "use s3:// with delta-rs, or backend delta-spark"
            )
        return value

    @field_validator("storage_options")
    @classmethod
    def _no_credentials(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key.upper() in _CREDENTIAL_OPTIONS:
                raise _invalid(
                    f"{key!r} is a credential: set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and "
                    "AWS_SESSION_TOKEN) in the environment instead, where Spark's s3a and "
                    "delta-rs both read them"
                )
        return value

    def table_uri(self, table: str) -> str:
        """The URI of one table (``mappings``, ``cursor_states``, ``sync_progress``) under path."""
        return f"{self.path.rstrip('/')}/{table}"


#: A URI's scheme and authority (``s3a://``, ``gs://``, ``abfss://``, ``hdfs://``).
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _local_checkpoint_dir(value: str) -> str:
    """The local path ``spark.checkpoint_dir`` names: itself, or a ``file:`` URI's path.

    Beside Spark's checkpoints the job keeps files it writes with local file calls (the
    mapping builder's state, the stored cursor polls, the wake file) and joins the paths
    as local paths, so a URI of any other scheme is refused."""
    if value[:5].lower() == "file:":
        parts = urlsplit(value)
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path:
            raise _invalid(f"{value!r} is not a local file URI: give a path, as /var/lib/x "
                           "or file:///var/lib/x")
        return path
    if _URI_SCHEME.match(value):
        raise _invalid(
            f"{value!r} is not a local path: the job keeps its mapping builder's state and "
            "the cursor polls it replays there as files, beside Spark's checkpoints. Use a "
            "directory on a persistent volume (a path, or a file:// URI); object storage "
            "is for tables.path")
    return value


def _spark_conf_value(value: Any) -> Any:
    """Spark conf values are strings; YAML gives ints and bools, which Spark writes lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


class SparkConfig(_Section):
    """The Spark application that runs the mapping and sync queries."""

    #: None: the master spark-submit was given when it launched the job (the chart's
    #: SparkApplication, a standalone cluster), else ``local[2]``. A value always wins.
    master: str | None = None
    app_name: str = Field(default="cursorsync", min_length=1)
    trigger_interval_s: float = Field(default=10.0, gt=0)
    #: The mapping query's trigger (default: trigger_interval_s). A source ack can be
    #: synced only once its entry is mapped, so a shorter one cuts the sync lag.
    mapping_trigger_interval_s: float | None = Field(default=None, gt=0)
    #: A local directory (a path, or a ``file:`` URI, kept as its path): the job writes
    #: files of its own there besides Spark's checkpoints.
    checkpoint_dir: str = Field(min_length=1)
    conf: dict[str, str] = Field(default_factory=dict)
    max_entries_per_batch: int = Field(default=100_000, ge=1)
    #: Small ranges share a Spark task up to this many entries / ranges (see
    #: cursorsync.mapping.entries.pack_ranges): a task per topic partition does not scale.
    entries_per_task: int = Field(default=10_000, ge=1)
    ranges_per_task: int = Field(default=128, ge=1)  # the source's DEFAULT_RANGES_PER_TASK
    #: How often the mapping looks for new topics and partitions (a namespace's new
    #: topics, a partition count raised). Until then their acks wait, unmapped.
    topic_discovery_interval_s: float = Field(default=60.0, gt=0)
    #: A source partition's cursors are read (internalStats) when its topic stats show a
    #: change, and at least this often however still they stand; 0: every poll, with no
    #: topic stats asked first.
    cursor_stats_max_age_s: float = Field(default=60.0, ge=0)
    #: Which source partitions' cursors moved is asked of the source brokers' cursorsync
    #: plugin (one request per broker and namespace, streaming/broker-plugin) instead of
    #: their topic stats (one request per topic, a stats read per partition inside the
    #: broker). A broker without the plugin: the topic stats, with a warning. When many
    #: partitions moved, the plugin also gives their cursors (one request per broker and
    #: namespace instead of an internalStats each), and answers the sync's tail checks and
    #: marker lookups (a request per broker, or per partition, instead of a reader per
    #: partition or a raw entry read per entry). On the target, the plugin is asked for
    #: the cursors a sync batch reads and, with ``evidence.holes: probe``, for the probe
    #: cursors (one request per broker and namespace instead of an internalStats per
    #: partition); without it there, one internalStats each, with a warning.
    cursor_digests: bool = False

    @model_validator(mode="after")
    def _digests_need_a_max_age(self) -> Self:
        if self.cursor_digests and not self.cursor_stats_max_age_s:
            raise _invalid("cursor_digests tells which cursors to read again, and "
                             "cursor_stats_max_age_s 0 reads every one every poll: set it "
                             "above 0, or cursor_digests false")
        return self

    @field_validator("checkpoint_dir")
    @classmethod
    def _local(cls, value: str) -> str:
        return _local_checkpoint_dir(value)

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
