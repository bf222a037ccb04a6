"""Restarting pyspark's JVM, for tests that need other jars on the driver's classpath."""

from __future__ import annotations


def shut_down_jvm() -> None:
    """Stop pyspark's session and its JVM, so that the next session launches a new JVM.

    pyspark fixes the driver's classpath when it launches the JVM (``spark.jars`` of the
    process's first session); a later session's ``spark.jars`` does not reach the driver.
    Other test modules may have launched it without the Delta jars.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)  # None: a JVM this process did not launch
    if gateway is None or proc is None:
        return
    gateway.shutdown()
    proc.stdin.close()  # the JVM exits when its stdin closes
    proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None
