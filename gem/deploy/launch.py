"""A launched stage's process: the stage's run for one run day, as the DAG's in-process task runs it
(gem.pipeline.airflow.orchestration.run_stage_task), in a process of its own.

    python -m gem.deploy.launch --stage pretrain --run-day 2026-01-03 [--from-stage S] [--outcome FILE]

Started by torchrun on the Airflow worker's host (`launcher.kind: torchrun`:
orchestration.run_stage_torchrun), or by a cluster job (`launcher.kind: cluster_job`): torchrun in
each pod of a PyTorchJob, or the Spark operator's driver, which runs this file as a SparkApplication's
main application file. Under torchrun every rank runs the stage (gem.train.daily joins the process
group torchrun's environment describes; rank 0 publishes the record).

Exit status: 0 when the stage ran, had nothing ready (the in-process task's skip) or was not rerun
(from_stage); RESCHEDULE_EXIT when a running backfill holds the day and no --outcome file takes the
reschedule (a cluster job then fails, and the task's retry comes back later); 1 on a failure. With
--outcome, rank 0 writes the outcome as JSON (`Outcome`), from which the torchrun task skips or is
rescheduled as the in-process task would be.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

import typer
from airflow.sdk.exceptions import AirflowRescheduleException, AirflowSkipException

from gem.command_line import day_option, job_app, run_command
from gem.pipeline.airflow.orchestration import run_stage_task
from gem.pipeline.services import free_port

LAUNCH_MODULE = "gem.deploy.launch"
# EX_TEMPFAIL: try again later (a running backfill holds the day).
RESCHEDULE_EXIT = 75

State = Literal["success", "skipped", "rescheduled"]


@dataclass(frozen=True)
class Outcome:
    """How a launched stage's run ended: `message` is its summary line (or why it skipped or waits);
    `until` the time to try again, as ISO text, for a reschedule."""

    state: State
    message: str
    until: str = ""


def launch_args(stage_name: str, run_day: str, from_stage: str) -> list[str]:
    """This command line's arguments for a stage's run (torchrun's and the cluster jobs' commands)."""
    return ["--stage", stage_name, "--run-day", run_day, "--from-stage", from_stage]


def torchrun_commands(stage_name: str, run_day: str, from_stage: str, processes: int, outcome: Path,
                      nodes: Sequence[str] = ()) -> list[list[str]]:
    """torchrun (this interpreter's) on this host, `processes` ranks per node each running this module
    for the stage's run; rank 0 writes its Outcome to `outcome`. One standalone node without `nodes`;
    with them (addresses of this host), one command per node: its agent on its address, all meeting at
    a c10d rendezvous whose store the first node hosts on a free port of its address."""
    stage = ["-m", LAUNCH_MODULE, *launch_args(stage_name, run_day, from_stage), "--outcome", str(outcome)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    if not nodes:
        return [[*torchrun, "--standalone", "--nnodes", "1", *stage]]
    endpoint = f"{nodes[0]}:{free_port(nodes[0])}"
    return [[*torchrun, "--nnodes", str(len(nodes)), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
             "--rdzv-id", f"{stage_name}-{run_day}", "--rdzv-conf", f"is_host={int(i == 0)}",
             "--local-addr", address, "--max-restarts", "0", *stage]
            for i, address in enumerate(nodes)]


def run(stage_name: str, run_day: str, from_stage: str) -> Outcome:
    """The stage's run for run_day, through run_stage_task, with its skip and its reschedule as an
    Outcome instead of Airflow's exceptions."""
    try:
        return Outcome("success", run_stage_task(stage_name, run_day, from_stage))
    except AirflowSkipException as skipped:
        return Outcome("skipped", str(skipped))
    except AirflowRescheduleException as waiting:
        return Outcome("rescheduled", f"{stage_name} run day {run_day}: a running backfill holds it",
                       waiting.reschedule_date.isoformat())


def read_outcome(path: Path) -> Outcome:
    """The Outcome rank 0 wrote; a clear error when it wrote none (it died before the end)."""
    if not path.is_file():
        raise RuntimeError(f"the launched stage wrote no outcome to {path}: rank 0 ended before its run did")
    return Outcome(**json.loads(path.read_text()))


def command_line(
    stage: Annotated[str, typer.Option(help="the registry's stage to run (gem.lakehouse.stages)")],
    run_day: Annotated[str, day_option("--run-day", "the DAG run's day")],
    from_stage: Annotated[str, typer.Option(help="the stage the DAG run starts from (\"\": the first)")] = "",
    outcome: Annotated[Path | None, typer.Option(
        help="where rank 0 writes the outcome as JSON (the torchrun task reads it)", dir_okay=False)] = None,
) -> int:
    """Run one stage for a DAG run's day, as its in-process task would."""
    result = run(stage, run_day, from_stage)
    print(f"{stage}: {result.state}: {result.message}", flush=True)
    if outcome is not None:
        if int(os.environ.get("RANK", "0")) == 0:
            outcome.write_text(json.dumps(asdict(result)))
        return 0
    return RESCHEDULE_EXIT if result.state == "rescheduled" else 0


def main(argv: list[str] | None = None) -> int:
    app = job_app(f"python -m {LAUNCH_MODULE}")
    app.command(help=__doc__.split("\n\n")[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
