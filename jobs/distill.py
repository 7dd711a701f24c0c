"""Daily distillation of the foundation model into per-surface students (ExFM + LoopFM), for the DAG.

`python -m jobs.distill --ds YYYY-MM-DD [--config FILE] [--steps N]`

A thin job: gem.distill.run for ds. Each surface's student (student.variant) trains on the newest
FM-predicted example day before the held-out one, reading the FM's logged predictions and history
codes (gold.fm_predictions, gold.fm_history_codes; never the FM itself), is scored on the held-out
day beside the FM's own logged predictions (gold.metrics) and promoted; a promoted student ships as
a serving artifact (gem.serve.export: ONNX graph, feature spec, lineage; `gem score` serves it), and
its export seconds print. Exits 99 (the task shows as skipped) until precompute has run on ds and
ds - 1; fails when an FM output it would read came from a model trained on that day or later.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gem.distill import run as distill
from gem.lakehouse.commit import StageContext, StageResult
from gem.pipeline.cli import StageCall, job_exit, run_command, stage_command


def run(ctx: StageContext, ds: str, steps: int | None = None) -> StageResult:
    """Distill ds (gem.distill.run.run); nothing published until precompute ran on ds and ds - 1."""

    return distill.run(ctx, ds, steps)


def command_line(call: StageCall,
                 steps: Annotated[int | None, typer.Option(help="override student_train.steps")] = None) -> int:
    """Distill --ds into the per-surface students; print the summary, or exit 99 until precompute
    has run on --ds and the day before."""
    return job_exit(run(StageContext(call.cfg), call.ds, steps))


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("distill", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())
