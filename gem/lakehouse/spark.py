"""The one SparkSession factory, with Delta Lake enabled; every job gets its session here.

Locally the session uses `cfg.spark.master` and the Delta jars fetched once at set-up into
`cfg.spark.jars_dir` (so runs after set-up work offline). Under spark-submit the cluster's
settings win: the running context is reused and only Delta's SQL extension is checked.

Spark reaches S3 through Hadoop's S3A connector (the jars include hadoop-aws and the AWS SDK), and
names the store s3a:// (gem.storage.spark_uri). Where it is and in which region come from the
standard AWS variables (gem.storage.s3_endpoint / s3_region), set on every session this module
hands out, a running one included (`configure_object_store`): a process may set the variables after
its session started. Credentials reach the connector through Hadoop's default provider chain (the
JVM's AWS_* environment, instance roles), never through Spark's configuration.

The jars are the artifact `configure_spark_with_delta_pip` would request (delta-spark_<spark>_<scala>)
and its dependencies, resolved once by `make setup` from infra/delta-jars/pom.xml.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from gem import storage
from gem.config import REPO_ROOT, GemConfig
from gem.environment import CONFIG_FILE_ENV

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
CLASS_PATH = "spark.driver.extraClassPath"
LOCAL_FS_IMPL = "spark.hadoop.fs.file.impl"
NIO_LOCAL_FS = "gem.hadoop.NioLocalFileSystem"  # infra/spark/localfs
# `spark.conf` for short-lived job JVMs (small worlds, tests): C1 only, which warms faster. C1's
# default code cache (48 MB) is too small for a JVM that runs a whole day's stages (`airflow dags
# test` runs a day's tasks in one process): once full, compilation stops and a Delta write can fail
# ("CodeCache is full"), so these JVMs get the tiered default's 240 MB.
# A cluster's executors (local-cluster, standalone) take the same options.
C1_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
C1_JVM_CONF = {JAVA_OPTIONS: C1_OPTIONS, EXECUTOR_JAVA_OPTIONS: C1_OPTIONS}
# How long jcmd has to make a running executor write its class archive.
EXECUTOR_DUMP_TIMEOUT_S = 300.0
# The class workload's local-cluster worker memory, and its executor's heap within it (a heap size
# does not tie an archive to it).
WORKLOAD_WORKER_MB = 1024
WORKLOAD_EXECUTOR_MEMORY = "512m"
_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
HADOOP_PREFIX = "spark.hadoop."
# The AWS SDK's provider of credentials from the JVM's system properties (aws.accessKeyId, ...), put
# ahead of the environment's in S3A's chain when the JVM's environment lacks this process's
# credentials (`_share_credentials`).
SYSTEM_PROPERTY_CREDENTIALS = "software.amazon.awssdk.auth.credentials.SystemPropertyCredentialsProvider"
ENVIRONMENT_CREDENTIALS = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
CREDENTIALS_PROVIDER = "fs.s3a.aws.credentials.provider"
# AWS variable -> the SDK's system property of the same credential.
_CREDENTIAL_PROPERTIES = {"AWS_ACCESS_KEY_ID": "aws.accessKeyId", "AWS_SECRET_ACCESS_KEY": "aws.secretAccessKey",
                          "AWS_SESSION_TOKEN": "aws.sessionToken"}
# The settings last applied per running context, so a session's repeated use costs no JVM call.
_applied: dict[int, tuple[tuple[str, str], ...]] = {}


def _under_spark_submit() -> bool:
    # spark-submit starts the Python driver with a gateway to its own JVM.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def delta_jars(cfg: GemConfig) -> list[str]:
    return sorted(glob.glob(os.path.join(cfg.spark.jars_dir, "*.jar")))


def s3a_settings() -> dict[str, str]:
    """Hadoop's S3A settings for the store the AWS variables name: its endpoint (path-style access,
    TLS as the endpoint's scheme says) when it is not AWS's own, and its region; {} when the
    variables name neither."""
    endpoint, region = storage.s3_endpoint(), storage.s3_region()
    settings = {}
    if endpoint:
        settings |= {"fs.s3a.endpoint": endpoint, "fs.s3a.path.style.access": "true",
                     "fs.s3a.connection.ssl.enabled": str(not endpoint.lower().startswith("http://")).lower()}
    if region:
        settings["fs.s3a.endpoint.region"] = region
    return settings


def configure_object_store(spark: SparkSession) -> None:
    """Set the S3A settings (`s3a_settings`) on the session's Hadoop configuration, which every
    S3A file system opened later reads, also for a session started before the AWS variables were
    set. Settings the session was started with (spark.hadoop.* of cfg.spark.conf) win; under
    spark-submit the cluster's settings are left alone. Cheap when nothing changed since the last
    call."""
    if _under_spark_submit():
        return
    context = spark.sparkContext
    started_with = context.getConf()
    settings = {k: v for k, v in s3a_settings().items() if not started_with.contains(HADOOP_PREFIX + k)}
    shared = {k: os.environ[k] for k in _CREDENTIAL_PROPERTIES if os.environ.get(k)}
    # The credentials are compared, never kept: a digest of them stands in the cache key.
    key = tuple(sorted(settings.items())) + (("credentials", str(hash(tuple(sorted(shared.items()))))),)
    if _applied.get(id(context)) == key:
        return
    hadoop = context._jsc.hadoopConfiguration()
    for k, v in settings.items():
        hadoop.set(k, v)
    if not started_with.contains(HADOOP_PREFIX + CREDENTIALS_PROVIDER):
        _share_credentials(spark, shared)
    _applied[id(context)] = key


def _share_credentials(spark: SparkSession, shared: dict[str, str]) -> None:
    """When this process has AWS credentials in its environment that the JVM's own environment
    (fixed when the JVM started) lacks or holds otherwise, hand them to the JVM as the SDK's system
    properties and put the SDK's system-property provider ahead of the environment's in S3A's
    chain. Spark redacts these properties wherever it shows them (spark.redaction.regex)."""
    jvm = spark.sparkContext._jvm
    system = jvm.java.lang.System
    if not shared or all(system.getenv(k) == v for k, v in shared.items()):
        return
    for variable, prop in _CREDENTIAL_PROPERTIES.items():
        if variable in shared:
            system.setProperty(prop, shared[variable])
        else:
            system.clearProperty(prop)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    chain = [p.strip() for p in (hadoop.get(CREDENTIALS_PROVIDER) or "").split(",") if p.strip()]
    if SYSTEM_PROPERTY_CREDENTIALS not in chain:
        at = chain.index(ENVIRONMENT_CREDENTIALS) if ENVIRONMENT_CREDENTIALS in chain else len(chain)
        hadoop.set(CREDENTIALS_PROVIDER, ",".join([*chain[:at], SYSTEM_PROPERTY_CREDENTIALS, *chain[at:]]))


def session_on_demand(cfg: GemConfig, spark: SparkSession | None = None,
                      app_name: str = "gem") -> Callable[[], SparkSession]:
    """A function returning `spark`, or without one a session from `get_spark` opened at its first
    call: a task that turns out to touch only deltalake-written tables starts no JVM."""
    opened: list[SparkSession] = [spark] if spark is not None else []

    def session() -> SparkSession:
        if not opened:
            opened.append(get_spark(cfg, app_name))
        return opened[0]

    return session


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
        ship_project(spark, cfg)
        return spark  # the cluster's own S3A settings reach s3a:// tables

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
        # Listing a table's folder (Delta's VACUUM) runs this many tasks; Spark's default (10000)
        # makes one local VACUUM of a small table take minutes.
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", str(cfg.spark.shuffle_partitions))
    )
    conf = {**_DELTA_CONF, **cfg.spark.conf}
    # The local file system jar sits on the driver's class path only: executors of a cluster (a
    # remote master, local-cluster's executor JVMs) use Hadoop's own local file system.
    if is_local_master(cfg.spark.master) and os.path.isfile(cfg.spark.local_fs_jar):
        # On the JVM's own class path: Hadoop looks a file system class up there, not in spark.jars.
        conf.setdefault(CLASS_PATH, cfg.spark.local_fs_jar)
        conf.setdefault(LOCAL_FS_IMPL, NIO_LOCAL_FS)
    # The archive was dumped with the local file system jar on the class path; a driver started
    # without it (any master but local) cannot map it and would warn.
    if is_local_master(cfg.spark.master) and os.path.isfile(cfg.spark.class_archive):
        conf[JAVA_OPTIONS] = f"{conf.get(JAVA_OPTIONS, '')} -XX:SharedArchiveFile={cfg.spark.class_archive}".strip()
    for k, v in conf.items():
        builder = builder.config(k, v)
    # PySpark's workers (mapInArrow, UDFs) run the interpreter PYSPARK_PYTHON names when the context
    # starts, "python3" on PATH without it (spark.pyspark.python reaches only spark-submit).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    ship_project(spark, cfg)
    # Set on the Hadoop configuration, not as spark.hadoop.* of the builder: a running session
    # takes them too, and a later change of the AWS variables reaches it.
    configure_object_store(spark)
    return spark


def ship_project(spark: SparkSession, cfg: GemConfig) -> None:
    """On a cluster (any master but local), executors import the project's code (mapInArrow, UDFs)
    from an archive shipped with the application, not from whatever their hosts have installed.
    Shipped by the session, also under spark-submit: a --py-files archive would come first on the
    driver's path too, where the project's non-Python files (configs, assets) are not."""
    if not is_local_master(spark.sparkContext.master):
        spark.sparkContext.addPyFile(str(project_archive(Path(cfg.spark.jars_dir).parent)))


def is_local_master(master: str) -> bool:
    """Whether the driver is the only JVM (local, local[N], local[*]): no executor to ship anything to."""
    return master == "local" or master.startswith("local[")


# The packages an executor imports: the pipeline, the table schemas, the stage entry points.
PROJECT_PACKAGES = ("gem", "schemas", "jobs")


def project_archive(cache_dir: Path) -> Path:
    """A zip of the project's Python packages (PROJECT_PACKAGES) for executors' Python workers,
    named by a digest of its contents, so a changed tree ships a new archive and an unchanged one
    is built once."""
    files = sorted(p for package in PROJECT_PACKAGES for p in (REPO_ROOT / package).rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    target = cache_dir / f"gem-code-{digest.hexdigest()[:16]}.zip"
    if not target.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, path.relative_to(REPO_ROOT).as_posix())
        partial.replace(target)
    return target


def archive_classes(cfg: GemConfig) -> Path:
    """Write cfg.spark.class_archive: run a small Delta workload (`class_workload`) in a JVM that
    dumps the classes it loaded at exit (-XX:ArchiveClassesAtExit, JDK 13+), then move the archive
    into place. The JVM exits with its Python process, so the workload runs in a child process that
    loads the same config ($GEM_CONFIG is inherited). The archive is tied to this JDK and classpath;
    a JVM that cannot use it ignores it.
    """
    target = Path(cfg.spark.class_archive)
    with tempfile.TemporaryDirectory(prefix="gem-spark-classes-") as tmp:
        dump = Path(tmp) / "classes.jsa"
        subprocess.run([sys.executable, "-m", "gem.lakehouse.spark", "class-workload", tmp, str(dump)], check=True,
                       cwd=str(REPO_ROOT))
        _put_in_place(dump, target)
    return target


def cluster_class_archives(cfg: GemConfig, config_file: Path, log: Path) -> tuple[Path, Path]:
    """The class archives of a driver and of an executor of a Spark cluster whose executors run this
    Spark distribution (a standalone cluster of pyspark's, as `make cluster-demo` starts) with
    cfg.spark.conf's JVM options -> (driver's, executor's). Made once per JDK, Spark, Delta jars and
    JVM options (named by a digest of them, beside cfg.spark.class_archive) by `class_workload` on a
    `local-cluster` master (a worker in the driver's JVM launching an executor JVM as a standalone
    worker does, with the same class path) in a child process that loads `config_file` (its output
    to `log`), and reused after. A driver or executor started with `-XX:SharedArchiveFile=<its
    archive>` maps the classes instead of loading and verifying them: each Spark application of the
    cluster (one per Airflow task) starts its two JVMs sooner. A JVM that cannot use an archive
    ignores it.
    """
    from importlib.metadata import version  # noqa: PLC0415 - only the cluster demo asks for these archives

    key = json.dumps([os.path.realpath(shutil.which("java") or "java"), version("pyspark"),
                      sorted(os.path.basename(j) for j in delta_jars(cfg)),
                      cfg.spark.conf.get(JAVA_OPTIONS, ""), cfg.spark.conf.get(EXECUTOR_JAVA_OPTIONS, "")])
    name = f"spark-classes-cluster-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    folder = Path(cfg.spark.class_archive).parent
    driver, executor = folder / f"{name}-driver.jsa", folder / f"{name}-executor.jsa"
    if driver.is_file() and executor.is_file():
        return driver, executor
    with tempfile.TemporaryDirectory(prefix="gem-spark-classes-") as tmp, open(log, "ab") as out:
        dumps = Path(tmp) / "driver.jsa", Path(tmp) / "executor.jsa"
        cores = cfg.spark.conf.get("spark.executor.cores", "1")
        done = subprocess.run([sys.executable, "-m", "gem.lakehouse.spark", "class-workload", tmp, str(dumps[0]),
                               "--executor-dump", str(dumps[1]), "--master",
                               f"local-cluster[1,{cores},{WORKLOAD_WORKER_MB}]"], cwd=str(REPO_ROOT), stdout=out,
                              stderr=subprocess.STDOUT, env={**os.environ, CONFIG_FILE_ENV: str(config_file)}, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the class workload exited with {done.returncode}; its log: {log}")
        _put_in_place(dumps[0], driver)
        _put_in_place(dumps[1], executor)
    return driver, executor


def _put_in_place(dump: Path, target: Path) -> None:
    """Move a JVM's class archive to `target`: readers see the old archive or the whole new one."""
    if not dump.is_file():
        raise RuntimeError(f"the JVM wrote no class archive at {dump} (it needs JDK 13 or later)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.move(dump, partial)
    partial.replace(target)


def class_workload(cfg: GemConfig, tmp: str, dump: str, executor_dump: str | None = None,
                   master: str | None = None) -> None:
    """What the jobs do, small, in a JVM that archives its classes at exit: gzipped JSON in, a
    partitioned Delta write, a replaceWhere overwrite, a MERGE, a filtered read, a join, a window,
    an aggregation, Arrow and rows out. With `executor_dump` (a cluster whose workers run on this
    host), the application's one executor archives its classes there before the application stops
    (`_dump_executor`)."""

    from delta.tables import DeltaTable  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark
    from pyspark.sql import Window  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark
    from pyspark.sql import functions as F  # noqa: PLC0415 - JVM-free stages import this module and never load pyspark

    conf = {**cfg.spark.conf, JAVA_OPTIONS: _dumping(cfg.spark.conf.get(JAVA_OPTIONS, ""), dump)}
    if executor_dump:
        # What `jcmd VM.cds dynamic_dump` needs of the JVM it asks (JDK 17+).
        conf[EXECUTOR_JAVA_OPTIONS] = f"{cfg.spark.conf.get(EXECUTOR_JAVA_OPTIONS, '')} -XX:+RecordDynamicDumpInfo".strip()
        # One executor, whose archive is the executors' archive.
        conf["spark.cores.max"] = conf.get("spark.executor.cores", "1")
        conf["spark.executor.memory"] = WORKLOAD_EXECUTOR_MEMORY
    cfg = cfg.replace(spark=dataclasses.replace(cfg.spark, master=master or cfg.spark.master, conf=conf,
                                                class_archive=os.path.join(tmp, "none")))
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
    if executor_dump:
        _dump_executor(spark.sparkContext.applicationId, executor_dump)
    jvm = spark.sparkContext._gateway.proc  # the driver JVM pyspark launched (its Popen)
    spark.stop()
    # The JVM writes the archive as it exits, which it does once its stdin closes: wait for it, so
    # the archive is complete when this process ends.
    jvm.stdin.close()
    jvm.wait(timeout=300)


def _dump_executor(application: str, dump: str) -> None:
    """The one executor of `application` (a process on this host) writes its class archive to `dump`
    now, through jcmd of its own JDK: a worker ends an application's executors with SIGTERM and
    SIGKILL ten seconds later, too soon for a JVM to write a Spark-sized archive as it exits."""
    import psutil  # noqa: PLC0415 - only the set-up helpers look for executor processes

    executors = [p for p in psutil.process_iter(["cmdline"]) if application in (p.info["cmdline"] or ())]
    if len(executors) != 1:
        raise RuntimeError(f"expected one executor process of {application} on this host, found {len(executors)}")
    executor = executors[0]
    jcmd = Path(executor.info["cmdline"][0]).with_name("jcmd")
    done = subprocess.run([str(jcmd), str(executor.pid), "VM.cds", "dynamic_dump", dump], capture_output=True,
                          text=True, timeout=EXECUTOR_DUMP_TIMEOUT_S, check=False)
    if done.returncode != 0 or not os.path.isfile(dump):
        raise RuntimeError(f"{jcmd} VM.cds dynamic_dump of executor {executor.pid} wrote no archive at {dump}: "
                           f"{(done.stdout + done.stderr)[-2000:]}")


def _dumping(options: str, dump: str) -> str:
    """JVM options plus: archive the loaded classes to `dump` at exit, without CDS's warnings."""
    return f"{options} -XX:ArchiveClassesAtExit={dump} -Xlog:cds=off".strip()


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
    @click.option("--executor-dump", default=None)
    @click.option("--master", default=None)
    def class_workload_command(tmp: str, dump: str, executor_dump: str | None, master: str | None) -> None:
        class_workload(load_config(), tmp, dump, executor_dump, master)

    cli()
