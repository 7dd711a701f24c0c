"""python -m gem.study --preset {smoke,small,cpu,gpu}: the model quality study (gem/study/study.py).

Writes {lakehouse_uri}/_reports/study/<preset>/index.html (plus img/) and results.json beside it,
and prints the report's path.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click

from gem import storage
from gem.config import load_config
from gem.environment import code_version
from gem.host import host_description
from gem.study.claims import all_claims
from gem.study.job_log import JobLog
from gem.study.page import write_report
from gem.study.presets import PRESETS
from gem.study.study import Study


def study_dir(lakehouse_uri: str, preset: str) -> str:
    """Where the study of `preset` is published: {lakehouse}/_reports/study/<preset>/."""
    return storage.join(lakehouse_uri, "_reports", "study", preset)


def _json_safe(x: Any) -> Any:
    """NaN / inf (an interval of one value) as null: results.json stays standard JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def run_study(preset_name: str, out_dir: str | Path, workers: int | None = None, job_log: Path | None = None,
              hours: float | None = None, command: str | None = None) -> str | None:
    """Run the preset, publish the report and results.json under out_dir (a local folder or an object
    store prefix) -> the report's URI. With `job_log`, the jobs and training runs a previous run
    finished (gem.study.job_log) are reused and new ones appended; with `hours`, training runs that
    would end later are left for the next run, and a run that left any publishes nothing (-> None). Each run is
    recorded in the job log (`command`: the command line that ran it); results.json lists them all,
    and its wall_s is theirs summed."""
    preset = PRESETS[preset_name]
    workers = workers or preset.workers
    start, started = time.perf_counter(), dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    study = Study(preset)
    log = JobLog(job_log, repr(preset)) if job_log is not None else None
    results, failed = None, True
    try:
        results = study.run(workers, log, hours)
        failed = False
    finally:  # a run stopped by an error or Ctrl-C is recorded too: its finished jobs are in the log
        run = {"command": command or f"python -m gem.study --preset {preset_name}", "commit": code_version(),
               "host": host_description(), "device": str(study.device), "workers": workers, "started": started,
               "wall_s": round(time.perf_counter() - start, 1), "hours": hours, "stopped_by_error": failed,
               "jobs_finished": len(log.finished_in_run) if log is not None else len(study.planned),
               "jobs_left": len(study.left)}
        if log is not None:
            log.record_run(run)
    if results is None:
        return None
    runs = log.runs() if log is not None else [run]
    results |= {"commit": run["commit"], "device": run["device"], "started": runs[0]["started"], "workers": workers,
                "wall_s": sum(float(r["wall_s"]) for r in runs), "runs": runs, "restored_jobs": sorted(study.restored)}
    results = _json_safe(results)
    claims = all_claims(results)
    results["claims"] = claims
    path = write_report(results, claims, out_dir)
    storage.write(storage.join(out_dir, "results.json"), json.dumps(results, indent=1, sort_keys=True))
    return path


@click.command()
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default="smoke", show_default=True)
@click.option("--config", "config_path", default=None, help="config file (its lakehouse_uri names the output)")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="processes running jobs side by side (on CPU one thread each, e.g. the number of cores); "
                   "default: the preset's")
@click.option("--job-log", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON lines of finished jobs and training runs: those it holds are not run again, new ones "
                   "are appended (a study over several runs, e.g. short GPU leases)")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), default=None,
              help="start no training run predicted to end later than this many hours from the start (with "
                   "--job-log, a study over several runs); a run that leaves any publishes nothing")
def main(preset: str, config_path: str | None, workers: int | None, job_log: Path | None, hours: float | None) -> None:
    """Train the architectures on the generator's traffic and report the claims' verdicts."""
    if hours is not None and job_log is None:
        raise click.UsageError("--hours leaves the jobs it does not start to a later run: it needs --job-log")
    cfg = load_config(config_path)
    path = run_study(preset, study_dir(cfg.lakehouse_uri, preset), workers, job_log, hours,
                     command=shlex.join(["python", "-m", "gem.study", *sys.argv[1:]]))
    if path is None:
        click.echo(f"jobs are left: rerun the same command (--job-log {job_log}) to continue")
        raise SystemExit(3)
    click.echo(f"report: {path}")


if __name__ == "__main__":
    main()
