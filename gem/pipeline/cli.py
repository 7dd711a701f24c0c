"""The jobs' command lines, on typer, with the day options read from the stage registry.

`stage_command(module, job)` builds `python -m jobs.<module>` from the registry's stages that run
the module (gem.lakehouse.stages.STAGES):

    --ds D          the day to process (every stage)
    --through D2    the days D..D2 in one run, one record per day (stages declared with `ranges`)
    --ready-on R    the day whose attribution window closes on R, i.e. ds = R - window (stages
                    declared `ready_on`; the DAG's form); exit 99 while no window has closed on R
    --examples      a stage's `extra_args` flag, where one module runs several stages (validate_silver)
    --config FILE   the YAML config (default: $GEM_CONFIG, else the built-in defaults)

and the job's own options: the parameters of `job(call, ...)` after the first, declared as in any
typer command (e.g. `--full` of build_features). The command resolves the stage and the day, loads
the config, and returns `job(StageCall, **options)`: the exit status. `job_app` and `run_command`
serve the jobs that are no stage (status, import_movielens) with the same conventions as the `gem`
command (gem/pipeline/command.py): plain click help, no pretty tracebacks. They, the --config
option and the day callback come from gem.command_line (what every command line shares, below the
pipeline) and are importable from here too.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gem import storage
from gem.command_line import DAY, ConfigOption, day_value, job_app, run_command
from gem.config import GemConfig, load_config
from gem.lakehouse.stages import STAGES, Stage, ready_on_day
from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT
from gem.quality.gate import GateError

if TYPE_CHECKING:
    from gem.lakehouse.commit import StageResult

__all__ = ["DAY", "ConfigOption", "StageCall", "day_value", "job_app", "job_exit", "run_command", "stage_command"]


@dataclass(frozen=True)
class StageCall:
    """What one stage command line asks for: the stage (the module's, or the one its flag picks),
    the day to process (--ds, or resolved from --ready-on), the last day of a range (--through),
    the config file named and the config loaded from it."""

    stage: Stage
    ds: str
    through: str | None
    config: Path | None
    cfg: GemConfig

    def rerun_command(self) -> str:
        """The command line that runs this call again: `python -m jobs.<module> --ds D [--through
        D2] [flag] [--config F]`."""
        words = ["python -m", f"jobs.{self.stage.module}", "--ds", self.ds]
        words += ["--through", self.through] if self.through else []
        words += [self.stage.extra_args.strip()] if self.stage.extra_args.strip() else []
        words += ["--config", str(self.config)] if self.config is not None else []
        return " ".join(words)


def job_exit(result: StageResult) -> int:
    """A stage job's exit status: NOTHING_READY_EXIT (the DAG task shows as skipped) when it
    published nothing, else 0 after printing its summary."""
    if not result.published:
        return NOTHING_READY_EXIT
    print(result.summary())
    return 0


# --------------------------------------------------------------------------------------------------
# A stage's command, from the registry.


def _option(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _stage_flag(stage: Stage) -> str:
    """The flag that picks a stage in a module that runs several: its `extra_args`, e.g. "--examples"."""
    flag = stage.extra_args.strip()
    if not flag.startswith("--") or " " in flag:
        raise ValueError(f"stage {stage.name}: extra_args {stage.extra_args!r} is not one --flag")
    return flag


def _flag_param(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _day_parameters(stages: list[Stage], flagged: dict[str, Stage]) -> list[inspect.Parameter]:
    """The registry's options of a module's stages: --ds, --through (any stage with `ranges`),
    --ready-on (any `ready_on` stage), a flag per stage picked by its `extra_args`, --config."""
    any_ready_on = any(s.ready_on for s in stages)
    ds_help = "the day to process, YYYY-MM-DD" + (" (or --ready-on)" if any_ready_on else "")
    ds = typer.Option("--ds", help=ds_help, metavar=DAY, callback=day_value)
    # Required, unless --ready-on may name the day instead (checked once parsed: `_check_days`).
    params = [_option("ds", Annotated[str | None, ds], None) if any_ready_on else _option("ds", Annotated[str, ds])]
    if any(s.ranges for s in stages):
        params.append(_option("through", Annotated[str | None, typer.Option(
            "--through", help="run the days --ds..--through in one commit (one record per day), e.g. a backfill",
            metavar=DAY, callback=day_value)], None))
    if any_ready_on:
        params.append(_option("ready_on", Annotated[str | None, typer.Option(
            "--ready-on", help="run day R: process ds = R - attribution_window_days (the DAG's form)",
            metavar=DAY, callback=day_value)], None))
    for flag, stage in flagged.items():
        params.append(_option(_flag_param(flag), Annotated[bool, typer.Option(
            flag, help=f"run stage {stage.name} instead: {stage.doc}")], False))
    params.append(_option("config", ConfigOption, None))
    return params


def _usage_error(ctx: typer.Context, option: str, message: str) -> typer.BadParameter:
    """A usage error about `option`: printed with the command's usage line, exit status 2."""
    return typer.BadParameter(message, ctx=ctx, param_hint=option)


def _picked_stage(ctx: typer.Context, default: Stage, flagged: dict[str, Stage], given: dict[str, Any]) -> Stage:
    """The stage a module's command line runs: the one whose flag is given, else the module's own."""
    picked = [(flag, stage) for flag, stage in flagged.items() if given.pop(_flag_param(flag))]
    if len(picked) > 1:
        flags = " and ".join(flag for flag, _ in picked)
        raise _usage_error(ctx, picked[1][0], f"pick one stage: {flags} exclude each other")
    return picked[0][1] if picked else default


def _check_days(ctx: typer.Context, stage: Stage, ds: str | None, through: str | None, ready_on: str | None) -> None:
    """Usage errors for day options the picked stage does not take, or that exclude each other."""
    if ready_on is not None:
        if ds is not None:
            raise _usage_error(ctx, "--ready-on", "excludes --ds: give one of the two")
        if not stage.ready_on:
            takers = ", ".join(s.name for s in STAGES if s.ready_on and s.module == stage.module)
            raise _usage_error(ctx, "--ready-on", f"{stage.name} takes --ds (--ready-on runs {takers})")
        if through is not None:
            raise _usage_error(ctx, "--through", "goes with --ds (impression days); --ready-on names one day")
    elif ds is None:
        raise _usage_error(ctx, "--ds", "missing: give --ds D or --ready-on R")
    if through is not None and not stage.ranges:
        raise _usage_error(ctx, "--through", f"{stage.name} runs one day at a time")


def stage_command(module: str, job: Callable[..., int]) -> typer.Typer:
    """The typer command of `python -m jobs.<module>`: the registry's options of the stages the
    module runs (the module docstring lists them), then the job's own (the parameters of `job`
    after its first, a StageCall). Run it with `run_command(app, argv)`.

    The command loads the config, resolves the day (--ready-on R: ds = R - attribution_window_days,
    and exit NOTHING_READY_EXIT after saying so while no window has closed on R) and returns
    `job(call, **options)`."""
    stages = [s for s in STAGES if s.module == module]
    if not stages:
        raise ValueError(f"no stage of the registry runs jobs.{module}")
    defaults = [s for s in stages if not s.extra_args]
    if len(defaults) != 1:
        raise ValueError(f"jobs.{module} runs {len(defaults)} stages without extra_args; "
                         "one must run when no flag is given")
    flagged = {_stage_flag(s): s for s in stages if s.extra_args}
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for p in list(inspect.signature(job, eval_str=True).parameters.values())[1:]]

    def command(ctx: typer.Context, **given: Any) -> int:
        options = {p.name: given.pop(p.name) for p in own}
        stage = _picked_stage(ctx, defaults[0], flagged, given)
        ds, through, ready_on = given["ds"], given.get("through"), given.get("ready_on")
        _check_days(ctx, stage, ds, through, ready_on)
        cfg = load_config(given["config"])
        try:
            storage.require_reachable(cfg.lakehouse_uri, cfg.landing_root)
        except storage.StorageError as error:
            print(f"{stage.name}: {error}", file=sys.stderr)
            return 2
        if ready_on is not None:
            ds = ready_on_day(cfg, ready_on)
            if ds is None:
                print(f"{stage.name}: no impression day's attribution window closes on {ready_on} "
                      f"(start_ds={cfg.start_ds}); nothing to do")
                return NOTHING_READY_EXIT
        call = StageCall(stage, ds, through, given["config"], cfg)
        try:
            return job(call, **options)
        except GateError as failed:  # a critical gate: its lines end with this command to rerun it
            failed.rerun = call.rerun_command()
            print(f"{stage.name} ds={ds} FAILED: {failed}", file=sys.stderr)
            return 1

    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    command.__signature__ = inspect.Signature([context, *_day_parameters(stages, flagged), *own])
    command.__name__ = module
    docs = [inspect.getdoc(job) or ""] + [f"Stage {s.name}: {s.doc}." for s in stages]
    app = job_app(f"python -m jobs.{module}")
    app.command(help="\n\n".join(filter(None, docs)))(command)
    return app
