"""Daily continued pretraining of the foundation model on day ds's mixture (gem.train), for the DAG.

`python -m jobs.pretrain --ds YYYY-MM-DD [--config FILE]`

A thin job: `python -m gem.train --mix-ds ds` with the config's model and train settings. It
warm-starts from the architecture's last promoted checkpoint, resumes its own run folder if a
previous attempt was killed, writes per-task NE / AUC / calibration on the held-out day to
gold.metrics and promotes its final checkpoint. Exits 99 (the task shows as skipped) when
jobs.mix wrote no manifest for ds, i.e. no training day precedes the held-out day yet.
"""

from __future__ import annotations

import sys

from gem.cli import job_parser
from gem.config import load_config
from gem.orchestration import NOTHING_READY_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="override train.steps")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)

    from gem import train
    from gem.data.manifest import ManifestError, read_manifest

    try:
        read_manifest(cfg, args.ds, "train", check_files=False)
    except ManifestError as e:
        print(f"pretrain ds={args.ds}: nothing to train on yet ({e})")
        return NOTHING_READY_EXIT
    forwarded = ["--mix-ds", args.ds, "--no-progress"]
    forwarded += ["--config", args.config] if args.config else []
    forwarded += ["--steps", str(args.steps)] if args.steps else []
    return train.main(forwarded)


if __name__ == "__main__":
    sys.exit(main())
