"""The one SparkSession factory, with Delta Lake enabled; every job gets its session here.

Locally the session uses `cfg.spark.master` and the Delta jars fetched once at set-up into
`cfg.spark.jars_dir` (so runs after set-up work offline). Under spark-submit the cluster's
settings win: the running context is reused and only Delta's SQL extension is checked.

The jars are the artifact `configure_spark_with_delta_pip` would request (delta-spark_<spark>_<scala>)
and its dependencies, resolved once by `make setup` from infra/delta-jars/pom.xml.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import TYPE_CHECKING

from gem.config import GemConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def _under_spark_submit() -> bool:
    # spark-submit starts the Python driver with a gateway to its own JVM.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def delta_jars(cfg: GemConfig) -> list[str]:
    return sorted(glob.glob(os.path.join(cfg.spark.jars_dir, "*.jar")))


def get_spark(cfg: GemConfig, app_name: str = "gem") -> "SparkSession":
    from pyspark.sql import SparkSession

    if _under_spark_submit():
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        ext = spark.conf.get("spark.sql.extensions", "") or ""
        if "DeltaSparkSessionExtension" not in ext:
            raise RuntimeError(
                "spark-submit session lacks Delta: pass --packages io.delta:delta-spark_4.1_2.13:<ver> "
                "and --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension (see infra/spark)"
            )
        return spark

    jars = delta_jars(cfg)
    if not jars:
        raise RuntimeError(
            f"no Delta jars in {cfg.spark.jars_dir}; run `make setup` once (it fetches them with Maven)"
        )
    builder = (
        SparkSession.builder.appName(app_name)
        .master(cfg.spark.master)
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.shuffle.partitions", str(cfg.spark.shuffle_partitions))
        .config("spark.driver.memory", cfg.spark.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        # Python workers run this interpreter (the venv), not whatever python3 is on PATH.
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Delta's own writes stay deterministic and small-file friendly on a laptop.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.sources.partitionOverwriteMode", "static")
    )
    for k, v in {**_DELTA_CONF, **cfg.spark.conf}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
