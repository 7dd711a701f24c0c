"""Scheduling glue shared by the DAGs: which partition a run processes, the schedule, job commands.

Kept light on purpose (stdlib only at import; Airflow is imported lazily in `daily_timetable`):
the DAG processor imports this on every parse, so it must never pull in pyspark, torch, pandas or
great_expectations.

The one rule for dates: a run processes the partition `ds = UTC date of data_interval_start`.
With `CronDataIntervalTimetable("0 0 * * *", "UTC")` a run covers [D 00:00, D+1 00:00) and
processes ds=D; the scheduler starts it at D+1 00:00, once the day is complete. Nothing derives
a date from now(), and nothing uses `{{ ds }}`, because `{{ ds }}` is the *logical date*, which is
not always the interval start (see below).

Manual runs (`airflow dags test gem_daily DATE`, `dag.test(logical_date=DATE)`) in Airflow 3.3
infer their interval with `infer_manual_data_interval(run_after=DATE)`: the last *complete* day
before DATE, i.e. [D, D+1) for any DATE in (D+1 00:00, D+2 00:00]. The logical date stays DATE.
Scheduled and backfill runs take their interval's start as logical date (a midnight), and a DAG
holds one run per logical date: a manual run for ds=D at D+1 00:00 would take the date of the
scheduler's or a backfill's run for D+1 (a backfill would even clear and rerun it as D+1 while it
still processes D). So manual runs go one second after their interval closes. Verified on 3.3.2:

    airflow dags test gem_daily 2026-01-02T00:00:01+00:00    # processes ds=2026-01-01

`manual_logical_date(ds)` gives that date for a ds (gem.pipeline.airflow.runs.run_day uses it).

A run's conf may name a stage to start from ({"from_stage": S}, set by `gem backfill --from-stage`):
the tasks of the stages before S in the registry then succeed without running, and S onward run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gem.days import DEFAULT_START_DS
from gem.environment import (
    BACKFILL_POKE_ENV,
    CONFIG_FILE_ENV,
    DAG_START_ENV,
    LANDING_POKE_ENV,
    LANDING_TIMEOUT_ENV,
    RETRIES_ENV,
    RETRY_DELAY_ENV,
)
from gem.lakehouse.stages import STAGES, Stage

if TYPE_CHECKING:
    from airflow.sdk import Asset, CronDataIntervalTimetable

    from gem.config import GemConfig, LauncherConfig

REPO_ROOT = Path(__file__).resolve().parents[3]

DAG_ID = "gem_daily"
DAILY_CRON = "0 0 * * *"
SCHEDULE_TZ = "UTC"
# First day of the pipeline: the config's default (gem.days.DEFAULT_START_DS), not a config read, so
# parsing does not depend on the DAG processor's $GEM_CONFIG. A pipeline that starts elsewhere (an imported history: MovieLens-1M starts in 2000) sets DAG_START_ENV in the
# DAG processor's environment to its config's start_ds (`gem run` does): Airflow creates no task
# instance for a run whose logical date is before the DAG's start date.
START_DS = DEFAULT_START_DS
# How long after its interval closes a manual run of a day is dated (see the module docstring).
MANUAL_RUN_AFTER_CLOSE = dt.timedelta(seconds=1)
# The dag-run conf key naming the stage a run starts from (`gem backfill --from-stage`).
FROM_STAGE_CONF = "from_stage"
# A task's run day and its run's from_stage, as Jinja expressions its operator renders: the task
# arguments of gem.pipeline.airflow.daily_dag and the cluster jobs' manifests (gem.deploy.manifests).
DAY_EXPR = "{{ partition_ds(data_interval_start) }}"
FROM_STAGE_EXPR = f"{{{{ (dag_run.conf or {{}}).get('{FROM_STAGE_CONF}', '') }}}}"
# The stages whose tasks launch as the config's `launcher` says (gem.config.LauncherConfig); every
# other stage runs in its task's process. Of them, the stages whose job joins torchrun's process
# group (gem.train.daily) run launcher.nproc_per_node processes per node; the others run one.
LAUNCHED_STAGES = ("pretrain", "precompute", "distill")
DISTRIBUTED_STAGES = ("pretrain",)
# The metadata DB URL the torchrun-launched processes see (run_stage_torchrun): none they could use.
DB_URL_VARIABLES = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__SQL_ALCHEMY_CONN")
LAUNCHED_DB_URL = "sqlite://"
# Seconds a torchrun node has to stop after SIGTERM when another node of its run failed.
STOP_TIMEOUT_S = 30.0
# The variables whose presence makes a parse read the config for its launcher (parse_config).
LAUNCHER_ENV_PREFIX = "GEM__LAUNCHER"

# Retries: jobs are idempotent partition replaces, so a retry is safe. The env knobs exist so the
# end-to-end test and demos can fail fast; production leaves them unset.
DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY_S = 300
# A stage job (python -m jobs.<module>) exits with this when nothing is ready on the day; its DAG
# task is skipped instead (gem.pipeline.airflow.orchestration.run_stage_task).
NOTHING_READY_EXIT = 99
# The sensor task that waits for the `_SUCCESS` markers of the landing partitions the landing-reading
# stages need (gem.lakehouse.stages.Stage.reads_landing); reschedule mode frees its worker slot
# between pokes. Its poke interval and timeout are env knobs like the retries (tests poke fast).
LANDING_SENSOR = "wait_for_landing"
DEFAULT_LANDING_POKE_S = 300
DEFAULT_LANDING_TIMEOUT_S = 24 * 3600
# How often a task held by a running backfill (gem.lakehouse.backfill_hold) tries again.
DEFAULT_BACKFILL_POKE_S = 60
# The failure callback appends one JSON line per failed task try here (under $AIRFLOW_HOME).
TASK_FAILURES_FILE = "gem_task_failures.jsonl"
# Asset URIs of the lakehouse tables: the `x-` scheme marks them as this project's own (Airflow
# leaves such URIs as they are); the name is the table's, e.g. "silver.user_sequences".
ASSET_SCHEME = "x-gem-lakehouse"
# The Airflow pool GPU stages queue in (gem.lakehouse.stages.GPU_POOL; infra/airflow/init_db.sh creates it
# with one slot per GPU host; on the embedded default the job trains on CPU, still one at a time).
GPU_POOL_SLOTS = 1


def partition_ds(data_interval_start: dt.datetime | None) -> str:
    """The partition a run processes: the UTC date of its data interval start, as YYYY-MM-DD."""
    if data_interval_start is None:
        raise ValueError("run has no data interval (asset-triggered or logical_date=None); cannot derive ds")
    if data_interval_start.tzinfo is None:
        raise ValueError(f"data_interval_start {data_interval_start!r} is naive; expected an aware datetime")
    return data_interval_start.astimezone(dt.UTC).date().isoformat()


def manual_logical_date(ds: str) -> str:
    """The logical date to give `airflow dags test` / `dag.test` so that the run processes `ds`: one
    second after ds's interval closes, never a scheduled or backfill run's (a midnight)."""
    closes = dt.datetime.fromisoformat(ds).replace(tzinfo=dt.UTC) + dt.timedelta(days=1)
    return (closes + MANUAL_RUN_AFTER_CLOSE).isoformat()


def daily_timetable() -> CronDataIntervalTimetable:
    """Daily data intervals at UTC midnight: run for [D, D+1) starts at D+1 and processes ds=D.

    Explicit because a bare cron string means CronTriggerTimetable in Airflow 3 (start == end).
    """
    from airflow.sdk import CronDataIntervalTimetable

    return CronDataIntervalTimetable(DAILY_CRON, timezone=SCHEDULE_TZ)


def start_date() -> dt.datetime:
    """The DAG's start date: $GEM_DAG_START_DS, else START_DS (midnight UTC)."""
    day = os.environ.get(DAG_START_ENV) or START_DS
    try:
        return dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    except ValueError:
        raise ValueError(f"${DAG_START_ENV} must be a day written YYYY-MM-DD, got {day!r}") from None


def may_skip(stage: Stage) -> bool:
    """Whether "nothing ready yet" is a skip for this stage (its job's exit 99), else a failure:
    stages that work out their own day (ready_on) or are declared skippable."""
    return stage.ready_on or stage.skippable


def run_stage_task(stage_name: str, run_day: str, from_stage: str = "") -> str:
    """A stage's Airflow task: the stage's own entry point (`Stage.entry` in jobs.<module>, what its
    command line runs) for the run's day, in the task's process, against the config the worker's
    environment names ($GEM_CONFIG, GEM__* overrides). -> its summary line.

    In the task's process rather than a `python -m jobs.<module>` child: the Spark stages' sessions
    then belong to the process that runs the task, so where several tasks run in one process
    (`airflow dags test`, i.e. `gem run` and `make demo`) they share one warm JVM (far faster than
    a cold child process per task; gem/pipeline/bulk.py), and under an executor each task's
    process opens its own, as the child did. Nothing ready yet raises AirflowSkipException where
    the stage may skip (`may_skip`), and fails the task elsewhere. A day that reads one a running
    backfill rewrites (gem.lakehouse.backfill_hold) is rescheduled every $GEM_BACKFILL_POKE_S seconds
    until the backfill has finished, without spending its retries.

    `from_stage` (the run's conf, FROM_STAGE_CONF): a stage before it in the registry does not run;
    its task succeeds, and its records of the day stay as they are for the stages after it to read.
    """
    if before_start(stage_name, from_stage):
        message = f"{stage_name}: not rerun (this run starts at {from_stage}); its record of run day {run_day} stays"
        print(message, flush=True)
        return message
    from airflow.sdk.exceptions import AirflowSkipException

    from gem.config import load_config
    from gem.lakehouse.backfill_hold import BackfillInProgressError
    from gem.lakehouse.commit import StageContext
    from gem.lakehouse.stages import stage as registry_stage
    from gem.pipeline.bulk import run_stage
    from gem.quality.gate import GateError

    stage = registry_stage(stage_name)
    try:
        run = run_stage(StageContext(load_config()), stage, run_day)
    except BackfillInProgressError as waiting:
        raise backfill_reschedule(waiting) from waiting
    except GateError as failed:  # a critical gate: its lines name the backfill that reruns the day from here
        config = os.environ.get(CONFIG_FILE_ENV)
        failed.rerun = (f"gem backfill --start {run_day} --end {run_day} --from-stage {stage_name}"
                        + (f" --config {config}" if config else ""))
        raise
    # What ran for which day, in the task's log (the DAG's day rules are checked against it).
    print(f"{stage_name}: run day {run_day} -> ds={run.ds} {run.state} in {run.seconds:.1f}s", flush=True)
    if run.summary:
        print(run.summary, flush=True)
    if run.state == "skipped":
        if may_skip(stage):
            raise AirflowSkipException(f"{stage_name}: nothing ready on run day {run_day}")
        raise RuntimeError(f"{stage_name} ds={run.ds}: published nothing, and this stage must publish every day")
    return run.summary


def parse_config() -> GemConfig | None:
    """The config the DAG processor's environment names ($GEM_CONFIG, GEM__ variables), read when the
    DAG is parsed for its `launcher` section; None (the defaults: every task in its own process) when
    neither $GEM_CONFIG nor a GEM__LAUNCHER* variable is set, and gem.config is then not imported."""
    if not os.environ.get(CONFIG_FILE_ENV) and not any(k.upper().startswith(LAUNCHER_ENV_PREFIX) for k in os.environ):
        return None
    from gem.config import load_config

    return load_config()


def launch_kind(stage_name: str, cfg: GemConfig | None) -> str:
    """How a stage's task runs its stage: the config's launcher.kind for LAUNCHED_STAGES,
    "in_process" for every other stage and without a config."""
    return cfg.launcher.kind if cfg is not None and stage_name in LAUNCHED_STAGES else "in_process"


def stage_processes(stage_name: str, launcher: LauncherConfig) -> int:
    """The processes a launched stage runs per node: launcher.nproc_per_node for DISTRIBUTED_STAGES,
    one for the others (they join no process group)."""
    return launcher.nproc_per_node if stage_name in DISTRIBUTED_STAGES else 1


def stage_nodes(stage_name: str, launcher: LauncherConfig) -> tuple[str, ...]:
    """The torchrun nodes on this host a launched stage runs on: launcher.local_nodes for
    DISTRIBUTED_STAGES, none (one standalone node) for the others."""
    return launcher.local_nodes if stage_name in DISTRIBUTED_STAGES else ()


def run_stage_torchrun(stage_name: str, run_day: str, from_stage: str = "") -> str:
    """A launched stage's Airflow task under `launcher.kind: torchrun`: what run_stage_task does, in
    torchrun processes on the worker's host (`stage_processes` of them per node, on one standalone
    node or on the `stage_nodes` addresses, from the worker's config) started from this task's process
    with its environment. Every rank runs gem.deploy.launch; rank 0 writes the outcome, from which the
    task skips or is rescheduled as the in-process task would be. -> the stage's summary line. A node
    whose torchrun fails (any rank's failure) fails the task; the other nodes are then stopped."""
    import ipaddress
    import subprocess
    import tempfile

    from airflow.sdk.exceptions import AirflowRescheduleException, AirflowSkipException

    from gem.config import load_config
    from gem.deploy.launch import read_outcome, torchrun_commands

    launcher = load_config().launcher
    processes, nodes = stage_processes(stage_name, launcher), stage_nodes(stage_name, launcher)
    # Airflow's task runner masks the metadata DB's URL in the task's environment with one SQLAlchemy
    # cannot parse, and the launched processes import airflow (its exceptions), which configures an
    # engine at import: they get an in-memory SQLite URL instead, so they stay off the DB as well.
    env = dict(os.environ) | {key: LAUNCHED_DB_URL for key in DB_URL_VARIABLES}
    if nodes:
        # The nodes share this host's cores: torch's default (a thread per core in every rank) would
        # run more threads than cores, and OpenMP's threads spin waiting for descheduled partners.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (len(nodes) * processes))))
        if all(ipaddress.ip_address(node).is_loopback for node in nodes):
            env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's connections between loopback "nodes" stay on lo
    with tempfile.TemporaryDirectory(prefix=f"gem-{stage_name}-") as folder:
        result = Path(folder) / "outcome.json"
        commands = torchrun_commands(stage_name, run_day, from_stage, processes, result, nodes)
        where = f"{len(nodes)} nodes ({', '.join(nodes)})" if nodes else "one node"
        print(f"{stage_name}: launching {processes} process(es) per node on {where} under torchrun:\n"
              + "\n".join(" ".join(command) for command in commands), flush=True)
        # In this task's process group: a worker killed with its group (a lost node) takes them along.
        launched = [subprocess.Popen(command, cwd=REPO_ROOT, env=env) for command in commands]
        try:
            codes = [process.poll() for process in launched]
            # A node that fails ends the run: the others would wait for it at their next collective.
            while None in codes and not any(codes):
                time.sleep(0.5)
                codes = [process.poll() for process in launched]
        finally:
            for process in launched:
                if process.poll() is None:
                    process.terminate()  # torchrun's agent passes it on to its ranks
                    try:
                        process.wait(timeout=STOP_TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
        codes = [process.returncode for process in launched]
        if any(codes):
            raise RuntimeError(f"{stage_name} run day {run_day}: torchrun exited with "
                               f"{', '.join(str(code) for code in codes)} on {where} (the processes' output is above)")
        outcome = read_outcome(result)
    if outcome.state == "skipped":
        raise AirflowSkipException(outcome.message)
    if outcome.state == "rescheduled":
        raise AirflowRescheduleException(dt.datetime.fromisoformat(outcome.until))
    return outcome.message


def backfill_reschedule(waiting: Exception) -> Exception:
    """The exception that puts a task waiting for a running backfill back in the queue: rescheduled
    like a sensor in reschedule mode, $GEM_BACKFILL_POKE_S seconds on, without spending a retry."""
    from airflow.sdk.exceptions import AirflowRescheduleException

    poke_s = float(os.environ.get(BACKFILL_POKE_ENV) or DEFAULT_BACKFILL_POKE_S)
    print(f"waiting for a backfill: {waiting}; trying again in {poke_s:.0f}s", flush=True)
    return AirflowRescheduleException(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=poke_s))


def before_start(stage_name: str, from_stage: str) -> bool:
    """Whether stage_name comes before from_stage in the registry ("" starts at the first stage);
    an unknown from_stage is an error, so a typo never silently reruns everything."""
    if not from_stage:
        return False
    names = [s.name for s in STAGES]
    if from_stage not in names:
        raise ValueError(f"from_stage {from_stage!r} is not a stage; the stages in order: {', '.join(names)}")
    return names.index(stage_name) < names.index(from_stage)


def default_args() -> dict[str, Any]:
    """Task defaults: retries (idempotent jobs), a timeout so a hung Spark job cannot hold the run,
    the failure record. depends_on_past is set per task from the registry (`depends_on_past`)."""
    return {
        "owner": "gem",
        "retries": int(os.environ.get(RETRIES_ENV, DEFAULT_RETRIES)),
        "retry_delay": dt.timedelta(seconds=int(os.environ.get(RETRY_DELAY_ENV, DEFAULT_RETRY_DELAY_S))),
        "execution_timeout": dt.timedelta(hours=2),
        "depends_on_past": False,
        "on_failure_callback": record_task_failure,
    }


def depends_on_past(stage: Stage) -> bool:
    """A stage that carries state from its previous day (it needs its own record of D-1) waits for
    its task of the previous run, so no day is built on a yesterday that failed or never ran."""
    return stage.carries_state


def table_asset(table: str) -> Asset:
    """The Airflow Asset of a lakehouse table, e.g. x-gem-lakehouse://silver/user_sequences."""
    from airflow.sdk import Asset

    layer, _, name = table.partition(".")
    return Asset(name=table, uri=f"{ASSET_SCHEME}://{layer}/{name}", group="gem-lakehouse")


def stage_assets(stage: Stage) -> list[Asset]:
    """The Assets a stage's task updates: one per table its registry declaration writes."""
    return [table_asset(w.table) for w in stage.writes]


def landing_sensor_settings() -> dict[str, Any]:
    """The landing sensor's poke interval and timeout (seconds), from the env knobs."""
    return {
        "poke_interval": float(os.environ.get(LANDING_POKE_ENV, DEFAULT_LANDING_POKE_S)),
        "timeout": float(os.environ.get(LANDING_TIMEOUT_ENV, DEFAULT_LANDING_TIMEOUT_S)),
    }


def landing_ready(ds: str) -> bool:
    """The landing sensor's poke: whether every landing partition the run of ds reads has its
    `_SUCCESS` marker (under the worker's config: $GEM_CONFIG). Prints what it still waits for."""
    from gem.config import load_config
    from gem.lakehouse.landing import completed_manifest, marker_uri

    cfg = load_config()
    days = sorted({d for s in STAGES if s.reads_landing for d in s.landing_days(cfg, ds)})
    waiting = [d for d in days if completed_manifest(cfg.landing_root, d) is None]
    for day in waiting:
        print(f"waiting for {marker_uri(cfg.landing_root, day)} (source {cfg.source!r})")
    return not waiting


def task_failures_path(airflow_home: str | os.PathLike[str] | None = None) -> Path:
    """Where record_task_failure appends: $AIRFLOW_HOME/gem_task_failures.jsonl."""
    home = airflow_home or os.environ.get("AIRFLOW_HOME") or REPO_ROOT / ".airflow"
    return Path(home) / TASK_FAILURES_FILE


def record_task_failure(context: Any) -> None:
    """on_failure_callback: append which task of which run failed, on which try, and why (the
    exception's type and message, and the try's log in Airflow's UI) as one JSON line to
    task_failures_path(); `gem status` lists them."""
    ti = context.get("ti") or context.get("task_instance")
    run = context.get("dag_run")
    error = context.get("exception")
    interval = getattr(run, "data_interval_start", None)
    record = {
        "dag_id": getattr(ti, "dag_id", None),
        "run_id": getattr(ti, "run_id", None),
        "task_id": getattr(ti, "task_id", None),
        "try_number": getattr(ti, "try_number", None),
        "ds": partition_ds(interval) if interval is not None else None,
        "error": f"{type(error).__name__}: {error}" if error is not None else "unknown (no exception in context)",
        "log_url": getattr(ti, "log_url", None),  # the try's log in Airflow's UI
        "failed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    path = task_failures_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:  # one short line per write: appends do not interleave
        f.write(json.dumps(record) + "\n")


def read_task_failures(airflow_home: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """The records record_task_failure appended, oldest first (none when no task has failed)."""
    path = task_failures_path(airflow_home)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

