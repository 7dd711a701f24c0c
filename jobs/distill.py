"""Daily distillation of the foundation model into per-surface students (ExFM + LoopFM), for the DAG.

`python -m jobs.distill --ds YYYY-MM-DD [--config FILE] [--steps N]`

A thin job: gem.distill.run for ds. Each surface's student (student.variant) trains on the newest
FM-predicted example day before the held-out one, reading the FM's logged predictions and history
codes (gold.fm_predictions, gold.fm_history_codes; never the FM itself), is scored on the held-out
day beside the FM's own logged predictions (gold.metrics) and promoted. Exits 99 (the task shows as
skipped) until precompute has run on ds and ds - 1; fails when an FM output it would read came from
a model trained on that day or later.
"""

from __future__ import annotations

import sys

from gem.config import load_config
from gem.lakehouse.commit import StageContext, StageResult


def run(ctx: StageContext, ds: str, steps: int | None = None) -> StageResult:
    """Distill ds (gem.distill.run.run); nothing published until precompute ran on ds and ds - 1."""
    from gem.distill import run as distill

    return distill.run(ctx, ds, steps)


def main(argv: list[str] | None = None) -> int:
    from gem.pipeline.cli import job_exit, job_parser

    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="override student_train.steps")
    args = parser.parse_args(argv)
    return job_exit(run(StageContext(load_config(args.config)), args.ds, args.steps))


if __name__ == "__main__":
    sys.exit(main())
