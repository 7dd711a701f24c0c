"""`make cluster-demo`: the demo's days on the local cluster topology, then everything it started stopped.

    python -m gem.pipeline.cluster_demo [--config configs/demo.yaml] [--work-dir .airflow/cluster-demo]

It starts, each with a readiness timeout (gem.pipeline.services): the S3 API server (moto in server
mode) on 127.0.0.1 with a bucket for the lakehouse, and a standalone Spark cluster (a master and two
workers from pyspark's own distribution, each on its own loopback address, WORKER_CORES cores and
WORKER_MEMORY for one executor each); after the bulk days, Airflow as a cluster
(gem.pipeline.airflow.stack): PostgreSQL as its metadata DB, Redis as the Celery broker, the API
server, DAG processor, scheduler (CeleryExecutor) and two Celery workers of one task slot each.
It writes the demo's config changed only where the topology requires (`cluster_config`): the
lakehouse (and the landing zone, where the config names one) in the bucket, `spark.master` the
cluster's URL, the executors and the driver sized for a 2-core machine.
The S3 server's AWS variables go into this process's environment before anything else starts, so
every child inherits them: the Spark daemons and their executors, the demo's process and Airflow's
tasks. The bulk days run as `make demo` runs them (gem.pipeline.demo_process: every stage in one
Spark application); each later day is a DAG run triggered through the cluster's REST API and run by
the scheduler on the Celery workers (each task in its own process and Spark application on the
standalone cluster), one line per task as it finishes, then how many tasks each worker ran. The
same summary as `make demo` prints (gem.pipeline.demo.report), then the seconds each service took
to start and to stop, then the Celery worker each Airflow task ran on (its task instance's hostname,
read through the REST API).

Whatever ends the run (its end, a failure, an exception, SIGINT, SIGTERM), it stops what it started:
the demo's process group (the Spark driver with it), the Airflow cluster (scheduler first, the
workers with their task processes), Redis, PostgreSQL, the Spark workers with their executors, the
master, the S3 server, then any other process it started that still runs.

Files, under --work-dir: the Airflow home of these runs (runs/ with the bulk path's Spark log, logs/
with each task's log), services/ (s3-server.log, spark-master.log, spark-worker-<n>.log, and each
executor's stdout and stderr under spark-worker-<n>-work/<application>/<executor>/; postgres/,
redis/, airflow/ with each Airflow process's log), and the config it ran (cluster-demo.yaml). The
lakehouse lives in the S3 server's memory and the metadata DB in a new PostgreSQL cluster; both go
with their servers.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import psutil
import typer
import yaml

from gem import storage
from gem.config import REPO_ROOT, GemConfig, load_config
from gem.environment import RETRIES_ENV, RETRY_DELAY_ENV
from gem.lakehouse.spark import C1_JVM_CONF, EXECUTOR_JAVA_OPTIONS, JAVA_OPTIONS, cluster_class_archives
from gem.pipeline.airflow.api import TaskRun, airflow_api
from gem.pipeline.airflow.orchestration import DAG_ID
from gem.pipeline.airflow.runs import TaskReporter, airflow_env, now
from gem.pipeline.airflow.stack import AirflowCluster, trigger_day, unpause, wait_for_run
from gem.pipeline.cli import job_app, run_command
from gem.pipeline.demo import DEFAULT_CONFIG, ConfigFile, DemoRun, demo_days, report
from gem.pipeline.demo_process import STAGE_RUN, parse_stage_run
from gem.pipeline.services import PostgresServer, RedisServer, S3Server, SparkCluster, stop_group
from gem.train import checkpoint
from gem.train.promotion import checkpoint_root

DEFAULT_WORK_DIR = REPO_ROOT / ".airflow" / "cluster-demo"
DEFAULT_BUCKET = "gem-demo"
WORKERS = 2
# Cores each worker offers: the machine's two. An application takes one executor of WORKER_CORES task
# slots on one worker, so its tasks share one JVM (one start-up, one JIT warm-up), and two
# applications at once (two Celery tasks) each find a worker free instead of the second waiting for
# the first's executors to go.
WORKER_CORES = 2
# Memory each worker offers its one executor, and the executor's heap: two executors and the driver
# (DRIVER_MEMORY) stay well inside a 24 GiB machine beside the training process.
WORKER_MEMORY = "2g"
DRIVER_MEMORY = "2g"
# What the cluster adds to the demo's `spark.conf`: one executor per application with a worker's
# cores and memory; the driver on 127.0.0.1, which the workers' loopback addresses reach; C1-only JIT
# in the driver and the executors: each Airflow task is its own short Spark application, whose JVMs
# would otherwise spend much of their CPU compiling with C2.
CLUSTER_SPARK_CONF = {
    **C1_JVM_CONF,
    "spark.driver.host": "127.0.0.1",
    "spark.executor.cores": str(WORKER_CORES),
    "spark.executor.memory": WORKER_MEMORY,
    "spark.cores.max": str(WORKER_CORES),
}
# The Airflow days' pretraining: torchrun on two "nodes" of one process each, their agents on these
# loopback addresses, meeting at a c10d rendezvous on the first (launcher.local_nodes).
TRAINING_NODES = ("127.0.0.2", "127.0.0.3")
S3_SERVER = "S3 API server"
SPARK_CLUSTER = "Spark cluster"
POSTGRES = "PostgreSQL"
REDIS = "Redis"
AIRFLOW = "Airflow cluster"
# An Airflow day's run on the cluster; a demo day on 2 cores takes a fraction of it.
RUN_TIMEOUT_S = 3 * 3600.0
# How long the bulk path's process group has to exit after SIGTERM, when the demo stops early.
STOP_TIMEOUT_S = 20.0
# How long stragglers (a process started here that outlived its service's stop) get after SIGTERM.
SWEEP_TIMEOUT_S = 10.0


def cluster_config(base: Mapping[str, Any], bucket: str, master_url: str) -> dict[str, Any]:
    """The demo's config (`base`, as read from its YAML) on the cluster topology: the lakehouse in the
    bucket (the landing zone beside it, where `base` puts it elsewhere), `spark.master` the cluster's
    URL, the executors' and the driver's memory capped; everything else as in `base`."""
    cfg = copy.deepcopy(dict(base))
    cfg["lakehouse_uri"] = f"s3://{bucket}/lakehouse"
    if cfg.get("landing_uri"):
        cfg["landing_uri"] = f"s3://{bucket}/landing"
    spark = dict(cfg.get("spark") or {})
    spark.update(master=master_url, driver_memory=DRIVER_MEMORY, conf={**spark.get("conf", {}), **CLUSTER_SPARK_CONF})
    cfg["spark"] = spark
    cfg["launcher"] = {**(cfg.get("launcher") or {}), "kind": "torchrun", "local_nodes": list(TRAINING_NODES)}
    return cfg


def prepare_class_archives(config: Path, work_dir: Path) -> tuple[Path, Path]:
    """The class archives of the drivers and executors of the cluster demo on `config`
    (gem.lakehouse.spark.cluster_class_archives: made where missing, on a local-cluster master,
    starting no service), with a line saying which and how long it took. `make setup` runs this, so
    that the demo itself finds them."""
    t0 = time.monotonic()
    work_dir = work_dir.resolve()
    (work_dir / "services").mkdir(parents=True, exist_ok=True)
    cfg_path = work_dir / "class-archives.yaml"
    # The master's URL is the cluster's to be; the workload runs on a local-cluster master.
    cluster_cfg = cluster_config(yaml.safe_load(config.read_text()) or {}, DEFAULT_BUCKET, "spark://127.0.0.1:7077")
    cfg_path.write_text(yaml.safe_dump(cluster_cfg, sort_keys=False))
    driver, executor = cluster_class_archives(load_config(cfg_path), cfg_path, work_dir / "services" / "class-workload.log")
    print(f"JVM class archives of the cluster's drivers and executors: {driver.parent}/{driver.name}, "
          f"{executor.name} (ready in {time.monotonic() - t0:.0f}s; made by a small Delta job at set-up or "
          f"on the first run, reused after)", flush=True)
    return driver, executor


def with_class_archives(cfg: Mapping[str, Any], driver: Path, executor: Path) -> dict[str, Any]:
    """`cfg` (cluster_config's) with the drivers and the executors started from their class archives:
    every Airflow task is its own Spark application, whose two JVMs then map the classes Spark and
    Delta load instead of loading and verifying them."""
    spark = dict(cfg["spark"])
    conf = dict(spark.get("conf") or {})
    for option, archive in ((JAVA_OPTIONS, driver), (EXECUTOR_JAVA_OPTIONS, executor)):
        conf[option] = f"{conf.get(option, '')} -XX:SharedArchiveFile={archive}".strip()
    return {**cfg, "spark": {**spark, "conf": conf}}


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwinds like KeyboardInterrupt, so every service's stop runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside the block (the stop of what was started finishes)."""
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def stop_stragglers(started: Sequence[psutil.Process]) -> list[str]:
    """SIGTERM, then SIGKILL after SWEEP_TIMEOUT_S, to each process of `started` still running ->
    a description of each one that had to be stopped here."""
    running = []
    for process in started:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.Error:
            continue
    described = []
    for process in running:
        with contextlib.suppress(psutil.Error):
            described.append(f"pid {process.pid} ({' '.join(process.cmdline())[:120]})")
            process.terminate()
    _, alive = psutil.wait_procs(running, timeout=SWEEP_TIMEOUT_S)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=SWEEP_TIMEOUT_S)
    return described


@dataclass
class Topology:
    """The services of the local cluster topology, started in order and stopped in reverse, with the
    seconds each took to start and to stop."""

    work_dir: Path
    bucket: str = DEFAULT_BUCKET
    s3: S3Server = field(init=False)
    spark: SparkCluster = field(init=False)
    postgres: PostgresServer = field(init=False)
    redis: RedisServer = field(init=False)
    airflow: AirflowCluster | None = field(default=None, init=False)
    seconds: dict[tuple[str, str], float] = field(default_factory=dict, init=False)  # (service, start|stop)
    stragglers: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        logs = self.work_dir / "services"
        self.s3 = S3Server(logs)
        self.spark = SparkCluster(logs, workers=WORKERS, worker_cores=WORKER_CORES, worker_memory=WORKER_MEMORY)
        self.postgres = PostgresServer(logs / "postgres")
        self.redis = RedisServer(logs / "redis")

    def _timed(self, name: str, what: str, step: Callable[[], object]) -> None:
        t0 = time.monotonic()
        step()
        self.seconds[name, what] = time.monotonic() - t0

    def start(self) -> None:
        """The S3 server (its AWS variables into this process's environment, then the bucket), then
        the Spark cluster, whose daemons and executors inherit the variables."""
        self._timed(S3_SERVER, "start", self.s3.start)
        os.environ.update(self.s3.environment())
        storage.filesystem("s3://").mkdir(self.bucket)
        print(f"S3 API server at {self.s3.endpoint} (bucket {self.bucket}): ready in "
              f"{self.seconds[S3_SERVER, 'start']:.0f}s", flush=True)
        self._timed(SPARK_CLUSTER, "start", self.spark.start)
        print(f"Spark master at {self.spark.master_url} with {WORKERS} workers "
              f"({', '.join(self.spark.worker_host(i) for i in range(WORKERS))}; {WORKER_CORES} cores, {WORKER_MEMORY} each): "
              f"ready in {self.seconds[SPARK_CLUSTER, 'start']:.0f}s; services' logs: {self.s3.log_dir}", flush=True)

    def start_airflow(self, env: Mapping[str, str]) -> AirflowCluster:
        """PostgreSQL and Redis, then the Airflow cluster on them (WORKERS Celery workers) with the
        Airflow environment `env` (the demo's config, the S3 server's variables)."""
        self._timed(POSTGRES, "start", self.postgres.start)
        self._timed(REDIS, "start", self.redis.start)
        self.airflow = AirflowCluster(env, self.postgres.url, self.redis.url, self.work_dir / "services" / "airflow",
                                      workers=WORKERS)
        self._timed(AIRFLOW, "start", self.airflow.start)
        print(f"Airflow cluster at {self.airflow.api_url}: metadata DB on PostgreSQL {self.postgres.host}:"
              f"{self.postgres.port}, Celery broker Redis {self.redis.host}:{self.redis.port}, workers "
              f"{', '.join(self.airflow.worker_names())} (1 task slot each): ready in "
              f"{sum(self.seconds[name, 'start'] for name in (POSTGRES, REDIS, AIRFLOW)):.0f}s; "
              f"logs: {self.airflow.logs}", flush=True)
        return self.airflow

    def stop(self) -> None:
        """The Airflow cluster, Redis and PostgreSQL, the Spark workers (their executors with them) and
        master, the S3 server, then any other process this one started that still runs (what the
        services' own stops missed)."""
        started = psutil.Process().children(recursive=True)
        if self.airflow is not None:
            self._timed(AIRFLOW, "stop", self.airflow.stop)
        for name, service in ((REDIS, self.redis), (POSTGRES, self.postgres)):
            if service.process is not None:
                self._timed(name, "stop", service.stop)
        self._timed(SPARK_CLUSTER, "stop", self.spark.stop)
        self._timed(S3_SERVER, "stop", self.s3.stop)
        self.stragglers = stop_stragglers(started)

    def summary(self) -> str:
        lines = []
        services = ((S3_SERVER, self.s3.endpoint), (SPARK_CLUSTER, self.spark.master_url),
                    (POSTGRES, f"{self.postgres.host}:{self.postgres.port}"), (REDIS, self.redis.url),
                    (AIRFLOW, self.airflow.api_url if self.airflow is not None else ""))
        for name, where in services:
            took = [f"{done} in {self.seconds[name, what]:.0f}s" for what, done in (("start", "started"), ("stop", "stopped"))
                    if (name, what) in self.seconds]
            lines.append(f"  {name + ' ' + where:<44} {', '.join(took) or 'not started'}")
        lines += [f"  stopped after its service: {s}" for s in self.stragglers]
        return "\n".join(lines)


def run(config: Path, work_dir: Path, bucket: str) -> int:
    """Start the topology, run the demo's days on it and print the summary, then stop the topology
    (also on a failure or an interrupt) -> the demo's exit status (128 + the signal's number when
    interrupted)."""
    started = time.time()
    work_dir = work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    # The Airflow home of these runs (task logs, secrets); the metadata DB is a new PostgreSQL
    # cluster each run, as the lakehouse is new.
    os.environ["AIRFLOW_HOME"] = str(work_dir)
    topology = Topology(work_dir, bucket)
    ran = DemoRun()
    saved = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        topology.start()
        cfg_path = work_dir / "cluster-demo.yaml"
        demo_cfg = yaml.safe_load(config.read_text()) or {}
        archives = prepare_class_archives(config, work_dir)
        cluster_cfg = cluster_config(demo_cfg, bucket, topology.spark.master_url)
        cfg_path.write_text(yaml.safe_dump(with_class_archives(cluster_cfg, *archives), sort_keys=False))
        cfg = load_config(cfg_path)
        print(f"config: {cfg_path} ({config} with the lakehouse at {cfg.lakehouse_uri} and Spark on "
              f"{cfg.spark.master})", flush=True)
        bulk, daily = demo_days(cfg)
        env = airflow_env(cfg, cfg_path)
        env.setdefault(RETRIES_ENV, "1")
        env.setdefault(RETRY_DELAY_ENV, "10")  # a demo fails fast instead of waiting 5 minutes
        if bulk:
            run_bulk_days(cfg_path, env, bulk, ran, work_dir / "runs" / f"bulk-{bulk[0]}..{bulk[-1]}.spark.log")
        if daily:
            run_airflow_days(topology.start_airflow(env), daily, ran, work_dir)
            for ds in daily:
                print(pretraining_ranks(cfg, ds), flush=True)
        return report(cfg_path, cfg, ran, started)
    except Interrupted as interrupted:
        print(f"cluster demo: {interrupted} received; stopping what it started", file=sys.stderr, flush=True)
        return 128 + interrupted.signum
    finally:
        with signals_ignored():
            topology.stop()
        for s, handler in saved.items():
            signal.signal(s, handler)
        print("== cluster services (all stopped) ==")
        print(topology.summary())
        print(f"  cluster demo wall time: {time.time() - started:.0f}s", flush=True)
        if ran.airflow_tasks:
            print("== Airflow tasks by Celery worker (each task instance's hostname, from the REST API) ==")
            print(tasks_by_worker(ran.airflow_tasks), flush=True)


def pretraining_ranks(cfg: GemConfig, ds: str) -> str:
    """How many ranks trained the model of mixture day `ds`, as its last checkpoint records them."""
    last = checkpoint.latest(checkpoint.child(checkpoint_root(cfg), f"{cfg.model.arch}-{ds}"))
    if last is None:
        return f"pretrain ds={ds}: no checkpoint (it did not train)"
    return (f"pretrain ds={ds}: trained by {checkpoint.read_extra(last)['world_size']} ranks on torchrun nodes "
            f"{', '.join(cfg.launcher.local_nodes)} (world size from its last checkpoint, {last})")


def tasks_by_worker(airflow_tasks: Mapping[str, Sequence[TaskRun]]) -> str:
    """One line per task of each Airflow run (by the day it processed) with the worker it ran on, in
    the order the tasks started, then how many tasks each worker ran over all the runs."""
    lines = []
    for ds, tasks in airflow_tasks.items():
        for t in sorted(tasks, key=lambda t: (t.start is None, t.start or dt.datetime.min.replace(tzinfo=dt.UTC))):
            lines.append(f"  {ds}  {t.task_id:<20} {t.state or 'no state':<16} {t.hostname or 'no worker'}")
    lines.append(f"  tasks per worker: {tasks_per_worker(t for tasks in airflow_tasks.values() for t in tasks)}")
    return "\n".join(lines)


def tasks_per_worker(tasks: Iterable[TaskRun]) -> str:
    """How many of `tasks` each worker ran (by hostname; tasks that never reached one not counted)."""
    per_worker = Counter(t.hostname for t in tasks if t.hostname)
    return ", ".join(f"{host} {n}" for host, n in sorted(per_worker.items())) or "none ran on a worker"


def run_bulk_days(cfg_path: Path, env: Mapping[str, str], days: list[str], ran: DemoRun, log: Path) -> None:
    """The bulk days through gem.pipeline.demo_process (every stage in one process and Spark
    application, in its own process group), one line per stage as it finishes (into `ran`); Spark's
    log goes to `log`. Exits on a failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"bulk path ds={days[0]}..{days[-1]} in one process and one Spark application; Spark's log: {log}",
          flush=True)
    command = (f". infra/airflow/airflow_env.sh && exec {sys.executable} -m gem.pipeline.demo_process "
               f"--config {cfg_path} --bulk-start {days[0]} --bulk-end {days[-1]}")
    t0 = time.time()
    with open(log, "w") as err:
        proc = subprocess.Popen(["bash", "-c", command], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            word, _, rest = line.rstrip("\n").partition(" ")
            if word == STAGE_RUN:
                ran.bulk_runs.append(parse_stage_run(rest))
                print(ran.bulk_runs[-1].line(), flush=True)
            else:
                print(line.rstrip("\n"), flush=True)
        if proc.wait() != 0:
            raise SystemExit(f"cluster demo failed: the bulk path exited with {proc.returncode}; see {log}")
    finally:
        stop_group(proc, STOP_TIMEOUT_S)
    ran.parts.append((f"bulk path ds={days[0]}..{days[-1]}", time.time() - t0))


def run_airflow_days(cluster: AirflowCluster, days: list[str], ran: DemoRun, work_dir: Path) -> None:
    """Each day a DAG run triggered through the cluster's REST API, run by its scheduler on the
    Celery workers, one after the other: one line per task as it finishes, then the run's state and
    how many tasks each worker ran (into `ran`). Exits when a run failed."""
    with airflow_api(cluster.environment(), work_dir / "runs" / "client-api-server.log") as api:
        unpause(api)
        for ds in days:
            t0 = time.time()
            run_id = trigger_day(api, ds)
            logs = work_dir / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}"
            print(f"gem_daily ds={ds}: run {run_id} on the Celery workers; task logs: {logs}", flush=True)
            reporter = TaskReporter(api, ds, now(), lambda task: print(task, flush=True), run_id=run_id)
            run = wait_for_run(api, run_id, RUN_TIMEOUT_S, on_poll=reporter.report)
            reporter.report(wait=True)
            ran.airflow_tasks[ds] = reporter.tasks
            print(f"gem_daily ds={ds}: {run.state}; tasks per worker: {tasks_per_worker(reporter.tasks)}", flush=True)
            if run.state != "success":
                failed = [t.task_id for t in reporter.tasks if t.state in ("failed", "upstream_failed")]
                raise SystemExit(f"cluster demo failed: the gem_daily run of ds={ds} failed ({', '.join(failed)}); "
                                 f"see the task logs under {logs}")
            ran.parts.append((f"gem_daily run of ds={ds} (Celery workers)", time.time() - t0))


def command_line(
    config: ConfigFile = DEFAULT_CONFIG,
    work_dir: Annotated[Path, typer.Option(
        help="where its Airflow home, services' logs and config go", file_okay=False)] = DEFAULT_WORK_DIR,
    bucket: Annotated[str, typer.Option(help="the S3 bucket the lakehouse goes in")] = DEFAULT_BUCKET,
    class_archives_only: Annotated[bool, typer.Option(
        "--class-archives-only", help="only make the JVM class archives the cluster's drivers and executors "
                                      "start from (`make setup` does), starting no service")] = False,
) -> int:
    """Start the S3 API server and a Spark master with two workers, run the demo's days on them (the
    bulk path, then Airflow on PostgreSQL and two Celery workers), print the summary, and stop
    everything it started."""
    if class_archives_only:
        prepare_class_archives(config, work_dir)
        return 0
    return run(config, work_dir, bucket)


def main(argv: Sequence[str] | None = None) -> int:
    app = job_app("python -m gem.pipeline.cluster_demo")
    app.command(help=__doc__.split("\n\n")[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
