"""Table schemas, loaded from ``schemas/<table>.json``: the single source of truth.

Every backend builds its table from the same file: :meth:`TableSchema.arrow`
for delta-rs and the row checks, :meth:`TableSchema.spark_ddl` for
delta-spark. The file form is documented in ``schemas/README.md``; types are
Spark DDL type names in lower case (``int``, ``long``, ``string``,
``boolean``, ``double``, ``timestamp``, ``array<T>``, ``struct<n:T,...>``).

The directory is ``$CURSORSYNC_SCHEMAS`` if set, else the repository's
``schemas/`` (the package is installed editable, source root ``streaming/``).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc

from cursorsync.errors import ConfigError

TableName = Literal["mappings", "cursor_states", "sync_progress", "halts", "builtin_updates",
                    "mapping_waits"]
TABLES: tuple[TableName, ...] = get_args(TableName)

SCHEMAS_ENV = "CURSORSYNC_SCHEMAS"
#: Columns every table carries (DESIGN.md "Delta tables").
REQUIRED_COLUMNS = (
    "schema_version", "topic_bucket", "topic", "partition",
    "source_cluster", "target_cluster", "batch_id",
)

_PRIMITIVES: dict[str, tuple[pa.DataType, str]] = {
    "int": (pa.int32(), "INT"),
    "long": (pa.int64(), "BIGINT"),
    "string": (pa.string(), "STRING"),
    "boolean": (pa.bool_(), "BOOLEAN"),
    "double": (pa.float64(), "DOUBLE"),
    "timestamp": (pa.timestamp("us", tz="UTC"), "TIMESTAMP"),
}
#: Delta names list elements "element"; using the same name keeps schemas comparable.
_LIST_ITEM = "element"


class TableSchemaError(ConfigError):
    """A schema file is missing or malformed, or a table does not match its schema file."""


def check_table_name(table: str) -> TableName:
    if table not in TABLES:
        raise TableSchemaError(
            f"{table!r} is not a valid table. Valid values are: {', '.join(TABLES)}"
        )
    return table


def schemas_dir() -> Path:
    """Where the schema files are: ``$CURSORSYNC_SCHEMAS``, else the package's own copy
    (``cursorsync/tables/schemas``: in a checkout, a link to the repository's ``schemas/``;
    in an installed wheel, the files themselves)."""
    env = os.environ.get(SCHEMAS_ENV)
    if env:
        path = Path(env)
        if not path.is_dir():
            raise TableSchemaError(f"{SCHEMAS_ENV}={env} is not a directory")
        return path
    path = Path(__file__).resolve().parent / "schemas"
    if not path.is_dir():
        raise TableSchemaError(
            f"no schemas directory at {path}; set {SCHEMAS_ENV} to the directory holding "
            f"{', '.join(t + '.json' for t in TABLES)}"
        )
    return path


# ------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True)
class Field:
    """One top-level column as the schema file states it."""

    name: str
    type: str
    nullable: bool
    doc: str
    #: The only values the column may hold (checked on write); None means any.
    values: tuple[str, ...] | None = None

    @property
    def arrow_type(self) -> pa.DataType:
        return _parse_type(self.type)[0]

    @property
    def spark_type(self) -> str:
        return _parse_type(self.type)[1]


def _parse_type(text: str) -> tuple[pa.DataType, str]:
    """Parse a type string into (arrow type, Spark DDL type)."""
    try:
        arrow, ddl, rest = _parse(text.replace(" ", ""))
    except (IndexError, KeyError, ValueError) as e:
        raise TableSchemaError(f"invalid column type {text!r}: {e}") from None
    if rest:
        raise TableSchemaError(f"invalid column type {text!r}: trailing {rest!r}")
    return arrow, ddl


def _parse(s: str) -> tuple[pa.DataType, str, str]:
    if s.startswith("array<"):
        arrow, ddl, rest = _parse(s[len("array<"):])
        if not rest.startswith(">"):
            raise ValueError("array<...> not closed")
        return pa.list_(pa.field(_LIST_ITEM, arrow, True)), f"ARRAY<{ddl}>", rest[1:]
    if s.startswith("struct<"):
        rest = s[len("struct<"):]
        fields: list[pa.Field] = []
        ddls: list[str] = []
        while True:
            name, sep, rest = rest.partition(":")
            if not sep or not name.isidentifier():
                raise ValueError(f"bad struct field name {name!r}")
            arrow, ddl, rest = _parse(rest)
            fields.append(pa.field(name, arrow, True))
            ddls.append(f"`{name}`: {ddl}")
            if rest.startswith(","):
                rest = rest[1:]
                continue
            if rest.startswith(">"):
                return pa.struct(fields), f"STRUCT<{', '.join(ddls)}>", rest[1:]
            raise ValueError("struct<...> not closed")
    end = len(s)
    for stop in (",", ">"):
        i = s.find(stop)
        if i >= 0:
            end = min(end, i)
    name = s[:end]
    if name not in _PRIMITIVES:
        raise ValueError(
            f"{name!r} is not a valid type. Valid values are: "
            f"{', '.join(_PRIMITIVES)}, array<T>, struct<name:T,...>"
        )
    arrow, ddl = _PRIMITIVES[name]
    return arrow, ddl, s[end:]


# ------------------------------------------------------------------ schema


@dataclass(frozen=True)
class TableSchema:
    """A table's schema file: columns, version, partitioning, topic bucket count."""

    name: TableName
    version: int
    doc: str
    partition_by: tuple[str, ...]
    topic_buckets: int
    fields: tuple[Field, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> TableSchema:
        try:
            fields = tuple(
                Field(
                    f["name"], f["type"], bool(f["nullable"]), f.get("doc", ""),
                    tuple(f["values"]) if f.get("values") is not None else None,
                )
                for f in data["fields"]
            )
            schema = cls(
                name=check_table_name(data["name"]),
                version=int(data["version"]),
                doc=data.get("doc", ""),
                partition_by=tuple(data.get("partition_by", ())),
                topic_buckets=int(data.get("topic_buckets", 1)),
                fields=fields,
            )
        except (KeyError, TypeError) as e:
            raise TableSchemaError(f"{source}: malformed schema file ({e!r})") from None
        schema._validate(source)
        return schema

    def _validate(self, source: str) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise TableSchemaError(f"{source}: duplicate column names in {names}")
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise TableSchemaError(f"{source}: missing required columns {missing}")
        unknown = [c for c in self.partition_by if c not in names]
        if unknown:
            raise TableSchemaError(f"{source}: partition_by names unknown columns {unknown}")
        if "topic" in self.partition_by:
            raise TableSchemaError(
                f"{source}: partitioning by topic makes a directory per topic; "
                "partition by topic_bucket"
            )
        if self.topic_buckets < 1:
            raise TableSchemaError(f"{source}: topic_buckets must be >= 1")
        for f in self.fields:
            _parse_type(f.type)

    @property
    def column_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise TableSchemaError(f"table {self.name} has no column {name!r}")

    def arrow(self) -> pa.Schema:
        """The pyarrow schema every written batch is cast to."""
        return pa.schema(
            [pa.field(f.name, f.arrow_type, f.nullable) for f in self.fields],
            metadata={"cursorsync.table": self.name, "cursorsync.version": str(self.version)},
        )

    def spark_ddl(self) -> str:
        """Column list in Spark DDL, e.g. for ``CREATE TABLE ... (<ddl>) USING delta``."""
        return ", ".join(
            f"`{f.name}` {f.spark_type}{'' if f.nullable else ' NOT NULL'}"
            f" COMMENT {_sql_string(f.doc)}"
            for f in self.fields
        )

    def differences(self, actual: pa.Schema) -> list[str]:
        """How ``actual`` (a stored table's schema) differs from this file; [] when equal."""
        diffs: list[str] = []
        expected = self.arrow()
        if actual.names != expected.names:
            diffs.append(f"columns {actual.names} != {expected.names}")
        for want in expected:
            if want.name not in actual.names:
                continue
            got = actual.field(want.name)
            if not _normalize(got.type).equals(want.type):
                diffs.append(f"{want.name}: type {got.type} != {want.type}")
            if got.nullable != want.nullable:
                diffs.append(f"{want.name}: nullable {got.nullable} != {want.nullable}")
        return diffs


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _normalize(t: pa.DataType) -> pa.DataType:
    """Map the physical variants engines return (large/view strings, list names) to ours."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(pa.field(_LIST_ITEM, _normalize(t.value_type), True))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _normalize(f.type), True) for f in t])
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz.upper() in ("UTC", "+00:00"):
        return pa.timestamp(t.unit, tz="UTC")
    return t


@cache
def _load(directory: str, table: str) -> TableSchema:
    path = Path(directory) / f"{table}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TableSchemaError(f"schema file {path} not found") from None
    except json.JSONDecodeError as e:
        raise TableSchemaError(f"schema file {path} is not valid JSON: {e}") from None
    schema = TableSchema.from_dict(data, source=str(path))
    if schema.name != table:
        raise TableSchemaError(f"{path} declares name {schema.name!r}, expected {table!r}")
    return schema


def load_schema(table: str) -> TableSchema:
    """The schema of ``table`` from its file (cached per directory)."""
    return _load(str(schemas_dir()), check_table_name(table))


# ---------------------------------------------------------------- buckets


def topic_bucket(topic: str, buckets: int) -> int:
    """Stable bucket of a topic: crc32 of its UTF-8 name mod ``buckets`` (same in every process)."""
    return zlib.crc32(topic.encode("utf-8")) % buckets


def topic_buckets(topics: pa.Array | pa.ChunkedArray, buckets: int) -> pa.Array:
    """:func:`topic_bucket` of every element, hashing each distinct topic once."""
    encoded = pc.dictionary_encode(topics)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    codes = pa.array(
        [topic_bucket(t, buckets) for t in encoded.dictionary.to_pylist()], pa.int32()
    )
    return pc.take(codes, encoded.indices)
