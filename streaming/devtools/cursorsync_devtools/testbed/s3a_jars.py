"""Hadoop's S3A connector and the AWS SDK modules it uses, from Maven Central, fetched once.

Spark reaches ``s3a://`` (delta-spark's tables) through ``hadoop-aws``, which
pyspark does not ship. Its version must be the Hadoop inside pyspark's ``jars`` folder
(``hadoop-client-api-3.5.0.jar`` for pyspark 4.2.0), and the AWS SDK's the one that Hadoop
release builds against (``aws-java-sdk-v2.version`` in its ``hadoop-project`` pom). Hadoop
depends on the SDK's ``bundle``, 686 MB of every AWS service; S3A uses S3, STS (assumed
roles, web identity) and the transfer manager, which with their own dependencies are the
modules below, about 9 MB. What Spark already ships (Apache HttpClient, Netty, SLF4J,
commons-codec, commons-logging through jcl-over-slf4j) is left out, so one copy of each is
on the classpath.

The image (``helm/Dockerfile``) carries these same jars: ``helm/image/jars.txt`` lists
them with their SHA-256, and a test checks the two lists agree.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

from cursorsync_devtools.testbed.distribution import (
    DEPENDENCY_PLUGIN,
    Artifact,
    SetupError,
    maven_repository,
    require_java,
    require_maven,
)

HADOOP_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"

#: The AWS SDK v2 modules ``s3``, ``sts`` and ``s3-transfer-manager`` need, transitively
#: (``mvn dependency:tree``), with what Spark ships left out.
_SDK_MODULES = (
    "annotations", "apache-client", "arns", "auth", "aws-core", "aws-query-protocol",
    "aws-xml-protocol", "checksums", "checksums-spi", "crt-core", "endpoints-spi",
    "http-auth", "http-auth-aws", "http-auth-aws-eventstream", "http-auth-spi",
    "http-client-spi", "identity-spi", "json-utils", "metrics-spi", "netty-nio-client",
    "profiles", "protocol-core", "regions", "retries", "retries-spi", "s3",
    "s3-transfer-manager", "sdk-core", "sts", "third-party-jackson-core", "utils",
    "utils-lite",
)

S3A_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("org.apache.hadoop", "hadoop-aws", HADOOP_VERSION),
    *(Artifact("software.amazon.awssdk", m, AWS_SDK_VERSION) for m in _SDK_MODULES),
    Artifact("software.amazon.eventstream", "eventstream", "1.0.1"),
    Artifact("org.reactivestreams", "reactive-streams", "1.0.4"),
    # hadoop-aws's compile dependency: S3A's "analytics" input stream.
    Artifact("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1"),
)


def ensure_s3a_jars(*, timeout_s: float = 1800.0) -> list[Path]:
    """The S3A jars' paths in the cache, for ``spark.jars``; fetched only when absent.

    The missing ones are fetched by one Maven run (a run per artifact would start Maven
    36 times, minutes on 2 cores), with ``--strict-checksums``. Raises
    :class:`~cursorsync_devtools.testbed.distribution.SetupError` saying what Maven
    reported (or that ``mvn`` / ``java`` is missing).
    """
    repo = maven_repository()
    paths = [a.repository_path(repo) for a in S3A_ARTIFACTS]
    missing = [a for a, p in zip(S3A_ARTIFACTS, paths, strict=True) if not p.is_file()]
    if missing:
        _fetch_together(missing, repo, timeout_s)
    absent = [a.coordinate() for a, p in zip(S3A_ARTIFACTS, paths, strict=True)
              if not p.is_file()]
    if absent:
        raise SetupError(f"hadoop-aws {HADOOP_VERSION}: Maven did not fetch {', '.join(absent)}")
    return paths


def _pom(artifacts: Sequence[Artifact]) -> str:
    deps = "".join(
        f"<dependency><groupId>{escape(a.group)}</groupId>"
        f"<artifactId>{escape(a.artifact)}</artifactId><version>{escape(a.version)}</version>"
        "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion>"
        "</exclusions></dependency>"
        for a in artifacts)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
            "</modelVersion><groupId>cursorsync.local</groupId><artifactId>s3a-jars"
            f"</artifactId><version>0</version><dependencies>{deps}</dependencies></project>")


def _fetch_together(artifacts: Sequence[Artifact], repo: Path, timeout_s: float) -> None:
    """Fetch ``artifacts`` (not what they depend on) into ``repo`` in one Maven run."""
    mvn = require_maven()
    require_java()
    repo.mkdir(parents=True, exist_ok=True)
    label = f"hadoop-aws {HADOOP_VERSION}"
    print(f"{label}: fetching {len(artifacts)} jars from Maven Central into {repo}",
          file=sys.stderr, flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cursorsync-s3a-") as tmp:
        pom = Path(tmp) / "pom.xml"
        pom.write_text(_pom(artifacts))
        cmd = [mvn, "-B", "-q", "--strict-checksums", f"-Dmaven.repo.local={repo}",
               "-f", str(pom), f"{DEPENDENCY_PLUGIN}:resolve", "-DexcludeTransitive=true"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise SetupError(f"{label}: Maven did not finish within {timeout_s:.0f} s: "
                             f"{' '.join(cmd)}") from None
    if done.returncode != 0:
        errors = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if "[ERROR]" in ln]
        detail = " ".join(errors[:3]) or (done.stdout + done.stderr).strip()[-600:] or "no output"
        raise SetupError(f"{label}: Maven failed (exit {done.returncode}): {detail[:1200]}\n"
                         f"command: {' '.join(cmd)}")
    print(f"{label}: fetched in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
