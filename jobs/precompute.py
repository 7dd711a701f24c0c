"""Solaris precompute of the foundation model's outputs into the lakehouse, for the DAG.

`python -m jobs.precompute --ds YYYY-MM-DD [--config FILE]`

A thin job: gem.precompute.run for ds. Writes gold.fm_user_embeddings (users whose sequences changed,
everyone on a model refresh), gold.fm_predictions (every impression of the held-out example day),
gold.fm_speculative_pairs (for ds+1) and gold.precompute_stats (with the observed hit rate, staleness
and waste of ds-1's pairs), one Spark task per user-hash shard on the session's executors
(gem.precompute.executors). Exits 99 (the task shows as skipped)
when ds has no mixture, i.e. pretraining skipped; fails when pretraining ran but promoted no model.
"""

from __future__ import annotations

import sys

from gem.lakehouse.commit import StageContext, StageResult
from gem.pipeline.cli import StageCall, job_exit, run_command, stage_command
from gem.precompute import run as precompute


def run(ctx: StageContext, ds: str) -> StageResult:
    """Precompute ds (gem.precompute.run.run); nothing published when ds has no mixture."""
    return precompute.run(ctx, ds)


def command_line(call: StageCall) -> int:
    """Precompute --ds; print the summary, or exit 99 when it has no mixture."""
    return job_exit(run(StageContext(call.cfg), call.ds))


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("precompute", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())
