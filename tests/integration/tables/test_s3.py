"""The job's tables on object storage: a real S3 API on loopback (SeaweedFS), the jars the
image carries, the credentials the one documented way.

The jars are helm/image/fetch_jars.py's output (the image's jar step) run into a clean
folder from the Maven repository the test bed fetched into; the job's Spark gets that
folder and nothing else. Credentials are the standard AWS environment variables, read by
Spark's s3a and by delta-rs; the endpoint is in ``tables.storage_options``, which the job
also gives Spark's s3a. The server knows one identity: a wrong secret is refused, so a
job that writes and a ``status`` that reads prove the credentials reached both engines.
Each job runs on the real test bed until b's cursor caught up with a's, then
``cursorsync status`` (a process of its own, no Spark) reads the tables from S3. The
checkpoints stay local, as the config requires: the job keeps its builder state and stored
polls beside them with local file calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cursorsync.app.settings import Config, parse_config
from cursorsync.app.status import subscription_status
from cursorsync.tables import open_reader
from cursorsync_devtools.demo import demo_config
from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.delta_jars import ensure_delta_jars
from cursorsync_devtools.testbed.distribution import SetupError, maven_repository
from cursorsync_devtools.testbed.s3a_jars import ensure_s3a_jars
from tests.support.job_on_bed import (
    SUB,
    consumer_on_a,
    last_data_entry,
    mark_delete,
    running,
    send_and_ack,
    shared_topic,
)
from tests.support.paths import ROOT
from tests.support.seaweedfs import S3Server, seaweedfs_s3
from tests.support.spark_jvm import shut_down_jvm
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BUCKET = "cursorsync"
IMAGE = ROOT / "helm" / "image"


@pytest.fixture(scope="module")
def image_jars(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image's jar step (fetch_jars.py, as the Dockerfile runs it) into a clean folder,
    from the local Maven repository instead of Maven Central: ``spark.jars``."""
    try:
        ensure_delta_jars()
        ensure_s3a_jars()
    except SetupError as err:
        pytest.fail(f"jars: {err}", pytrace=False)
    dest = tmp_path_factory.mktemp("image-jars")
    done = subprocess.run(
        [sys.executable, str(IMAGE / "fetch_jars.py"), str(IMAGE / "jars.txt"), str(dest),
         "--maven", maven_repository().as_uri()],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return ",".join(str(p) for p in sorted(dest.glob("*.jar")))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS's S3 gateway with the bucket, and its credentials in the environment."""
    with seaweedfs_s3(tmp_path_factory.mktemp("s3")) as server:
        server.create_bucket(BUCKET)
        saved = {k: os.environ.get(k) for k in server.credentials_env()}
        os.environ.update(server.credentials_env())
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def own_jvm() -> Iterator[None]:
    """A JVM of the test's own: the job's session fixes its classpath and s3a settings."""
    shut_down_jvm()
    try:
        yield
    finally:
        shut_down_jvm()


def s3_config(bed: TestBed, work_dir: Path, topic: str, s3: S3Server, *, backend: str,
              tables: str, checkpoints: str, jars: str) -> Config:
    """The test bed's config for ``topic`` with its state on S3 and the endpoint in
    ``tables.storage_options`` (no credentials: the environment holds them)."""
    cfg = demo_config(bed, work_dir, topics=[topic], subscriptions=[SUB], backend=backend,
                      spark_conf={"spark.jars": jars,
                                  "spark.databricks.delta.snapshotPartitions": "1"})
    data = cfg.model_dump(mode="json", by_alias=True)
    data["topics"] = [{"topic": topic, "subscriptions": [SUB]}]
    data["tables"]["path"] = tables
    data["tables"]["storage_options"] = {"AWS_ENDPOINT_URL": s3.endpoint,
                                         "AWS_ALLOW_HTTP": "true", "AWS_REGION": s3.region}
    data["spark"]["checkpoint_dir"] = checkpoints
    return parse_config(data)


def sync_once(bed: TestBed, config: Config, topic: str) -> None:
    """Acks on a, the job running until b's cursor is where a's is and the sync has
    recorded an exact plan for it (the batch that acked writes its rows after its acks)."""
    consumer = consumer_on_a(bed, topic)
    send_and_ack(bed, topic, consumer, 30)
    consumer.close()
    want = mark_delete(bed, "a", topic, SUB)
    store = open_reader(config.tables.path, storage_options=dict(config.tables.storage_options))
    with running(config):
        wait_for(f"b's {SUB} on {topic} at {last_data_entry(bed, topic)} (a's at {want})",
                 lambda: mark_delete(bed, "b", topic, SUB) >= last_data_entry(bed, topic),
                 timeout_s=300)
        wait_for(f"an exact sync of {topic} recorded in {config.tables.path}",
                 lambda: [r.outcome for r in subscription_status(store, topic=topic)] == ["exact"],
                 timeout_s=120)


def status(config: Config, work_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``cursorsync status --json`` as an operator runs it: its own process, no Spark."""
    path = work_dir / "status.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True)))
    return subprocess.run([sys.executable, "-m", "cursorsync", "status", "-c", str(path),
                           "--json"], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env}, check=False)


def check_status(config: Config, work_dir: Path, s3: S3Server, topic: str) -> dict[str, Any]:
    """status reads the job's rows from S3 with the environment's credentials, and is
    refused with a wrong secret."""
    done = status(config, work_dir, {})
    assert done.returncode == 0, done.stderr
    rows = [r for r in json.loads(done.stdout)["partitions"] if r["topic"] == topic]
    assert rows and all(r["outcome"] == "exact" for r in rows), rows
    refused = status(config, work_dir, {"AWS_SECRET_ACCESS_KEY": s3.secret_key + "-wrong"})
    assert refused.returncode != 0 and "403 Forbidden" in refused.stderr, refused.stderr
    row: dict[str, Any] = rows[0]
    return row


def test_delta_spark_keeps_its_tables_on_s3a(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path, s3: S3Server,
        image_jars: str, own_jvm: None) -> None:
    topic = shared_topic(testbed, topic_name("s3a"))
    prefix = tmp_path.name
    config = s3_config(testbed, tmp_path, topic, s3, backend="delta-spark", jars=image_jars,
                       tables=f"s3a://{BUCKET}/{prefix}/tables",
                       checkpoints=str(tmp_path / "checkpoints"))
    sync_once(testbed, config, topic)
    keys = s3.objects(BUCKET, prefix)
    assert any(k.startswith(f"{BUCKET}/{prefix}/tables/sync_progress/_delta_log/") for k in keys)
    assert any(k.startswith(f"{BUCKET}/{prefix}/tables/mappings/") and k.endswith(".parquet")
               for k in keys), keys[:20]
    assert not list(tmp_path.glob("**/_delta_log")), "a table was written locally"
    row = check_status(config, tmp_path, s3, topic)
    assert row["target_mark_delete"] is not None


def test_delta_rs_keeps_its_tables_on_s3(
        testbed: TestBed, topic_name: Callable[[str], str], tmp_path: Path, s3: S3Server,
        image_jars: str, own_jvm: None) -> None:
    topic = shared_topic(testbed, topic_name("s3"))
    prefix = tmp_path.name
    config = s3_config(testbed, tmp_path, topic, s3, backend="delta-rs", jars=image_jars,
                       tables=f"s3://{BUCKET}/{prefix}/tables",
                       checkpoints=str(tmp_path / "checkpoints"))
    sync_once(testbed, config, topic)
    keys = s3.objects(BUCKET, prefix)
    assert any(k.startswith(f"{BUCKET}/{prefix}/tables/mappings/_delta_log/") for k in keys)
    assert not list(tmp_path.glob("**/_delta_log")), "a table was written locally"
    check_status(config, tmp_path, s3, topic)
