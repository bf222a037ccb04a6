"""Config loading: the shipped files load, and every kind of mistake yields one clear line."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cursorsync.app.settings import (
    DEFAULT_SOURCE_POSITION_PROPERTY,
    EMBEDDED,
    EMBEDDED_CONFIG_PATH,
    Config,
    ConfigValidationError,
    NamespaceSpec,
    TlsConfig,
    load_config,
    load_config_text,
    parse_config,
)
from cursorsync.errors import ConfigError
from tests.support.paths import ROOT

CONF = ROOT / "conf"

MINIMAL: dict[str, Any] = {
    "clusters": {
        "source": {"name": "A", "service_url": "pulsar://127.0.0.1:6650",
                   "admin_url": "http://127.0.0.1:8080"},
        "target": {"name": "B", "service_url": "pulsar://127.0.0.1:6651",
                   "admin_url": "http://127.0.0.1:8081"},
    },
    "topics": [{"topic": "persistent://t/ns/orders", "subscriptions": ["billing"]}],
    "tables": {"path": "/tmp/cursorsync/tables"},
    "spark": {"checkpoint_dir": "/tmp/cursorsync/checkpoints"},
}


def problems_of(data: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ConfigValidationError) as info:
        parse_config(data)
    return info.value.problems


def with_change(path: str, value: Any) -> dict[str, Any]:
    """MINIMAL with one dotted key set (list items as numbers)."""
    data = copy.deepcopy(MINIMAL)
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[last] = value
    return data


# --------------------------------------------------------------------------- shipped files


def test_embedded_config_loads_with_embedded_markers() -> None:
    config = load_config(CONF / "embedded.yaml")
    assert EMBEDDED_CONFIG_PATH.read_text() == (CONF / "embedded.yaml").read_text()
    assert config.source.name == "a" and config.target.name == "b"
    assert config.source.is_embedded and config.target.is_embedded
    assert config.tables.backend == "delta-rs"
    assert config.spark.trigger_interval_s == 1
    assert config.emission.dry_run is False
    assert config.spark.conf["spark.ui.enabled"] == "false"  # YAML bool -> Spark string
    with pytest.raises(ConfigValidationError) as info:
        config.require_resolved()
    assert len(info.value.problems) == 4
    assert info.value.problems[0].startswith("clusters.source.service_url: 'embedded'")


def test_embedded_work_dir_comes_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CURSORSYNC_WORK_DIR", "/srv/work")
    config = load_config(CONF / "embedded.yaml")
    assert config.tables.path == "/srv/work/tables"
    assert config.spark.checkpoint_dir == "/srv/work/checkpoints"
    monkeypatch.delenv("CURSORSYNC_WORK_DIR")
    assert load_config(CONF / "embedded.yaml").tables.path == ".cursorsync-work/tables"


def test_the_test_bed_fills_in_embedded_urls() -> None:
    config = load_config(CONF / "embedded.yaml")
    config = config.with_cluster(
        "source", service_url="pulsar://127.0.0.1:40001", admin_url="http://127.0.0.1:40002/"
    )
    config = config.with_cluster(
        "target", service_url="pulsar://127.0.0.1:40003", admin_url="http://127.0.0.1:40004"
    )
    config.require_resolved()
    assert config.source.admin_url == "http://127.0.0.1:40002"
    assert config.target.service_url == "pulsar://127.0.0.1:40003"
    with pytest.raises(ConfigValidationError) as info:
        config.with_cluster("target", service_url="tcp://x", admin_url="http://x")
    assert info.value.problems[0].startswith("clusters.target.service_url: 'tcp://x'")


def test_production_example_loads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PULSAR_US_EAST_TOKEN", "secret-token")
    config = load_config(CONF / "production.example.yaml")
    assert config.source.auth.resolve_token() == "secret-token"
    assert "secret-token" not in repr(config)  # secrets stay out of logs
    assert config.source.auth.tls is not None and config.source.auth.tls.cert_file
    assert config.target.auth.token_file == "/var/run/secrets/pulsar-us-west/token"
    assert config.emission.subscription_type == "Shared"
    assert config.emission.mode == "individual" and not config.emission.cumulative
    assert config.tables.backend == "delta-spark"
    assert config.tables.path.startswith("s3a://")
    assert config.metrics.port == 9108 and config.metrics.enabled
    assert config.evidence.strategies == ["position-property", "identity"]
    assert config.namespaces[0].matches("persistent://orders/prod/order-events-eu-partition-3")
    assert not config.namespaces[0].matches("persistent://orders/prod/returns")
    assert config.logging.json_format is True
    assert config.spark.conf["spark.sql.shuffle.partitions"] == "8"


def test_production_example_documents_every_key() -> None:
    """The example is the reference: every field of every section appears in it."""
    text = (CONF / "production.example.yaml").read_text()

    def keys(model: type[Any]) -> set[str]:
        out = set()
        for name, field in model.model_fields.items():
            out.add(field.alias or name)
            annotation = field.annotation
            for arg in (annotation, *getattr(annotation, "__args__", ())):
                if isinstance(arg, type) and hasattr(arg, "model_fields"):
                    out |= keys(arg)
        return out

    missing = sorted(k for k in keys(Config) if f"{k}:" not in text)
    assert missing == []


def test_spark_defaults_file_is_key_value_lines() -> None:
    lines = (CONF / "spark-defaults.conf").read_text().splitlines()
    settings = dict(
        line.split(None, 1) for line in lines if line.strip() and not line.startswith("#")
    )
    assert settings["spark.master"] == "local[2]"
    assert all(key.startswith("spark.") for key in settings)
    commented = "\n".join(line for line in lines if line.startswith("#"))
    assert "io.delta.sql.DeltaSparkSessionExtension" in commented
    assert "org.apache.spark.metrics.sink.PrometheusServlet" in commented


# --------------------------------------------------------------------------- defaults


def test_minimal_config_gets_documented_defaults() -> None:
    config = parse_config(MINIMAL)
    assert config.evidence.source_position_property == DEFAULT_SOURCE_POSITION_PROPERTY
    assert config.emission.mode == "cumulative-where-allowed"
    assert config.emission.subscription_type == "Shared"
    assert config.emission.rewind_policy == "halt"
    assert config.tables.backend == "delta-rs"
    assert config.tables.table_uri("mappings") == "/tmp/cursorsync/tables/mappings"
    assert config.metrics.port == 0 and not config.metrics.enabled
    assert config.tables.maintenance_interval_s == 3600.0
    assert config.tables.cursor_states_retention_s == 7 * 86400.0
    assert config.tables.sync_progress_retention_s == 30 * 86400.0
    assert config.logging.level == "INFO"


def test_master_is_spark_submits_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    from cursorsync.app.session import master_of

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert parse_config(MINIMAL).spark.master is None
    assert master_of(parse_config(MINIMAL)) == "local[2]"
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")  # what spark-submit's driver sees
    assert master_of(parse_config(MINIMAL)) is None
    configured = parse_config(with_change("spark.master", "spark://10.0.0.1:7077"))
    assert master_of(configured) == "spark://10.0.0.1:7077"


def test_a_local_masters_workers_run_the_drivers_interpreter() -> None:
    from cursorsync.app.session import local_worker_python

    assert local_worker_python("local[2]", {}) == sys.executable
    assert local_worker_python("local", {"PYSPARK_PYTHON": ""}) == sys.executable
    # Chosen already, or workers on other machines (where this path means nothing).
    assert local_worker_python("local[2]", {"PYSPARK_PYTHON": "/opt/py/bin/python"}) is None
    assert local_worker_python("spark://10.0.0.1:7077", {}) is None
    assert local_worker_python(None, {}) is None


def test_cumulative_only_where_the_broker_allows_it() -> None:
    for sub_type, expected in [("Exclusive", True), ("Failover", True),
                               ("Shared", False), ("Key_Shared", False)]:
        config = parse_config(with_change("emission.subscription_type", sub_type))
        assert config.emission.cumulative is expected


def test_config_is_immutable() -> None:
    config = parse_config(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        config.emission.dry_run = True


# --------------------------------------------------------------------------- one line per error


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("emission.mode", "fast",
         "emission.mode: 'fast' is not a valid mode. "
         "Valid values are: cumulative-where-allowed, individual"),
        ("emission.subscription_type", "shared",
         "emission.subscription_type: 'shared' is not a valid subscription type. "
         "Valid values are: Exclusive, Failover, Shared, Key_Shared"),
        ("emission.rewind_policy", "ignore",
         "emission.rewind_policy: 'ignore' is not a valid rewind policy. "
         "Valid values are: halt, report"),
        ("evidence.strategies", ["identity", "magic"],
         "evidence.strategies[1]: 'magic' is not a valid evidence strategy. "
         "Valid values are: position-property, identity, snapshot"),
        ("evidence.strategies", ["identity", "identity"],
         "evidence.strategies: identity listed more than once"),
        ("evidence.strategies", [], "evidence.strategies: must not be empty"),
        ("evidence.identity_fields", ["sequence_id"],
         "evidence.identity_fields[0]: 'sequence_id' is not a valid identity field. Valid values "
         "are: producer_name, publish_time, event_time, partition_key, ordering_key, "
         "properties, payload"),
        ("evidence.identity_fields", ["producer_name", "payload"],
         "evidence: identity_fields must include publish_time with identity evidence "
         "(entries with one digest then share a publish time, which keeps what alignment "
         "remembers of each producer small)"),
        ("evidence.alignment_window", 0,
         "evidence.alignment_window: should be greater than or equal to 1, got 0"),
        ("tables.backend", "parquet",
         "tables.backend: 'parquet' is not a valid table backend. "
         "Valid values are: delta-rs, delta-spark"),
        ("tables.path", "s3a://bucket/t",
         "tables.path: 's3a://bucket/t': delta-rs does not understand s3a:// (a Hadoop scheme); "
         "use s3:// with delta-rs, or backend delta-spark"),
        ("tables.maintenance_interval_s", 0,
         "tables.maintenance_interval_s: should be greater than 0, got 0"),
        ("spark.checkpoint_dir", "s3a://bucket/checkpoints",
         "spark.checkpoint_dir: 's3a://bucket/checkpoints' is not a local path: the job keeps "
         "its mapping builder's state and the cursor polls it replays there as files, beside "
         "Spark's checkpoints. Use a directory on a persistent volume (a path, or a file:// "
         "URI); object storage is for tables.path"),
        ("spark.checkpoint_dir", "gs://bucket/checkpoints",
         "spark.checkpoint_dir: 'gs://bucket/checkpoints' is not a local path: the job keeps "
         "its mapping builder's state and the cursor polls it replays there as files, beside "
         "Spark's checkpoints. Use a directory on a persistent volume (a path, or a file:// "
         "URI); object storage is for tables.path"),
        ("spark.checkpoint_dir", "file://storage-host/checkpoints",
         "spark.checkpoint_dir: 'file://storage-host/checkpoints' is not a local file URI: "
         "give a path, as /var/lib/x or file:///var/lib/x"),
        ("tables.cursor_states_retention_s", -1,
         "tables.cursor_states_retention_s: should be greater than 0, got -1"),
        ("topics.0.topic", "orders",
         "topics[0].topic: 'orders' is not a full topic name. "
         "Expected persistent://tenant/namespace/topic"),
        ("topics.0.topic", "non-persistent://t/ns/x",
         "topics[0].topic: 'non-persistent://t/ns/x' is non-persistent: "
         "only persistent topics have cursors"),
        ("topics.0.subscriptions", ["pulsar.repl.B"],
         "topics[0].subscriptions: 'pulsar.repl.B' is a replicator cursor, not a subscription "
         "(names starting with 'pulsar.repl.' are reserved)"),
        ("topics.0.subscriptions", ["cursorsync-mapping-source"],
         "topics[0].subscriptions: 'cursorsync-mapping-source' is one of cursorsync's own "
         "subscriptions, not one to sync (names starting with 'cursorsync-mapping' or "
         "'cursorsync-probe' are reserved)"),
        ("topics.0.subscriptions", ["cursorsync-probe"],
         "topics[0].subscriptions: 'cursorsync-probe' is one of cursorsync's own "
         "subscriptions, not one to sync (names starting with 'cursorsync-mapping' or "
         "'cursorsync-probe' are reserved)"),
        ("topics.0.subscriptions", ["a", "a"],
         "topics[0].subscriptions: subscription 'a' is listed twice"),
        ("clusters.source.service_url", "http://x:6650",
         "clusters.source.service_url: 'http://x:6650' is not a valid service URL. "
         "Valid forms are: pulsar://host:port, pulsar+ssl://host:port, embedded"),
        ("clusters.target.admin_url", "pulsar://x",
         "clusters.target.admin_url: 'pulsar://x' is not a valid admin URL. "
         "Valid forms are: http://host:port, https://host:port, embedded"),
        ("clusters.source.request_timeout_s", -1,
         "clusters.source.request_timeout_s: should be greater than 0, got -1"),
        ("clusters.source.max_concurrency", "lots",
         "clusters.source.max_concurrency: should be a valid integer, "
         "unable to parse string as an integer, got 'lots'"),
        ("clusters.target.name", "A",
         "clusters: source and target have the same name 'A'; "
         "they must be the two different clusters of the replication"),
        ("clusters.source.auth", {"token": "t", "token_file": "/f"},
         "clusters.source.auth: give either token or token_file, not both"),
        ("clusters.source.auth", {"tls": {"cert_file": "/c"}},
         "clusters.source.auth.tls: cert_file and key_file must be given together (mutual TLS)"),
        ("metrics.port", 70000, "metrics.port: should be less than or equal to 65535, got 70000"),
        ("logging.level", "loud",
         "logging.level: 'LOUD' is not a valid log level. "
         "Valid values are: DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("logging.json", "perhaps",
         "logging.json: should be a valid boolean, unable to interpret input, got 'perhaps'"),
        ("spark", "fast", "spark: expected a mapping of keys, got 'fast'"),
        ("spark.conf", {"spark.x": [1]},
         "spark.conf.spark.x: should be a valid string, got a list"),
        ("namespaces", [{"namespace": "t", "regex": "(", "subscriptions": ["s"]}],
         "namespaces[0].namespace: 't' is not a namespace. Expected tenant/namespace"),
    ],
)
def test_each_bad_value_yields_its_line(path: str, value: Any, expected: str) -> None:
    problems = problems_of(with_change(path, value))
    assert expected in problems
    assert all("\n" not in p for p in problems)


@pytest.mark.parametrize(("value", "path"), [
    ("file:///var/lib/cursorsync/checkpoints", "/var/lib/cursorsync/checkpoints"),
    ("file://localhost/var/lib/cursorsync/checkpoints", "/var/lib/cursorsync/checkpoints"),
    ("FILE:/var/lib/cursor%20sync", "/var/lib/cursor sync"),
    ("/var/lib/cursorsync/checkpoints", "/var/lib/cursorsync/checkpoints"),
])
def test_a_file_uri_checkpoint_dir_is_its_local_path(value: str, path: str) -> None:
    """Every user of checkpoint_dir (the queries, the builder's state, retire) joins
    local paths onto it, so the config holds the path itself."""
    config = parse_config(with_change("spark.checkpoint_dir", value))
    assert config.spark.checkpoint_dir == path


def test_a_relative_checkpoint_dir_stays_relative_to_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cursorsync.app.spark_checkpoint import filesystem

    config = parse_config(with_change("spark.checkpoint_dir", "work/checkpoints"))
    assert config.spark.checkpoint_dir == "work/checkpoints"
    monkeypatch.chdir(tmp_path)
    _, resolved = filesystem(config.spark.checkpoint_dir)
    assert resolved == str(tmp_path / "work" / "checkpoints")


def test_missing_keys_are_named() -> None:
    data = copy.deepcopy(MINIMAL)
    del data["clusters"]["target"]["name"]
    del data["tables"]
    assert problems_of(data) == (
        "clusters.target.name: required key is missing",
        "tables: required key is missing",
    )


def test_nothing_to_sync() -> None:
    data = copy.deepcopy(MINIMAL)
    data["topics"] = []
    assert problems_of(data) == (
        "(top level): nothing to sync: give at least one entry in topics or namespaces",
    )


def test_bad_namespace_regex() -> None:
    problems = problems_of(with_change(
        "namespaces", [{"namespace": "t/ns", "regex": "(", "subscriptions": ["s"]}]
    ))
    assert problems == (
        "namespaces[0].regex: '(' is not a valid regular expression: "
        "missing ), unterminated subpattern at position 0",
    )
    huge = problems_of(with_change(
        "namespaces", [{"namespace": "t/ns", "regex": "a{4294967296}", "subscriptions": ["s"]}]
    ))
    assert huge == ("namespaces[0].regex: 'a{4294967296}' is not a valid regular expression: "
                    "too large or nested too deeply",)


@pytest.mark.parametrize(
    ("path", "valid"),
    [
        ("colour", "clusters, emission, evidence, logging, metrics, namespaces, spark, tables, "
                   "topics"),
        ("clusters.colour", "source, target"),
        ("clusters.source.colour",
         "admin_url, auth, kept_readers, max_concurrency, name, receiver_queue_size, "
         "request_timeout_s, service_url"),
        ("clusters.target.auth.colour", "tls, token, token_file"),
        ("clusters.target.auth.tls.colour", "allow_insecure, ca_file, cert_file, key_file"),
        ("topics.0.colour", "subscriptions, topic"),
        ("namespaces.0.colour", "namespace, regex, subscriptions"),
        ("evidence.colour",
         "alignment_window, holes, identity_fields, identity_scope, source_position_property, "
         "strategies, topology_check_interval_s"),
        ("emission.colour", "ack_batch_size, batch_index_acks, dry_run, first_plans_per_batch, "
                            "mode, rewind_policy, spread_across_executors, subscription_type"),
        ("tables.colour", "backend, compact_every_batches, cursor_states_retention_s, "
                          "maintenance_interval_s, path, storage_options, "
                          "sync_progress_retention_s, unchanged_rows_every_batches"),
        ("spark.colour", "app_name, checkpoint_dir, conf, cursor_digests, cursor_stats_max_age_s, "
                         "entries_per_task, "
                         "mapping_trigger_interval_s, master, max_entries_per_batch, "
                         "ranges_per_task, topic_discovery_interval_s, trigger_interval_s"),
        ("metrics.colour", "host, port"),
        ("logging.colour", "json, level"),
    ],
)
def test_unknown_keys_rejected_at_every_level(path: str, valid: str) -> None:
    data = copy.deepcopy(MINIMAL)
    data["namespaces"] = [{"namespace": "t/ns", "subscriptions": ["s"]}]
    data["clusters"]["target"]["auth"] = {"tls": {}}
    node: Any = data
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[last] = "red"
    assert problems_of(data) == (f"{path.replace('.0.', '[0].')}: unknown key. "
                                 f"Valid keys are: {valid}",)


def test_every_problem_reported_at_once_with_its_yaml_line(tmp_path: Path) -> None:
    data = with_change("emission.mode", "fast")
    data["clusters"]["source"]["colour"] = "red"
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as info:
        load_config(file)
    message = str(info.value)
    assert message.splitlines()[0] == f"invalid configuration {file}: 2 problems"
    lines = file.read_text().splitlines()
    colour_line = next(i for i, text in enumerate(lines, 1) if "colour" in text)
    mode_line = next(i for i, text in enumerate(lines, 1) if "mode:" in text)
    assert f"  clusters.source.colour: unknown key. Valid keys are: admin_url, auth, " \
           f"kept_readers, max_concurrency, name, receiver_queue_size, request_timeout_s, " \
           f"service_url " \
           f"(line {colour_line})" in message
    assert f"emission.mode: 'fast' is not a valid mode. Valid values are: " \
           f"cumulative-where-allowed, individual (line {mode_line})" in message
    assert "pydantic" not in message and "Traceback" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


# --------------------------------------------------------------------------- environment


def test_env_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CS_TOKEN", "s3cr3t")
    monkeypatch.setenv("CS_EMPTY", "")
    monkeypatch.delenv("CS_UNSET", raising=False)
    data = with_change("clusters.source.auth", {"token": "${CS_TOKEN}"})
    data["tables"]["path"] = "${CS_UNSET:-/data}/${CS_EMPTY:-t}"
    data["namespaces"] = [{"namespace": "t/ns", "regex": "a$$b|c$", "subscriptions": ["s"]}]
    config = parse_config(data)
    assert config.source.auth.resolve_token() == "s3cr3t"
    assert config.tables.path == "/data/t"
    assert config.namespaces[0].regex == "a$b|c$"


def test_unset_env_var_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CS_UNSET", raising=False)
    problems = problems_of(with_change("clusters.target.auth", {"token": "${CS_UNSET}"}))
    assert problems == (
        "clusters.target.auth.token: environment variable CS_UNSET is not set "
        "(write ${CS_UNSET:-default} to give a default)",
    )


def test_empty_env_var_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable set to the empty string is no token: refused as an unset one is, unless
    the reference gives a default (``${NAME:-}`` allows empty on purpose)."""
    monkeypatch.setenv("CS_EMPTY", "")
    problems = problems_of(with_change("clusters.target.auth", {"token": "${CS_EMPTY}"}))
    assert problems == (
        "clusters.target.auth.token: environment variable CS_EMPTY is set but empty "
        "(write ${CS_EMPTY:-default} to give a default)",
    )
    config = parse_config(with_change("spark.app_name", "cs${CS_EMPTY:-}"))
    assert config.spark.app_name == "cs"


def test_env_value_cannot_change_structure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CS_EVIL", "x\nspark: {}")
    config = parse_config(with_change("spark.app_name", "${CS_EVIL}"))
    assert config.spark.app_name == "x\nspark: {}"


def test_token_file_read_at_use(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    config = parse_config(with_change("clusters.source.auth", {"token_file": str(token)}))
    assert config.source.auth.resolve_token() == "first"
    token.write_text("rotated\n")
    assert config.source.auth.resolve_token() == "rotated"
    token.unlink()
    with pytest.raises(ConfigError, match=r"auth\.token_file: cannot read"):
        config.source.auth.resolve_token()


# --------------------------------------------------------------------------- files and YAML


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file not found: '.*nope\.yaml'"):
        load_config(tmp_path / "nope.yaml")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clusters:\n  source: [1\n", r"^c\.yaml:3:1: bad YAML: while parsing a flow sequence"),
        ("a: b: c\n", r"^c\.yaml:1:5: bad YAML: mapping values are not allowed here$"),
        ("spark: {}\nspark: {}\n", r"^c\.yaml:2:1: bad YAML: .*key 'spark' is given twice$"),
        ("", r"^c\.yaml: the file is empty"),
        ("- 1\n", r"^c\.yaml: the top level must be a mapping of sections .*found a list$"),
    ],
)
def test_bad_yaml_names_line_and_column(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        load_config_text(text, source="c.yaml")
    assert "\n" not in str(info.value)


def test_namespace_matching() -> None:
    spec = NamespaceSpec(namespace="t/ns", regex="orders-.*", subscriptions=["s"])
    assert spec.matches("persistent://t/ns/orders-eu")
    assert spec.matches("persistent://t/ns/orders-eu-partition-0")
    assert not spec.matches("persistent://t/ns/returns")
    assert not spec.matches("persistent://t/other/orders-eu")
    assert not spec.matches("persistent://t/ns/xorders-eu")  # full match, not search
    assert EMBEDDED == "embedded"


def test_with_cluster_keeps_auth_and_the_other_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSAR_US_EAST_TOKEN", "tok")
    config = load_config(CONF / "production.example.yaml")
    moved = config.with_cluster(
        "source", service_url="pulsar://127.0.0.1:1", admin_url="http://127.0.0.1:2"
    )
    assert moved.source.auth.resolve_token() == "tok"
    assert moved.source.auth.tls == config.source.auth.tls
    assert moved.target == config.target and moved.topics == config.topics
    with pytest.raises(ConfigError, match="'middle' is not a cluster role"):
        config.with_cluster("middle", service_url="x", admin_url="y")  # type: ignore[arg-type]


def test_config_identity_fields_are_the_digest_fields() -> None:
    # The config's Literal spells out the fields the digest knows (a Literal cannot be
    # derived from a tuple for the type checker); they must not drift apart.
    from typing import get_args

    from cursorsync.app.settings import IdentityField
    from cursorsync.core.identity import DEFAULT_IDENTITY_FIELDS

    assert get_args(IdentityField) == DEFAULT_IDENTITY_FIELDS


def test_holes_default_is_verified_and_nothing_claims_skipped_ids_unchecked() -> None:
    """verified: claims checked markers; unacked: claims nothing. Claiming every skipped id
    unchecked (a chunk acked on the target loses its message) is not a setting."""
    default = parse_config(MINIMAL).evidence
    assert default.holes == "verified" and default.claims_holes
    none = parse_config(with_change("evidence.holes", "unacked")).evidence
    assert not none.claims_holes
    assert any("evidence.holes" in p for p in problems_of(with_change("evidence.holes", "markers")))
    assert any("evidence.holes" in p for p in problems_of(with_change("evidence.holes", "guess")))


# --------------------------------------------------------------------------- TLS files


@pytest.fixture(scope="module")
def pem_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its unencrypted key, made by openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("pem")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=cursorsync-test", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_files_that_work_pass(pem_pair: tuple[Path, Path]) -> None:
    cert, key = pem_pair
    TlsConfig(ca_file=str(cert), cert_file=str(cert), key_file=str(key)).check_files("a")
    TlsConfig(allow_insecure=True).check_files("a")


def test_tls_files_that_do_not_are_named(pem_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The TLS libraries say "No such file or directory" or "PEM lib", naming nothing."""
    cert, key = pem_pair
    missing = str(tmp_path / "ca.pem")
    cases = [
        (TlsConfig(ca_file=missing),
         f"cluster b: auth.tls.ca_file: cannot read '{missing}': No such file or directory"),
        (TlsConfig(cert_file=str(cert), key_file=str(tmp_path)),
         f"cluster b: auth.tls.key_file: cannot read '{tmp_path}': Is a directory"),
        (TlsConfig(ca_file=str(key)),
         f"cluster b: auth.tls.ca_file: '{key}' holds no PEM certificate ("),
        (TlsConfig(cert_file=str(cert), key_file=str(cert)),
         f"cluster b: auth.tls.cert_file, key_file: '{cert}' and '{cert}' are not a PEM "
         "certificate and its private key, unencrypted ("),
    ]
    for tls, message in cases:
        with pytest.raises(ConfigError) as info:
            tls.check_files("b")
        assert str(info.value).startswith(message), str(info.value)


def test_a_missing_tls_file_fails_the_connection_settings(tmp_path: Path) -> None:
    """Every client and admin client is configured through app.connect, so each names it."""
    from cursorsync.app.connect import admin_config, client_settings

    missing = tmp_path / "client.pem"
    config = parse_config(with_change("clusters.target.auth", {"tls": {
        "cert_file": str(missing), "key_file": str(missing)}}))
    for settings in (admin_config, client_settings):
        with pytest.raises(ConfigError, match=rf"cluster B: auth\.tls\.cert_file: cannot read "
                                              rf"'{re.escape(str(missing))}'"):
            settings(config.target)


def test_each_cluster_s_kept_readers_reach_its_entries_stream() -> None:
    from cursorsync.app.streams import entries_stream

    class Spark:
        """Enough of a SparkSession to record a stream's options."""

        def __init__(self) -> None:
            self.readStream, self.opts = self, {}

        def format(self, _name: str) -> Spark:
            return self

        def options(self, **opts: str) -> Spark:
            self.opts = opts
            return self

        def load(self) -> dict[str, str]:
            return self.opts

    config = load_config(CONF / "embedded.yaml")
    for side in ("source", "target"):
        config = config.with_cluster(side, service_url="pulsar://127.0.0.1:6650",
                                     admin_url="http://127.0.0.1:8080")
    data = config.model_dump(mode="json", by_alias=True)
    data["clusters"]["target"]["kept_readers"] = 0
    assert entries_stream(Spark(), config, "source")["keptReaders"] == "2048"
    assert entries_stream(Spark(), parse_config(data), "target")["keptReaders"] == "0"
    with pytest.raises(ConfigValidationError, match="kept_readers"):
        data["clusters"]["target"]["kept_readers"] = -1
        parse_config(data)


def test_the_task_packing_defaults_are_the_entries_sources() -> None:
    """A job without ``spark.entries_per_task`` / ``ranges_per_task`` packs its ranges as the
    ``pulsar-entries`` source does by default."""
    from cursorsync.app.settings.runtime import SparkConfig
    from cursorsync.mapping.entries_options import (
        DEFAULT_ENTRIES_PER_TASK,
        DEFAULT_RANGES_PER_TASK,
    )

    fields = SparkConfig.model_fields
    assert fields["entries_per_task"].default == DEFAULT_ENTRIES_PER_TASK
    assert fields["ranges_per_task"].default == DEFAULT_RANGES_PER_TASK
