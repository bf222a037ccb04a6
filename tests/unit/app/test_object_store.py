"""Object storage, one way for both engines: ``tables.storage_options`` (delta-rs's names)
become Spark's s3a settings, credentials stay in the environment, and the s3a credential
chain is the one delta-rs follows unless someone named another."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cursorsync.app.session import (
    S3A_CREDENTIAL_CHAIN,
    S3A_CREDENTIALS_PROVIDER,
    object_store_conf,
    s3a_conf,
)
from cursorsync.app.settings import ConfigValidationError, parse_config

BASE: dict[str, Any] = {
    "clusters": {
        "source": {"name": "A", "service_url": "pulsar://127.0.0.1:6650",
                   "admin_url": "http://127.0.0.1:8080"},
        "target": {"name": "B", "service_url": "pulsar://127.0.0.1:6651",
                   "admin_url": "http://127.0.0.1:8081"},
    },
    "topics": [{"topic": "persistent://t/ns/orders", "subscriptions": ["billing"]}],
    "tables": {"backend": "delta-spark", "path": "s3a://bucket/tables"},
    "spark": {"checkpoint_dir": "/var/lib/cursorsync/checkpoints", "master": "local[1]"},
}


def config(tables: dict[str, Any] | None = None, spark: dict[str, Any] | None = None) -> Any:
    data = copy.deepcopy(BASE)
    data["tables"].update(tables or {})
    data["spark"].update(spark or {})
    return parse_config(data)


def test_an_endpoint_reaches_s3a_as_delta_rs_reads_it() -> None:
    conf = s3a_conf({"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_REGION": "eu-west-1",
                     "AWS_ALLOW_HTTP": "true"})
    assert conf == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:8333",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        # delta-rs addresses the bucket in the path unless told otherwise
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
    }


def test_option_names_are_case_insensitive_and_aliases_count() -> None:
    conf = s3a_conf({"aws_endpoint": "https://s3.example.com", "aws_default_region": "x",
                     "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "TRUE"})
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://s3.example.com"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "x"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "false"


def test_without_an_endpoint_s3a_keeps_its_own_addressing() -> None:
    assert s3a_conf({}) == {}
    assert s3a_conf({"AWS_REGION": "us-east-2"}) == {
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-2"}


def test_s3a_follows_the_credential_chain_delta_rs_follows() -> None:
    assert object_store_conf(config())[S3A_CREDENTIALS_PROVIDER] == S3A_CREDENTIAL_CHAIN
    assert "WebIdentityTokenFileCredentialsProvider" in S3A_CREDENTIAL_CHAIN
    assert "EnvironmentVariableCredentialsProvider" in S3A_CREDENTIAL_CHAIN


def test_a_provider_named_in_spark_conf_is_left_alone() -> None:
    named = config(spark={"conf": {S3A_CREDENTIALS_PROVIDER: "my.Provider"}})
    assert S3A_CREDENTIALS_PROVIDER not in object_store_conf(named)


@pytest.mark.parametrize("tables", [{"backend": "delta-rs", "path": "s3://bucket/tables"},
                                    {"backend": "delta-spark", "path": "/var/lib/tables"}])
def test_no_s3a_path_no_credential_chain(tables: dict[str, str]) -> None:
    assert S3A_CREDENTIALS_PROVIDER not in object_store_conf(config(tables=tables))


@pytest.mark.parametrize("key", ["AWS_SECRET_ACCESS_KEY", "aws_access_key_id",
                                 "AWS_SESSION_TOKEN", "secret_access_key"])
def test_a_credential_in_storage_options_is_refused_naming_the_environment(key: str) -> None:
    with pytest.raises(ConfigValidationError) as info:
        config(tables={"storage_options": {key: "x"}})
    (problem,) = info.value.problems
    assert key in problem and "AWS_SECRET_ACCESS_KEY" in problem and "environment" in problem
