"""One day's continued pretraining from the mixture manifest: the `pretrain` stage's entry point.

    python -m gem.train --config FILE --mix-ds D [--run-dir DIR] [--steps N]
    torchrun --nproc-per-node 2 -m gem.train --config FILE --mix-ds D     # gloo on CPU, NCCL on GPU

A new run folder of day D warm-starts its weights (not the optimizers or the loader) from the model
its architecture promoted for the newest day before D (gem.train.promotion), never from D's own or
a later day's. After training (gem.train.trainer), rank 0 scores the held-out day with a plain-torch
copy of the model and, on the same examples, the model it warm-started from; replaces the day's rows
of gold.metrics in the stage's commit; and promotes the run's final checkpoint for D only when the
promotion gate passes it (gem.train.gate). Either way the stage publishes its record, and the
decision (both models' NE per label type) is printed and kept (gem.train.promotion).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import torch
import typer

from gem.command_line import ConfigOption, day_option, job_app, run_command
from gem.config import GemConfig, load_config
from gem.data.encode import DENSE_COLUMNS
from gem.data.loader import SPARSE_FEATURES, ExampleStream, ResumableLoader
from gem.data.manifest import Manifest, read_manifest
from gem.environment import code_version
from gem.lakehouse.commit import StageCommit, StageContext, StageResult
from gem.model.build import build_task
from gem.model.heads import shrunk_base_rates
from gem.train import checkpoint, gate, promotion
from gem.train.evaluate import metrics_table, per_task, pooled
from gem.train.promotion import checkpoint_root
from gem.train.trainer import Trainer
from schemas.metrics import GOLD_METRICS

# --------------------------------------------------------------------------------------------------
# The command line: one day's continued pretraining from the mixture manifest.



# The pretraining record has no separate input count: it scores the held-out day, one metrics row
# per task, each row counting the examples it scored.
PRETRAIN_STAGE = "pretrain"
NO_INPUT_COUNT = "scores: one gold.metrics row per held-out task, each with the examples it scored"
# Batches of the held-out day sorted by sequence length together (gem.data.length_batching).
EVAL_LENGTH_SORT_BATCHES = 64


def write_metrics(commit: StageCommit, rows: list[dict[str, Any]]) -> int:
    """Replace gold.metrics' rows of one (held-out day, architecture) with `rows`, in one commit of
    the pretraining stage (gem.lakehouse.commit.StageCommit): a rerun of a day's pretraining leaves one row per
    task, never a second set beside the first. -> the version created."""
    keys = {(r["ds"], r["arch"]) for r in rows}
    if len(keys) != 1:
        raise ValueError(f"gold.metrics rows of one run share one (ds, arch); got {sorted(keys)}")
    ((ds, arch),) = keys
    if ds.isoformat() != commit.ds:
        raise ValueError(f"gold.metrics rows of ds={ds} in the {commit.stage.name} commit of ds={commit.ds}")
    table = pa.Table.from_pylist(rows, schema=GOLD_METRICS.arrow_schema())
    return commit.replace_arrow(table, GOLD_METRICS, also={"arch": arch})


def init_from_torchrun(device_type: str) -> bool:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, MASTER_ADDR/PORT in the
    environment): gloo on CPU, NCCL on GPU, one GPU per local rank. False when not under torchrun."""
    if "WORLD_SIZE" not in os.environ or torch.distributed.is_initialized():
        return False
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return True


def run(ctx: StageContext, ds: str, run_dir: Path | None = None, steps: int | None = None,
        progress: bool = False) -> StageResult:
    """Train on the mixture of `ds`, score its held-out day beside the promoted model, promote the
    model when the gate passes it; -> a StageResult (rank 0 publishes the record; other ranks return
    one without records). Details: steps, examples, checkpoint, and on rank 0 promoted (bool) and
    decision (its one-line summary)."""
    t0, cfg = time.time(), ctx.cfg
    joined = init_from_torchrun("cuda" if torch.cuda.is_available() else "cpu")
    rank = torch.distributed.get_rank() if joined else 0
    torch.manual_seed(cfg.train.seed)
    root = checkpoint_root(cfg)
    run_dir = run_dir if run_dir else checkpoint.child(root, f"{cfg.model.arch}-{ds}")
    promotion.checked_checkpoint(root, run_dir)  # refused before training, not at the promotion after it

    # Rank 0 commits for the stage: inputs (the mixture's record) checked and the day's record
    # withdrawn before training, published after the metrics and the promotion.
    commit = StageCommit.begin(ctx, PRETRAIN_STAGE, ds) if rank == 0 else None
    train_manifest, eval_manifest = read_manifest(cfg, ds, "train"), read_manifest(cfg, ds, "eval")
    tasks = tuple(f"{s}/{t}" for s, t in cfg.tasks if f"{s}/{t}" in {x.name for x in train_manifest.sources})
    loader_cfg = cfg.loader.capped(cfg.model.sequence_lengths())  # cut no longer than the model reads
    stream = ResumableLoader(ExampleStream(train_manifest, tasks, loader_cfg))
    task = build_task(cfg.model, tasks, SPARSE_FEATURES, len(DENSE_COLUMNS), cfg.train.task_weights)
    task.heads.init_from_base_rates(shrunk_base_rates({s.name: (s.positives, s.rows) for s in train_manifest.sources}))
    trainer = Trainer(task, stream, cfg.train, run_dir, config_snapshot=cfg.to_dict())
    previous = promotion.warm_start_for(root, cfg.model.arch, ds)
    if trainer.resume():
        print(f"resumed {run_dir} at step {trainer.step}")
    elif previous is not None:
        print(f"warm start from {trainer.warm_start(previous.checkpoint)} (promoted for {previous.mix_ds})")
    result = trainer.fit(steps=steps, progress=progress and rank == 0)
    seconds = max(result.seconds, 1e-9)
    print(f"[rank {rank}] trained {result.steps} steps; {result.examples:,} examples in {result.seconds:.1f}s "
          f"({result.examples / seconds:,.0f} examples/s on {trainer.device}); padding share of "
          f"{trainer.padding_measure}: " + ", ".join(f"{e} {r:.1%}" for e, r in result.padding_ratio.items()))
    state = trainer.plain_state()  # every rank takes part (tables are gathered from their owners)
    trainer.close()
    checkpoint_path = result.checkpoint or checkpoint.latest(run_dir)
    if rank == 0:
        # Rank 0 alone scores the whole held-out day with a plain-torch copy of the trained model.
        eval_task = build_task(cfg.model, tasks, SPARSE_FEATURES, len(DENSE_COLUMNS), cfg.train.task_weights,
                               sparse_backend="torch")
        eval_task.load_state_dict(state)
        # Scores do not depend on the order examples come in, so the held-out day is read in
        # length-sorted batches (less padding) in this process (no loader workers competing with the
        # model for the cores): faster than stream order with workers, with identical NE.
        eval_cfg = dataclasses.replace(loader_cfg, num_workers=0, length_sort_batches=EVAL_LENGTH_SORT_BATCHES)
        eval_stream = ResumableLoader(ExampleStream(eval_manifest, tasks, eval_cfg, rank=0, world_size=1))
        # The model it warm-started from (the promoted one) scored on the same examples, for the gate.
        incumbent = gate.incumbent_task(previous, lambda heads: build_task(
            cfg.model, heads, SPARSE_FEATURES, len(DENSE_COLUMNS), sparse_backend="torch"), cfg.model.embeddings.backend)
        paired = gate.score_pair(eval_stream.epoch(), eval_task, incumbent)
        _report(commit, per_task(paired.candidate) | pooled(paired.candidate), result.steps, eval_manifest)
        # A resumed run warm-started from the same promotion (warm starts happen before step 1).
        trained_through = promotion.newest_day([max(train_manifest.file_ds.values(), default=None),
                                                previous.trained_through if previous is not None else None])
        candidate = promotion.Promotion(cfg.model.arch, ds, checkpoint_path, result.steps, tasks, trained_through)
        decision = gate.decide(root, candidate, paired, cfg.promotion, by=PRETRAIN_STAGE)
        print(decision.summary())
        commit.publish(None, written_tables=(GOLD_METRICS,), no_input_count=NO_INPUT_COUNT)
    if joined:
        torch.distributed.barrier()  # nobody exits before rank 0 has published
        torch.distributed.destroy_process_group()
    details = {"steps": result.steps, "examples": result.examples, "checkpoint": str(checkpoint_path)}
    if rank == 0:
        details |= {"promoted": decision.promoted, "decision": decision.summary()}
    return commit.result(t0, **details) if commit is not None else StageResult(PRETRAIN_STAGE, ds, time.time() - t0,
                                                                             details=details)


def command_line(
    mix_ds: Annotated[str, day_option("--mix-ds", "the gold.mixture_manifest day to train on")],
    config: ConfigOption = None,
    run_dir: Annotated[str | None, typer.Option(
        help="checkpoint folder under train.checkpoint_root (default: <arch>-<ds> there)")] = None,
    steps: Annotated[int | None, typer.Option()] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress")] = False,
) -> int:
    result = run(StageContext(load_config(config)), mix_ds, run_dir, steps, not no_progress)
    if result.published:
        print(result.summary())
    return 0


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m gem.train")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


def metrics_rows(cfg: GemConfig, ds: str, run_id: str, arch: str, scores: dict[str, dict[str, Any]], steps: int,
                 mixture_id: str, examples_version: int, sequences_version: int) -> list[dict[str, Any]]:
    """gold.metrics rows of one run's held-out scores (as gem.train.evaluate returns them), with what it
    read and which code and config ran."""
    now = dt.datetime.now(dt.UTC)
    return [{
        "ds": dt.date.fromisoformat(ds), "run_id": run_id, "arch": arch, "task": name,
        "split": "eval", "examples": s["examples"], "positives": s["positives"], "ne": s["ne"], "auc": s["auc"],
        "calibration": s["calibration"], "train_steps": steps, "mixture_id": mixture_id,
        "examples_version": examples_version, "sequences_version": sequences_version,
        "code_version": code_version(), "config": json.dumps(cfg.to_dict(), default=str), "created_at": now,
    } for name, s in scores.items()]


def _report(commit: StageCommit, scores: dict[str, dict[str, Any]], steps: int, eval_manifest: Manifest) -> None:
    """Write the held-out scores to gold.metrics (with run id, config, code and table versions) and print them."""
    cfg, mix_ds = commit.cfg, commit.ds
    run_id = f"{cfg.model.arch}:{mix_ds}:{uuid.uuid4().hex[:8]}"
    write_metrics(commit, metrics_rows(cfg, mix_ds, run_id, cfg.model.arch, scores, steps, eval_manifest.mixture_id,
                                       eval_manifest.examples_version, eval_manifest.sequences_version))
    print(f"held-out day {eval_manifest.file_ds[eval_manifest.files[0]]} ({run_id}):")
    print(metrics_table(scores, min_positives=cfg.report.min_positives))


if __name__ == "__main__":
    raise SystemExit(main())
