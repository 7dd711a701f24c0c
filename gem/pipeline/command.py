"""`gem`: the pipeline's command (a console script installed by `make setup`; also `python -m gem`).

    gem run --ds D [--config F]                      one day through Airflow (the gem_daily DAG)
    gem backfill --start A --end B [--from-stage S]  days through Airflow's own backfill, in order
    gem status [--start A --end B] [--config F]      done / stale / missing per stage and day, and
                                                     Airflow's failed runs with the task that failed
    gem bulk --start A --end B [--config F]          a range of days through every stage in one
                                                     process and Spark session (gem.pipeline.bulk)
    gem import-movielens PATH [--config F]           a MovieLens ml-1m / ml-100k folder -> landing
    gem delete-user USER_ID [--config F]             one user's rows in every table and raw lines
                                                     in landing and quarantine deleted
    gem report --ds D [--config F]                   the run report of a day (HTML)
    gem promote --ds D --reason R [--model M]        set a day's promoted model by hand (the gate's
                                                     refusal overridden, or a rollback)
    gem score --model A --input R --out P [--ds D]   a promoted student's artifact scores feature
                                                     rows, or a day of the lakehouse's examples
                                                     (gem.serve.score; no torch, no Spark)

Each subcommand is a thin layer over the library (gem.pipeline.airflow.runs, jobs.status, gem.pipeline.bulk,
jobs.import_movielens); `gem SUBCOMMAND --help` says more. Built on typer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

# From gem.command_line, not gem.pipeline.cli (which loads the config and the stage registry): `gem score`
# runs in a process that imports no training code.
from gem.command_line import ConfigOption, day_value

app = typer.Typer(
    help="The GEM pipeline: run days through Airflow, see what is done, import real data.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: paragraphs re-wrapped to the terminal
)

def _config_args(config: Path | None) -> list[str]:
    return ["--config", str(config)] if config is not None else []


@app.command()
def run(
    ds: Annotated[str, typer.Option("--ds", help="the day to process, YYYY-MM-DD", callback=day_value)],
    config: ConfigOption = None,
) -> None:
    """One day through Airflow: the gem_daily DAG's run for ds.

    `airflow dags test`, every stage of the registry in order, against Airflow's metadata DB
    (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN, else SQLite in $AIRFLOW_HOME, default .airflow/). Prints one
    line per task as it finishes (day, task, state, seconds; read through Airflow's API); Airflow's
    log goes to a file whose path it prints. Exits 1 when the run failed."""
    from gem.config import load_config
    from gem.pipeline.airflow.api import API_UNAVAILABLE
    from gem.pipeline.airflow.runs import airflow_env, init_db, run_day, run_log

    cfg = load_config(config)
    env = airflow_env(cfg, config)
    init_db(env)
    log = run_log(env, ds)
    typer.echo(f"gem_daily ds={ds}: Airflow's and the jobs' log: {log}")
    started = time.monotonic()
    try:
        ok = run_day(ds, env, log, on_task=lambda line: typer.echo(str(line)))
    except API_UNAVAILABLE as e:
        typer.echo(f"gem run: reading the run of ds={ds} through Airflow's API: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"gem_daily ds={ds}: {'success' if ok else 'failed'} in {time.monotonic() - started:.0f}s")
    if not ok:
        typer.echo(f"see {log}; `gem status` lists the failed task and its error", err=True)
        raise typer.Exit(1)


@app.command()
def backfill(
    start: Annotated[str, typer.Option(help="first day to process, YYYY-MM-DD", callback=day_value)],
    end: Annotated[str, typer.Option(help="last day to process, YYYY-MM-DD", callback=day_value)],
    from_stage: Annotated[str | None, typer.Option(
        help="rerun from this stage on (the stages before it keep their records of each day)")] = None,
    reprocess: Annotated[str, typer.Option(
        help="which days of the range run: completed (every day, done or not), failed (failed or "
             "never run), none (never run)")] = "completed",
    config: ConfigOption = None,
) -> None:
    """Days start..end through Airflow's own backfill (`airflow backfill create`), one day at a time.

    Uses the scheduler already running on $AIRFLOW_HOME's metadata DB, else starts one (with the
    API server and DAG processor) for the backfill's duration, logging to
    $AIRFLOW_HOME/runs/backfill-A..B/. Prints one line per task as it finishes, each day's run state,
    and the later days' records the rewritten days made stale (rerun those next; `gem status`).
    Exits 1 when a day's run failed."""
    from gem.config import load_config
    from gem.lakehouse.stages import STAGES
    from gem.lakehouse.staleness import all_records
    from gem.pipeline.airflow.api import API_UNAVAILABLE
    from gem.pipeline.airflow.backfill import REPROCESS_BEHAVIOURS, BackfillError, later_days
    from gem.pipeline.airflow.backfill import backfill as run_backfill
    from gem.pipeline.airflow.runs import airflow_env
    from jobs.status import grid

    if end < start:
        raise typer.BadParameter(f"--end {end} is before --start {start}", param_hint="--end")
    if reprocess not in REPROCESS_BEHAVIOURS:
        raise typer.BadParameter(f"one of {', '.join(REPROCESS_BEHAVIOURS)}", param_hint="--reprocess")
    if from_stage is not None and from_stage not in {s.name for s in STAGES}:
        raise typer.BadParameter(f"not a stage; the stages in order: {', '.join(s.name for s in STAGES)}",
                                 param_hint="--from-stage")
    cfg = load_config(config)

    def later_stale(last: str) -> list[str]:
        days = later_days(last, max((d for _, d in all_records(cfg)), default=None))
        return grid(cfg, days)[1] if days else []

    started = time.monotonic()
    typer.echo(f"gem_daily backfill {start}..{end} ({reprocess}"
               + (f", from {from_stage}" if from_stage else "") + ")")
    try:
        result = run_backfill(start, end, airflow_env(cfg, config), reprocess=reprocess, from_stage=from_stage, cfg=cfg,
                              on_task=lambda line: typer.echo(str(line)), later_stale=later_stale)
    except (BackfillError, *API_UNAVAILABLE) as e:
        typer.echo(f"gem backfill: {e}", err=True)
        raise typer.Exit(1) from None
    for ds, state in result.runs.items():
        typer.echo(f"  {ds}  run {state}")
    for ds, why in result.not_run.items():
        typer.echo(f"  {ds}  not run: {why}")
    typer.echo(f"backfill {start}..{end}: {'success' if result.ok else 'failed'} in {time.monotonic() - started:.0f}s")
    if result.stale_later:
        typer.echo(f"{len(result.stale_later)} later record(s) now rest on rewritten days; rerun them next:")
        typer.echo("\n".join(f"  {line}" for line in result.stale_later))
        typer.echo(f"  all of them: {rerun_all(result.stale_later)}")
    if not result.ok:
        typer.echo("`gem status` lists the failed task and its error", err=True)
        raise typer.Exit(1)


def rerun_all(stale_lines: list[str]) -> str:
    """The one backfill that reruns every stale record listed (`stage ds=D: why...` lines, as
    jobs.status.grid writes them): from the earliest of their stages in the registry, over their days."""
    from gem.lakehouse.stages import STAGES

    keys = [tuple(line.split(":", 1)[0].split(" ds=")) for line in stale_lines]
    order = [s.name for s in STAGES]
    first = min((stage for stage, _ in keys), key=order.index)
    days = sorted(day for _, day in keys)
    return f"gem backfill --start {days[0]} --end {days[-1]} --from-stage {first}"


@app.command()
def status(
    start: Annotated[str | None, typer.Option(help="first day, YYYY-MM-DD (default: start_ds)", callback=day_value)] = None,
    end: Annotated[str | None, typer.Option(help="last day (default: the newest recorded)", callback=day_value)] = None,
    config: ConfigOption = None,
    airflow_runs: Annotated[bool, typer.Option("--airflow/--no-airflow",
                                               help="also list Airflow's failed runs")] = True,
) -> None:
    """Per stage and day: done, stale or missing; Airflow's failed runs.

    From the completion records (a stale one says what to rerun first), then the DAG's failed runs
    from Airflow's API with the task that failed and why (on the embedded default, through an API
    server started for the command)."""
    from jobs.status import main as status_main

    argv = _config_args(config) + [a for flag, day in (("--start", start), ("--end", end)) if day
                                   for a in (flag, day)]
    code = status_main(argv)
    if code:
        raise typer.Exit(code)
    if airflow_runs:
        from gem.pipeline.airflow.api import API_UNAVAILABLE

        typer.echo("")
        try:
            typer.echo("\n".join(failed_run_lines(config)))
        except API_UNAVAILABLE as e:
            typer.echo(f"gem status: Airflow's failed runs: {e}", err=True)
            raise typer.Exit(1) from None


def failed_run_lines(config: Path | None) -> list[str]:
    """Airflow's failed runs of gem_daily (from its API), each with the failures the DAG's callback
    recorded (gem.pipeline.airflow.orchestration.record_task_failure): task, try, error."""
    from gem.config import load_config
    from gem.pipeline.airflow.api import airflow_api, embedded_db
    from gem.pipeline.airflow.orchestration import DAG_ID, read_task_failures
    from gem.pipeline.airflow.runs import airflow_env, airflow_home

    env = airflow_env(load_config(config), config)
    db = embedded_db(env)
    if db is not None and not db.is_file():  # no server to start on a DB that does not exist
        return [f"Airflow: no metadata DB in {airflow_home()} yet (no run through Airflow)"]
    with airflow_api(env, airflow_home(env) / "runs" / "status.api-server.log") as api:
        runs = api.failed_runs(DAG_ID)
    if not runs:
        return ["Airflow: no failed runs of gem_daily"]
    failures = read_task_failures(airflow_home())
    lines = [f"Airflow: {len(runs)} failed run(s) of gem_daily:"]
    for run in sorted(runs, key=lambda r: str(r.logical_date)):
        mine = [f for f in failures if f["run_id"] == run.run_id]
        days = sorted({f["ds"] for f in mine if f.get("ds")})
        lines.append(f"  run {run.run_id} (logical date {str(run.logical_date)[:10]}"
                     + (f", ds={', '.join(days)})" if days else ")"))
        for f in mine:
            lines.append(f"    {f['task_id']} (try {f['try_number']}): {f['error']}")
            if f.get("log_url"):
                lines.append(f"      log: {f['log_url']}")
        if not mine:
            lines.append("    (no failed task recorded: the run failed outside a task, or before the callback existed)")
    return lines


@app.command()
def report(
    ds: Annotated[str, typer.Option("--ds", help="the day to report, YYYY-MM-DD", callback=day_value)],
    config: ConfigOption = None,
    window: Annotated[int | None, typer.Option(min=1, help="days to look back over, ds included [default: 7]")] = None,
) -> None:
    """Write the day's run report (HTML with plots) and print its path.

    Rows per stage and day, quarantine by reason, the data-quality verdict of each suite with a link
    to its Data Docs page, held-out metrics beside the Bayes floor, the training loss and precompute's
    figures, from what the stages committed (gem/report/run_report.py). Exits 1 when no stage ran ds."""
    from gem.config import load_config
    from gem.report.run_report import WINDOW_DAYS, NothingRanError, write

    try:
        typer.echo(write(load_config(config), ds, window or WINDOW_DAYS))
    except NothingRanError as e:
        typer.echo(f"gem report: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def bulk(
    start: Annotated[str, typer.Option(help="first run day, YYYY-MM-DD", callback=day_value)],
    end: Annotated[str, typer.Option(help="last run day, YYYY-MM-DD", callback=day_value)],
    through_stage: Annotated[str | None, typer.Option(help="the last stage to run each day (default: all)")] = None,
    config: ConfigOption = None,
) -> None:
    """A range of days through every stage in one process and one Spark session.

    The bulk path (gem.pipeline.bulk): the same stage entry points and completion records as the daily
    runs, without a process and a JVM per task; for loading a history before daily runs take over.
    One line per stage as it finishes."""
    from gem.pipeline.bulk import main as bulk_main

    argv = ["--start", start, "--end", end, *_config_args(config)]
    code = bulk_main(argv + (["--through-stage", through_stage] if through_stage else []))
    if code:
        raise typer.Exit(code)


@app.command("import-movielens")
def import_movielens(
    path: Annotated[Path, typer.Argument(help="a MovieLens folder: ratings.dat, movies.dat, users.dat (ml-1m) "
                                              "or u.data, u.item, u.user (ml-100k)",
                                         exists=True, file_okay=False)],
    config: ConfigOption = None,
    summary: Annotated[str | None, typer.Option(
        help="where the full summary goes as JSON (default: <landing root>/_imports/movielens.json)")] = None,
) -> None:
    """Import a MovieLens ratings folder into the landing zone as ad events.

    One `_SUCCESS`-marked landing partition per day; the DAG runs on it with `source: landing`
    (configs/movielens.yaml). Prints ratings, days and events by type, and where the full summary
    (every day written) went."""
    from jobs.import_movielens import main as import_main

    code = import_main(["--path", str(path), *_config_args(config), *(["--summary", summary] if summary else [])])
    if code:
        raise typer.Exit(code)


@app.command("delete-user")
def delete_user(
    user_id: Annotated[str, typer.Argument(metavar="USER_ID", help="the user's id, as the events carry it (e.g. u42)")],
    config: ConfigOption = None,
) -> None:
    """Delete one user everywhere: their rows in every table, their raw lines in landing and quarantine.

    Delta DELETEs (no Spark) and landing files rewritten without the user's lines
    (gem.lakehouse.erasure). Older table versions keep the deleted rows until VACUUM removes their
    files after the retention: the command prints from which day."""
    from gem.config import load_config
    from gem.lakehouse.erasure import erase_user

    try:
        report = erase_user(load_config(str(config) if config else None), user_id)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    for line in report.lines():
        typer.echo(line)


@app.command()
def promote(
    ds: Annotated[str, typer.Option("--ds", help="the day whose promoted model to set, YYYY-MM-DD", callback=day_value)],
    reason: Annotated[str, typer.Option(help="why: kept in the promotion record")],
    model: Annotated[str | None, typer.Option(
        help="the model: an architecture (default: the config's model.arch) or a student, "
             "student-<variant>-<surface>")] = None,
    from_ds: Annotated[str | None, typer.Option(
        "--from-ds", help="roll back: promote the model promoted for this earlier day as ds's, YYYY-MM-DD",
        callback=day_value)] = None,
    by: Annotated[str | None, typer.Option(help="who decides (default: the user running the command)")] = None,
    config: ConfigOption = None,
) -> None:
    """Promote a model by hand: override the promotion gate's refusal, or roll back.

    Without --from-ds, the model that ds's run trained and the gate refused becomes ds's promoted
    model; with --from-ds E, the model promoted for the earlier day E does. It serves ds and the days
    after (precompute's next refresh, the next warm starts) until a later day promotes another. The
    record keeps who, why and the gate's figures (gem.train.promotion); `gem status` lists it. Exits
    1 when there is nothing to promote."""
    import getpass

    from gem.config import load_config
    from gem.train.promotion import PromotionError, checkpoint_root, model_names, override, roll_back

    if not reason.strip():
        raise typer.BadParameter("say why the model is promoted", param_hint="--reason")
    cfg = load_config(config)
    root, name, who = checkpoint_root(cfg), model or cfg.model.arch, by or getpass.getuser()
    known = model_names(root)
    if name not in known:
        raise typer.BadParameter(f"{name} has no promotion or decision under {root}; models there: "
                                 f"{', '.join(known) or 'none'}", param_hint="--model")
    try:
        decision = roll_back(root, name, ds, from_ds, who, reason) if from_ds else override(root, name, ds, who, reason)
    except PromotionError as e:
        typer.echo(f"gem promote: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(decision.summary())


@app.command()
def score(
    model: Annotated[str, typer.Option(help="a student artifact folder (the distill stage writes them under "
                                            "<lakehouse>/_checkpoints/serving/<student>/<ds>/)")],
    input_rows: Annotated[str, typer.Option("--input", help="feature rows: a Parquet file or folder, or a Delta table; or a "
                                                          "lakehouse's silver/training_examples (a day of examples)")],
    out: Annotated[str, typer.Option(help="predictions: a path ending in .parquet (one Parquet file), else a Delta table")],
    ds: Annotated[str | None, typer.Option("--ds", help="the day of a Delta input to score, YYYY-MM-DD",
                                           callback=day_value)] = None,
) -> None:
    """Score feature rows with a promoted student's artifact (onnxruntime; no torch, no Spark).

    The rows carry the columns of the artifact's feature_spec.json; a missing column, a wrong dtype,
    a negative id or a row of another surface stops the run with an error naming the column, and an
    empty input is an error (gem.serve.score). A lakehouse's silver/training_examples with --ds is a
    day of examples of the student's surface: their users' histories and FM codes are joined from
    the lakehouse (gem.serve.examples). Writes one prediction row per input row, in order."""
    from gem.serve.features import ArtifactError, FeatureError
    from gem.serve.score import InputError
    from gem.serve.score import score as score_rows

    try:
        result = score_rows(model, input_rows, out, ds)
    except (ArtifactError, FeatureError, InputError) as e:
        typer.echo(f"gem score: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"gem score: {result.rows:,} rows scored in {result.seconds:.2f}s -> {result.out}")


def main() -> None:
    """The console script's entry point."""
    app(prog_name="gem")


if __name__ == "__main__":
    main()
