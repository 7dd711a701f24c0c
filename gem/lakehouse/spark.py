"""The one SparkSession factory, with Delta Lake enabled; every job gets its session here.

Locally the session uses `cfg.spark.master` and the Delta jars fetched once at set-up into
`cfg.spark.jars_dir` (so runs after set-up work offline). Under spark-submit the cluster's
settings win: the running context is reused and only Delta's SQL extension is checked.

The jars are the artifact `configure_spark_with_delta_pip` would request (delta-spark_<spark>_<scala>)
and its dependencies, resolved once by `make setup` from infra/delta-jars/pom.xml.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gem.config import REPO_ROOT, GemConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
CLASS_PATH = "spark.driver.extraClassPath"
LOCAL_FS_IMPL = "spark.hadoop.fs.file.impl"
NIO_LOCAL_FS = "gem.hadoop.NioLocalFileSystem"  # infra/spark/localfs
# `spark.conf` for short-lived job JVMs (small worlds, tests): C1 only, which warms faster. C1's
# default code cache (48 MB) is too small for a JVM that runs a whole day's stages (`airflow dags
# test` runs a day's tasks in one process): once full, compilation stops and a Delta write can fail
# ("CodeCache is full"), so these JVMs get the tiered default's 240 MB.
C1_JVM_CONF = {JAVA_OPTIONS: "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"}
_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def _under_spark_submit() -> bool:
    # spark-submit starts the Python driver with a gateway to its own JVM.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def delta_jars(cfg: GemConfig) -> list[str]:
    return sorted(glob.glob(os.path.join(cfg.spark.jars_dir, "*.jar")))


def get_spark(cfg: GemConfig, app_name: str = "gem") -> SparkSession:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark

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
    conf = {**_DELTA_CONF, **cfg.spark.conf}
    if os.path.isfile(cfg.spark.local_fs_jar):
        # On the JVM's own class path: Hadoop looks a file system class up there, not in spark.jars.
        conf.setdefault(CLASS_PATH, cfg.spark.local_fs_jar)
        conf.setdefault(LOCAL_FS_IMPL, NIO_LOCAL_FS)
    if os.path.isfile(cfg.spark.class_archive):
        conf[JAVA_OPTIONS] = f"{conf.get(JAVA_OPTIONS, '')} -XX:SharedArchiveFile={cfg.spark.class_archive}".strip()
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def archive_classes(cfg: GemConfig) -> Path:
    """Write cfg.spark.class_archive: run a small Delta workload (`class_workload`) in a JVM that
    dumps the classes it loaded at exit (-XX:ArchiveClassesAtExit, JDK 13+), then move the archive
    into place. The JVM exits with its Python process, so the workload runs in a child process that
    loads the same config ($GEM_CONFIG is inherited). The archive is tied to this JDK and classpath;
    a JVM that cannot use it ignores it.
    """

    target = Path(cfg.spark.class_archive)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gem-spark-classes-") as tmp:
        dump = Path(tmp) / "classes.jsa"
        subprocess.run([sys.executable, "-m", "gem.lakehouse.spark", "class-workload", tmp, str(dump)], check=True,
                       cwd=str(REPO_ROOT))
        if not dump.is_file():
            raise RuntimeError(f"the JVM wrote no class archive at {dump} (it needs JDK 13 or later)")
        partial = target.with_name(target.name + ".partial")
        shutil.move(dump, partial)
        partial.replace(target)  # readers see the old archive or the whole new one
    return target


def class_workload(cfg: GemConfig, tmp: str, dump: str) -> None:
    """What the jobs do, small, in a JVM that archives its classes at exit: gzipped JSON in, a
    partitioned Delta write, a replaceWhere overwrite, a MERGE, a filtered read, a join, a window,
    an aggregation, Arrow and rows out."""

    from delta.tables import DeltaTable  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark
    from pyspark.sql import Window  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark
    from pyspark.sql import functions as F  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark

    options = f"{cfg.spark.conf.get(JAVA_OPTIONS, '')} -XX:ArchiveClassesAtExit={dump} -Xlog:cds=off".strip()
    cfg = cfg.replace(spark=dataclasses.replace(
        cfg.spark, conf={**cfg.spark.conf, JAVA_OPTIONS: options}, class_archive=os.path.join(tmp, "none")))
    with gzip.open(os.path.join(tmp, "events.jsonl.gz"), "wt") as f:
        for i in range(200):
            f.write(json.dumps({"id": i, "user": f"u{i % 7}", "ds": f"2026-01-0{1 + i % 3}", "v": i * 0.5}) + "\n")
    spark = get_spark(cfg, app_name="gem-class-workload")
    table = os.path.join(tmp, "table")
    df = spark.read.json(os.path.join(tmp, "events.jsonl.gz"))
    df.write.format("delta").partitionBy("ds").save(table)
    first = "ds = '2026-01-01'"
    df.where(first).write.format("delta").mode("overwrite").option("replaceWhere", first).save(table)
    (DeltaTable.forPath(spark, table).alias("a").merge(df.alias("b"), "a.id = b.id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    read = spark.read.format("delta").load(table).where(F.col("v") > 1)
    out = (read.join(df.groupBy("user").agg(F.count("*").alias("n")), "user")
           .withColumn("rank", F.row_number().over(Window.partitionBy("user").orderBy("id"))))
    out.toArrow()
    out.collect()
    jvm = spark.sparkContext._gateway.proc  # the driver JVM pyspark launched (its Popen)
    spark.stop()
    # The JVM writes the archive as it exits, which it does once its stdin closes: wait for it, so
    # the archive is complete when this process ends.
    jvm.stdin.close()
    jvm.wait(timeout=300)


if __name__ == "__main__":
    import click

    from gem.config import load_config

    @click.group()
    def cli() -> None:
        """Spark set-up helpers."""

    @cli.command("archive-classes")
    def archive_classes_command() -> None:
        """Write the JVM class archive local sessions start from (spark.class_archive)."""
        click.echo(f"class archive: {archive_classes(load_config())}")

    @cli.command("class-workload", hidden=True)
    @click.argument("tmp")
    @click.argument("dump")
    def class_workload_command(tmp: str, dump: str) -> None:
        class_workload(load_config(), tmp, dump)

    cli()
