"""The cluster demo's JVM class archives (gem.lakehouse.spark.cluster_class_archives): made once by a
small Delta job on a local-cluster master whose driver (as it exits) and executor (through jcmd)
write the classes they loaded, reused by the next call; a session on the standalone cluster of
gem.pipeline.services started from them (gem.pipeline.cluster_demo.with_class_archives) has its
driver and its executor map them, and its job's result is the same as without them (slow tier)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gem.config import load_config
from gem.lakehouse.spark import cluster_class_archives
from gem.pipeline.cluster_demo import with_class_archives
from gem.pipeline.services import SparkCluster
from tests.support import C1_JVM_CONF, PYTHON, REPO, subprocess_env

pytestmark = pytest.mark.slow

# A session on the config the first argument names: a Delta round trip and an aggregation that
# runs on the executor, then which archive file each of its JVMs (the driver, the executor) maps.
SESSION = """
import json, sys, psutil
from pyspark.sql import functions as F
from gem.config import load_config
from gem.lakehouse.spark import get_spark
spark = get_spark(load_config(sys.argv[1]), app_name="archives")
spark.range(5000).withColumn("k", F.col("id") % 7).write.format("delta").save(sys.argv[2])
rows = sorted(tuple(r) for r in spark.read.format("delta").load(sys.argv[2]).groupBy("k").count().collect())
application = spark.sparkContext.applicationId
def archives(process):
    return sorted({m.path for m in process.memory_maps() if m.path.endswith(".jsa")})
driver = psutil.Process(spark.sparkContext._gateway.proc.pid)
executors = [p for p in psutil.process_iter(["cmdline"]) if application in (p.info["cmdline"] or ())]
print(json.dumps({"rows": rows, "driver": archives(driver), "executors": [archives(p) for p in executors]}))
spark.stop()
"""


def _session(config: Path, table: Path) -> dict:
    done = subprocess.run([PYTHON, "-c", SESSION, str(config), str(table)], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_session_on_the_cluster_starts_its_driver_and_executor_from_the_archives(tmp_path: Path) -> None:
    with SparkCluster(tmp_path / "cluster-logs", workers=2, worker_cores=2, worker_memory="1g") as cluster:
        raw = {"lakehouse_uri": str(tmp_path / "lakehouse"),
               "spark": {"master": cluster.master_url, "shuffle_partitions": 2, "driver_memory": "1g",
                         "class_archive": str(tmp_path / "cache" / "local.jsa"),
                         "conf": {**C1_JVM_CONF, "spark.driver.host": "127.0.0.1", "spark.executor.cores": "2",
                                  "spark.executor.memory": "1g", "spark.cores.max": "2"}}}
        config = tmp_path / "gem.yaml"
        config.write_text(yaml.safe_dump(raw))
        log = tmp_path / "class-workload.log"
        driver, executor = cluster_class_archives(load_config(config), config, log)
        assert driver.parent == executor.parent == tmp_path / "cache"
        assert driver.stat().st_size > 0 and executor.stat().st_size > 0
        made = driver.stat().st_mtime_ns, executor.stat().st_mtime_ns
        # The second call finds them: no second workload.
        assert cluster_class_archives(load_config(config), config, log) == (driver, executor)
        assert (driver.stat().st_mtime_ns, executor.stat().st_mtime_ns) == made

        plain = _session(config, tmp_path / "plain")
        with_archives = tmp_path / "with-archives.yaml"
        with_archives.write_text(yaml.safe_dump(with_class_archives(raw, driver, executor)))
        shared = _session(with_archives, tmp_path / "shared")

    # Each JVM also maps the JDK's own base archive; of the files here, which it maps.
    def ours(paths: list[str]) -> list[str]:
        return [p for p in paths if Path(p).parent == driver.parent]

    assert ours(plain["driver"]) == [] and [ours(e) for e in plain["executors"]] == [[]], plain
    assert ours(shared["driver"]) == [str(driver)], shared
    assert [ours(e) for e in shared["executors"]] == [[str(executor)]], shared
    assert shared["rows"] == plain["rows"]
