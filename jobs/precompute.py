"""Solaris precompute of the foundation model's outputs into the lakehouse, for the DAG.

`python -m jobs.precompute --ds YYYY-MM-DD [--config FILE] [--workers N]`

A thin job: gem.precompute.run for ds. Writes gold.fm_user_embeddings (users whose sequences changed,
everyone on a model refresh), gold.fm_predictions (every impression of the held-out example day),
gold.fm_speculative_pairs (for ds+1) and gold.precompute_stats (with the observed hit rate, staleness
and waste of ds-1's pairs), in user-hash shards that any number of workers claim
(`python -m gem.precompute.worker --ds D` joins a running day). Exits 99 (the task shows as skipped)
when ds has no mixture, i.e. pretraining skipped; fails when pretraining ran but promoted no model.
"""

from __future__ import annotations

import sys

from gem.config import load_config
from gem.lakehouse.commit import StageContext, StageResult
from gem.pipeline.cli import job_exit, job_parser


def run(ctx: StageContext, ds: str, workers: int | None = None) -> StageResult:
    """Precompute ds (gem.precompute.run.run); nothing published when ds has no mixture."""
    from gem.precompute import run as precompute

    return precompute.run(ctx, ds, workers)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="worker processes, this one included "
                        "(default precompute.workers)")
    args = parser.parse_args(argv)
    return job_exit(run(StageContext(load_config(args.config)), args.ds, args.workers))


if __name__ == "__main__":
    sys.exit(main())
