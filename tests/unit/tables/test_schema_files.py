"""The tables' schema files: well formed, types named, no partitioning by topic, their
directory from the environment, the topic bucket."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from cursorsync.tables import (
    SCHEMAS_ENV,
    TABLES,
    TableSchemaError,
    load_schema,
    schemas_dir,
    topic_bucket,
)
from cursorsync.tables.schema import REQUIRED_COLUMNS, TableSchema, topic_buckets

# ------------------------------------------------------------ schema files


def test_schema_files_are_well_formed() -> None:
    for table in TABLES:
        schema = load_schema(table)
        assert schema.name == table and schema.version >= 1
        names = schema.column_names
        assert set(REQUIRED_COLUMNS) <= set(names)
        assert schema.partition_by == ("topic_bucket",)
        assert 1 <= schema.topic_buckets <= 64
        assert all(f.doc for f in schema.fields), table
        assert schema.arrow().names == names
    ddl = load_schema("cursor_states").spark_ddl()
    assert ("`individually_deleted_ranges` ARRAY<STRUCT<`lo_ledger`: BIGINT, `lo_entry`: BIGINT, "
            "`hi_ledger`: BIGINT, `hi_entry`: BIGINT>> NOT NULL") in ddl
    assert "`observed_at` TIMESTAMP NOT NULL" in ddl
    mapping = load_schema("mappings")
    assert mapping.field("kind").values == ("segment", "skippable", "foreign", "unpaired",
                                             "unreplicated", "anchor", "live")
    assert "COMMENT '\\'segment\\' | " in mapping.spark_ddl()


@pytest.mark.parametrize(("type_text", "message"), [
    ("varchar", "'varchar' is not a valid type. Valid values are: int, long"),
    ("array<long", "not closed"),
    ("struct<a long>", "bad struct field name"),
    ("long>", "trailing"),
])
def test_bad_types_are_named(type_text: str, message: str) -> None:
    doc = json.loads((schemas_dir() / "mappings.json").read_text())
    doc["fields"][-1]["type"] = type_text
    with pytest.raises(TableSchemaError, match=message):
        TableSchema.from_dict(doc)


def test_schema_file_may_not_partition_by_topic() -> None:
    doc = json.loads((schemas_dir() / "mappings.json").read_text())
    doc["partition_by"] = ["topic"]
    with pytest.raises(TableSchemaError, match="directory per topic"):
        TableSchema.from_dict(doc)


def test_schemas_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (schemas_dir() / "mappings.json").is_file()
    monkeypatch.setenv(SCHEMAS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(TableSchemaError, match="CURSORSYNC_SCHEMAS"):
        load_schema("mappings")
    monkeypatch.setenv(SCHEMAS_ENV, str(tmp_path))
    with pytest.raises(TableSchemaError, match=r"mappings\.json not found"):
        load_schema("mappings")
    with pytest.raises(TableSchemaError, match="not a valid table"):
        load_schema("offsets")


def test_topic_bucket_is_stable_crc32() -> None:
    topic = "persistent://t/ns/orders"
    assert topic_bucket(topic, 64) == zlib.crc32(topic.encode()) % 64
    topics = pa.chunked_array([[topic, "b"], ["c", topic]])
    assert topic_buckets(topics, 16).to_pylist() == [
        topic_bucket(t, 16) for t in (topic, "b", "c", topic)]
