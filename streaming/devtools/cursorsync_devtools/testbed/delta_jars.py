"""The Delta Lake JVM jars from Maven Central, fetched once into the test bed's cache.

Development tooling: the tests build local SparkSessions with ``spark.jars`` set to
these files. A production job names the jars itself (``spark.jars.packages`` or
``spark.jars`` in its Spark conf); the product never imports this module.

The version matches the ``delta-spark`` Python package pinned in pyproject.toml,
and the artifact's Spark and Scala suffix matches pyspark 4.2.0 (Scala 2.13).
"""

from __future__ import annotations

from pathlib import Path

from cursorsync_devtools.testbed.distribution import Artifact, maven_fetch

DELTA_VERSION = "4.4.0"
#: Spark's major.minor and Scala's binary version, as in the artifact's name.
DELTA_SPARK_SUFFIX = "4.2_2.13"

#: What delta-spark needs beyond Spark's own jars (see :func:`ensure_delta_jars`).
DELTA_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("io.delta", f"delta-spark_{DELTA_SPARK_SUFFIX}", DELTA_VERSION),
    Artifact("io.delta", "delta-storage", DELTA_VERSION),
)


def ensure_delta_jars() -> list[Path]:
    """The Delta jars' paths in the cache, for ``spark.jars``; fetched only when absent.

    Raises :class:`~cursorsync_devtools.testbed.distribution.SetupError` naming the artifact
    Maven could not fetch (or the missing ``mvn`` / ``java``).
    """
    return maven_fetch(DELTA_ARTIFACTS, label=f"Delta Lake {DELTA_VERSION}",
                       expected_size=9_515_916)
