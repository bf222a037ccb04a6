"""The Spark session the job runs in, and the job's own Spark settings."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cursorsync.app.logs import json_output, relay_output
from cursorsync.app.settings import Config

#: Our log4j2 file goes here; options configured under spark.conf are added to it.
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


#: The system property our log4j2 file reads to pick its appender (``json`` or ``console``).
LOG4J_APPENDER_PROPERTY = "cursorsync.log4j.appender"


def driver_java_options(config: Config, *, json_logs: bool | None = None) -> str:
    """Our quiet log4j2 file, plus whatever spark.conf adds (not replaced by it).

    ``json_logs`` (default: whatever cursorsync's own logs are, see
    :func:`cursorsync.app.logs.json_output`) picks the file's JSON layout."""
    log4j = Path(__file__).with_name("log4j2.properties")
    json_logs = json_output() if json_logs is None else json_logs
    appender = f"-D{LOG4J_APPENDER_PROPERTY}=json" if json_logs else ""
    return " ".join(filter(None, (f"-Dlog4j2.configurationFile={log4j}", appender,
                                  config.spark.conf.get(DRIVER_JAVA_OPTIONS))))


#: Spark 4 refuses to start a query whose checkpoint holds no batch yet but any file in
#: its offsets, commits or state directory. A query stopped while it writes its first
#: offsets leaves exactly that, its temporary file (``.0.<uuid>.tmp``, never renamed), and
#: every restart would fail. The job's queries keep no state, and a real batch file is read
#: whatever this says, so the check can only refuse a restart after such a stop: it is off.
RESTARTABLE_CONF = {"spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart": "false"}


#: How Spark writes the queries' checkpoint files (offsets and commits, two per batch).
#: Its default, Hadoop's FileContext, asks the local file system for a link's status on
#: every rename, and Hadoop without its native library answers that by forking
#: ``readlink`` from the driver's JVM: about 50 ms per file on an idle machine, 100 ms
#: and more on a busy one, in every batch of both queries, before the next one can
#: start. The checkpoint directory is local (``spark.checkpoint_dir``), where the
#: FileSystem API's rename is rename(2), as atomic, and one job writes it (the tables'
#: lease stops a second job of the same config), so its exists-then-rename check has no
#: concurrent writer to race.
CHECKPOINT_FILE_MANAGER = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager",
}


#: The master of a job that is not launched by spark-submit and names none.
LOCAL_MASTER = "local[2]"


def launched_by_spark_submit() -> bool:
    """True in a driver spark-submit started: its JVM hands Python the gateway to use."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def master_of(config: Config) -> str | None:
    """The master to set: the configured one; else spark-submit's (None); else local."""
    if config.spark.master:
        return config.spark.master
    return None if launched_by_spark_submit() else LOCAL_MASTER


#: The interpreter Spark starts Python workers with (data sources, UDFs), read by the JVM
#: from its environment, which it inherits from a driver that spark-submit did not start.
WORKER_PYTHON_ENV = "PYSPARK_PYTHON"


def local_worker_python(master: str | None, environ: Mapping[str, str]) -> str | None:
    """The interpreter a local master's Python workers must run, or None to leave Spark's.

    Unless PYSPARK_PYTHON names one, Spark starts them with ``python3`` from the PATH: not
    the environment cursorsync runs in when that is not first on the PATH (a virtualenv's
    console script run by its full path), so the workers would miss cursorsync, or import
    another copy of it. A local master's workers run on this machine: this interpreter.
    Setting ``spark.pyspark.python`` instead does not reach the data sources' workers."""
    if master is None or not master.startswith("local") or environ.get(WORKER_PYTHON_ENV):
        return None
    return sys.executable


#: Where ``tables.storage_options`` (delta-rs's option names) say how to reach S3, the same
#: settings for Spark's s3a (delta-spark's tables): one place for both engines.
_S3A_ENDPOINT = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")
_S3A_REGION = ("AWS_REGION", "AWS_DEFAULT_REGION")
S3A_CREDENTIALS_PROVIDER = "spark.hadoop.fs.s3a.aws.credentials.provider"
#: Hadoop's default credential chain plus web identity (a Kubernetes service account's
#: IAM role): the sources delta-rs reads too (the AWS_* environment variables, web
#: identity, the container's and the instance's credentials), in the same order.
S3A_CREDENTIAL_CHAIN = ",".join((
    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.WebIdentityTokenFileCredentialsProvider",
    "org.apache.hadoop.fs.s3a.auth.IAMInstanceCredentialsProvider",
))


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1", "yes")


def s3a_conf(storage_options: Mapping[str, str]) -> dict[str, str]:
    """Spark's s3a settings saying what ``tables.storage_options`` says to delta-rs.

    The endpoint and region carry over; so does the addressing, which in delta-rs is
    path-style (``bucket`` in the path) unless AWS_VIRTUAL_HOSTED_STYLE_REQUEST is true,
    and AWS_ALLOW_HTTP for an endpoint given without its scheme. Credentials are never
    options: both engines read them from the environment."""
    options = {k.upper(): v for k, v in storage_options.items()}
    conf: dict[str, str] = {}
    endpoint = next((options[k] for k in _S3A_ENDPOINT if options.get(k)), None)
    region = next((options[k] for k in _S3A_REGION if options.get(k)), None)
    if endpoint is not None:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
    if region is not None:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    if endpoint is not None or "AWS_VIRTUAL_HOSTED_STYLE_REQUEST" in options:
        virtual = _true(options.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))
        conf["spark.hadoop.fs.s3a.path.style.access"] = "false" if virtual else "true"
    if "AWS_ALLOW_HTTP" in options:
        ssl = not _true(options["AWS_ALLOW_HTTP"])
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "true" if ssl else "false"
    return conf


def uses_s3a(config: Config) -> bool:
    """Whether Spark writes to ``s3a://``: delta-spark's tables (the checkpoints are local)."""
    return config.tables.backend == "delta-spark" and config.tables.path.startswith("s3a://")


def _submitted_conf() -> Mapping[str, str]:
    """The Spark conf spark-submit gave this driver (the chart's sparkConf and hadoopConf);
    nothing when spark-submit did not start it."""
    if not launched_by_spark_submit():
        return {}
    from pyspark import SparkConf

    return dict(SparkConf().getAll())


def object_store_conf(config: Config) -> dict[str, str]:
    """The s3a settings the job adds to its session: those of ``tables.storage_options``,
    and, when it uses s3a and nobody named one, the credential chain delta-rs follows."""
    conf = s3a_conf(config.tables.storage_options)
    if (uses_s3a(config) and S3A_CREDENTIALS_PROVIDER not in config.spark.conf
            and S3A_CREDENTIALS_PROVIDER not in _submitted_conf()):
        conf[S3A_CREDENTIALS_PROVIDER] = S3A_CREDENTIAL_CHAIN
    return conf


def build_session(config: Config) -> Any:
    """A SparkSession from the config (Delta extension only when the backend needs it)."""
    from pyspark.sql import SparkSession

    conf: dict[str, Any] = {"spark.app.name": config.spark.app_name}
    master = master_of(config)
    if master is not None:
        conf["spark.master"] = master
    python = local_worker_python(master, os.environ)
    if python is not None:
        os.environ[WORKER_PYTHON_ENV] = python  # before the JVM starts, which reads it
    conf.update({
        DRIVER_JAVA_OPTIONS: driver_java_options(config),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        "spark.sql.streaming.metricsEnabled": "true",
        # A Python worker that dies (a native crash in the Pulsar client) leaves its
        # threads' stacks in the error, not only "exited unexpectedly".
        "spark.python.worker.faulthandler.enabled": "true",
        # The two queries' jobs share the slots by pool (cursorsync.app.queries), not in
        # the order they were submitted.
        "spark.scheduler.mode": "FAIR",
        **CHECKPOINT_FILE_MANAGER,
    })
    if config.tables.backend == "delta-spark":
        from cursorsync.tables.delta_spark import DELTA_SPARK_CONF

        conf.update(DELTA_SPARK_CONF)
    conf.update(object_store_conf(config))
    conf.update({k: v for k, v in config.spark.conf.items() if k != DRIVER_JAVA_OPTIONS})
    if json_output():
        _start_jvm_relayed(conf)
    spark = SparkSession.builder.config(map=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _start_jvm_relayed(conf: dict[str, Any]) -> None:
    """Start the JVM this process launches itself (not spark-submit's) with its output
    relayed through :func:`cursorsync.app.logs.relay_output`, so that what it writes
    outside log4j (the launcher's warnings, its Python workers' output) is JSON too.
    Nothing to do when a JVM runs already: it is the one the session will use."""
    from subprocess import PIPE, STDOUT

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if launched_by_spark_submit() or getattr(SparkContext, "_gateway", None) is not None:
        return
    spark_conf = SparkConf(loadDefaults=False).setAll([(k, str(v)) for k, v in conf.items()])
    gateway = launch_gateway(  # type: ignore[no-untyped-call]
        spark_conf, popen_kwargs={"stdout": PIPE, "stderr": STDOUT})
    relay_output(gateway.proc.stdout)
    SparkContext(conf=spark_conf, gateway=gateway)
