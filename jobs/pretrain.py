"""Daily continued pretraining of the foundation model on day ds's mixture (gem.train), for the DAG.

`python -m jobs.pretrain --ds YYYY-MM-DD [--config FILE] [--steps N]`

A thin job: gem.train.daily.run for ds with the config's model and train settings. It
warm-starts from the architecture's last promoted checkpoint, resumes its own run folder if a
previous attempt was killed, writes per-task NE / AUC / calibration on the held-out day to
gold.metrics and promotes its final checkpoint. Exits 99 (the task shows as skipped) when
jobs.mix wrote no manifest for ds, i.e. no training day precedes the held-out day yet.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gem.data.manifest import ManifestError, read_manifest
from gem.lakehouse.commit import StageContext, StageResult
from gem.lakehouse.stages import mixed_days
from gem.pipeline.cli import StageCall, job_exit, run_command, stage_command
from gem.train import daily


def run(ctx: StageContext, ds: str, steps: int | None = None) -> StageResult:
    """Pretrain on ds's mixture (gem.train.daily.run); nothing published when jobs.mix wrote no
    manifest for ds yet."""

    if not mixed_days(ctx.cfg, ds):
        # Not a missing step: the mixture's window (mix.train_days, cold_start_days, validation_days
        # before the held-out day) holds no training day yet, so mix skipped on purpose.
        print(f"pretrain ds={ds}: nothing to train on yet (the mixture's window holds no training day before its "
              "validation and held-out days: mix.cold_start_days, mix.validation_days; mix skipped on purpose)")
        return StageResult("pretrain", ds, 0.0)
    try:
        read_manifest(ctx.cfg, ds, "train", check_files=False)
    except ManifestError as e:
        print(f"pretrain ds={ds}: nothing to train on yet ({e})")
        return StageResult("pretrain", ds, 0.0)
    return daily.run(ctx, ds, steps=steps, progress=True)  # plain lines in the task log, a bar on a terminal


def command_line(call: StageCall,
                 steps: Annotated[int | None, typer.Option(help="override train.steps")] = None) -> int:
    """Pretrain on the mixture of --ds; print the summary, or exit 99 while there is none."""
    return job_exit(run(StageContext(call.cfg), call.ds, steps))


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("pretrain", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())
