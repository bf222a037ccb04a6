"""The job's two queries share Spark's task slots by pool: the session the job builds
schedules FAIR, and each query's batches (its foreachBatch jobs too) run in the pool named
when it started (cursorsync.app.queries.scheduler_pool, which start_queries starts them
in)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.spark_cluster import free_port

pytestmark = pytest.mark.spark

RUN = """
import json, sys, time, urllib.request
from cursorsync.app.queries import scheduler_pool
from cursorsync.mapping.sink import MAPPING_APP
from cursorsync.sync.sink import SYNC_APP
from cursorsync.app.session import build_session
from cursorsync.app.settings import parse_config

spark = build_session(parse_config(json.loads(sys.argv[1])))
context = spark.sparkContext
queries = []
for name in (MAPPING_APP, SYNC_APP):
    with scheduler_pool(spark, name):
        queries.append(spark.readStream.format("rate").option("rowsPerSecond", 5).load()
                       .writeStream.queryName(name).foreachBatch(lambda df, _: df.toArrow())
                       .trigger(processingTime="200 milliseconds").start())
deadline = time.monotonic() + 120
while (min(-1 if q.lastProgress is None else q.lastProgress["batchId"] for q in queries) < 3
       and time.monotonic() < deadline):
    time.sleep(0.2)
for q in queries:
    q.stop()
url = context.uiWebUrl
stages = json.loads(urllib.request.urlopen(
    f"{url}/api/v1/applications/{context.applicationId}/stages", timeout=30).read())
jobs = json.loads(urllib.request.urlopen(
    f"{url}/api/v1/applications/{context.applicationId}/jobs", timeout=30).read())
print(json.dumps({"mode": spark.conf.get("spark.scheduler.mode"),
                  "stages": [[s.get("schedulingPool"), s.get("description") or ""]
                             for s in stages],
                  "jobs": len(jobs)}))
spark.stop()
"""


def test_each_querys_batches_run_in_its_own_pool(tmp_path: Path) -> None:
    config = {
        "clusters": {
            "source": {"name": "a", "service_url": "pulsar://127.0.0.1:6650",
                       "admin_url": "http://127.0.0.1:8080"},
            "target": {"name": "b", "service_url": "pulsar://127.0.0.1:6651",
                       "admin_url": "http://127.0.0.1:8081"}},
        "topics": [{"topic": "persistent://t/ns/orders", "subscriptions": ["billing"]}],
        "tables": {"path": str(tmp_path / "tables")},
        "spark": {"checkpoint_dir": str(tmp_path / "checkpoints"), "master": "local[2]",
                  "conf": {"spark.ui.port": str(free_port())}},
    }
    out = subprocess.run([sys.executable, "-c", RUN, json.dumps(config)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["mode"] == "FAIR"
    pools = {}
    for pool, description in got["stages"]:
        query = description.split("\n", 1)[0]  # a batch's jobs are described by its query
        pools.setdefault(query, set()).add(pool)
    assert pools.get("cursorsync-mapping") == {"cursorsync-mapping"}, got["stages"]
    assert pools.get("cursorsync-sync") == {"cursorsync-sync"}, got["stages"]
