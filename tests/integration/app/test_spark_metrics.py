"""Spark's own metrics as the chart configures them: a local session with the Spark
settings the chart renders serves the driver's JVM, its executors and a streaming query
on the UI port's PrometheusServlet, the paths the ServiceMonitor scrapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import helm_tools as ht
from tests.support.spark_cluster import free_port

pytestmark = pytest.mark.spark

SCRAPE = """
import json, sys, time, urllib.request
from pyspark.sql import SparkSession

conf, paths = json.loads(sys.argv[1]), json.loads(sys.argv[2])
spark = SparkSession.builder.master("local[1]").config(map=conf).getOrCreate()
query = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
         .writeStream.format("noop").queryName("probe").trigger(processingTime="200 milliseconds")
         .start())
deadline = time.monotonic() + 120
def batches():
    return -1 if query.lastProgress is None else query.lastProgress["batchId"]
while batches() < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
port = conf["spark.ui.port"]
out = {p: urllib.request.urlopen(f"http://127.0.0.1:{port}{p}", timeout=30).read().decode()
       for p in paths}
query.stop()
spark.stop()
print(json.dumps(out))
"""


def test_the_charts_spark_settings_serve_the_paths_its_service_monitor_scrapes(
        tmp_path: Path) -> None:
    manifests = ht.render([ht.FULL_VALUES])
    conf = {k: v for k, v in ht.spark_application(manifests)["spec"]["sparkConf"].items()
            if k.startswith(("spark.ui.", "spark.metrics."))}
    assert conf["spark.ui.prometheus.enabled"] == "true"
    monitor = ht.of_kind(manifests, "ServiceMonitor")[0]
    paths = [e["path"] for e in monitor["spec"]["endpoints"] if e["port"] == "spark-metrics"]
    assert paths == ["/metrics/prometheus", "/metrics/executors/prometheus"]
    conf["spark.ui.port"] = str(free_port())  # the chart's 4040 may be taken here
    conf["spark.sql.streaming.metricsEnabled"] = "true"
    out = subprocess.run([sys.executable, "-c", SCRAPE, json.dumps(conf), json.dumps(paths)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    texts = json.loads(out.stdout.splitlines()[-1])
    driver = texts["/metrics/prometheus"]
    # The fixed namespace names every series (not the application id, new every run).
    assert "metrics_cursorsync_driver_jvm_heap_used_Value" in driver, driver[:2000]
    assert "metrics_cursorsync_driver_spark_streaming_probe_" in driver
    assert "metrics_cursorsync_driver_appStatus_jobs_succeededJobs_Count" in driver
    executors = texts["/metrics/executors/prometheus"]
    assert 'executor_id="driver"' in executors and "metrics_executor_" in executors
