"""Does CPU bf16 autocast change what the demo's pretraining learns? fp32 against bf16, same seeds.

    python -m experiments.cpu_bf16_learning [--seeds 3 --steps 120]

The demo's model and trainer (configs/demo.yaml: small Kunlun, batch 512, the lr schedule, fused
AdamW; plain-torch tables, as the study's traffic carries only its own sparse features, and the
tables stay fp32 under autocast with either backend) train `--steps` steps on the generator's
traffic at the demo's volumes: days 1-2 train (day 0 is a cold start, as in the demo), day 3 is held
out. Each seed trains twice, in fp32 and under bf16 autocast (train.cpu_bf16), from the same initial
weights and the same batches; both score the held-out day in fp32, as the pipeline's evaluation
does. Printed: per arm the held-out NE pooled over the click tasks and over the conversion tasks
(mean and 95% interval over seeds), the paired difference bf16 - fp32 with its interval, the Bayes
floor, and each arm's training examples/s; the same figures are published through bench.results
(cpu_bf16_learning).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import torch
import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.config import load_config
from gem.model.build import build_task
from gem.stats import mean_interval
from gem.study.runner import Scores, base_rates
from gem.study.traffic import DENSE_DIM, SPARSE, batches, simulate
from gem.train.evaluate import predictions
from gem.train.trainer import CyclingStream, Trainer

REPO = Path(__file__).resolve().parents[1]


def train_and_score(cfg, train_batches: list, held_out: list, seed: int, steps: int, cpu_bf16: bool):
    """-> (Scores on the held-out day, training examples/s) of one arm."""
    torch.manual_seed(seed)
    model = dataclasses.replace(cfg.model, embeddings=dataclasses.replace(cfg.model.embeddings, backend="torch"))
    task = build_task(model, train_batches[0].tasks, SPARSE, DENSE_DIM)
    task.heads.init_from_base_rates(base_rates(train_batches))
    train_cfg = dataclasses.replace(cfg.train, steps=steps, checkpoint_every=10**6, cpu_bf16=cpu_bf16)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(task, CyclingStream(train_batches), train_cfg, Path(run_dir))
        start = time.perf_counter()
        result = trainer.fit()
        seconds = time.perf_counter() - start
        trainer.close()
    return Scores(predictions(task, held_out)), result.examples / seconds  # scored in fp32


def interval(values: list[float]) -> str:
    mean, low, high = mean_interval(values)
    return f"{mean:.4f} [{low:.4f}, {high:.4f}]"


def command_line(
    seeds: Annotated[int, typer.Option()] = 3,
    steps: Annotated[int, typer.Option(help="the demo's train.steps")] = 120,
    traffic_seed: Annotated[int, typer.Option()] = 7,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> None:
    cfg = load_config(REPO / "configs" / "demo.yaml", environ={})
    g = cfg.generator
    lengths = {e: cfg.loader.max_length(e) for e in ("impression", "click", "conversion")}  # the loader's cuts
    traffic = simulate(days=4, impressions_per_day=g.events_per_day, users=g.users, ads=g.ads,
                       seed=traffic_seed)
    train_batches = batches(traffic, (1, 2), cfg.loader.batch_size, lengths, seed=traffic_seed)
    train_batches = [b for b in train_batches if b.size == cfg.loader.batch_size]
    held_out = batches(traffic, (3,), 4096, lengths, shuffle=False)
    tasks = train_batches[0].tasks
    groups = {"click": tuple(t for t in tasks if t.endswith("/click")),
              "conversion": tuple(t for t in tasks if not t.endswith("/click"))}
    print(f"traffic: {len(train_batches)} training batches of {cfg.loader.batch_size} (days 1-2), "
          f"{sum(b.size for b in held_out)} held-out examples (day 3); {steps} steps per run, "
          f"{torch.get_num_threads()} threads", flush=True)

    ne: dict[str, dict[str, list[float]]] = {arm: {k: [] for k in groups} for arm in ("fp32", "bf16")}
    speed: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for seed in range(seeds):
        for arm in ("fp32", "bf16"):
            scores, examples_per_s = train_and_score(cfg, train_batches, held_out, seed, steps, arm == "bf16")
            speed[arm].append(examples_per_s)
            for k, names in groups.items():
                ne[arm][k].append(scores.ne(names))
            print(f"seed {seed} {arm}: click NE {ne[arm]['click'][-1]:.4f}, conversion NE "
                  f"{ne[arm]['conversion'][-1]:.4f}, {examples_per_s:,.0f} examples/s", flush=True)

    print(f"\nheld-out NE (day 3), mean and 95% interval over {seeds} seeds:")
    figures, intervals = [], {}
    for k, names in groups.items():
        diffs = [b - f for b, f in zip(ne["bf16"][k], ne["fp32"][k], strict=True)]
        floor = traffic.floor(3, names)
        print(f"  {k:10s} fp32 {interval(ne['fp32'][k])}   bf16 {interval(ne['bf16'][k])}   "
              f"bf16 - fp32 {interval(diffs)}   Bayes floor {floor:.4f}")
        mean, low, high = mean_interval(diffs)
        figures += [Figure(f"{k}_ne_fp32", f"{k} tasks: held-out NE, fp32 (mean over seeds)",
                           round(statistics.fmean(ne["fp32"][k]), 4)),
                    Figure(f"{k}_ne_bf16", f"{k} tasks: held-out NE, bf16 autocast (mean over seeds)",
                           round(statistics.fmean(ne["bf16"][k]), 4)),
                    Figure(f"{k}_ne_bf16_minus_fp32", f"{k} tasks: held-out NE, bf16 - fp32 (paired, mean)",
                           round(mean, 6))]
        if floor is not None:
            figures.append(Figure(f"{k}_bayes_floor", f"{k} tasks: the Bayes floor's NE", round(floor, 4)))
        if not math.isnan(low):  # an interval needs two seeds or more
            intervals[f"{k}_ne_bf16_minus_fp32_95"] = [round(low, 6), round(high, 6)]
    fp32, bf16 = statistics.median(speed["fp32"]), statistics.median(speed["bf16"])
    print(f"training examples/s (median over seeds): fp32 {fp32:,.0f}, bf16 {bf16:,.0f}")
    figures += [Figure("fp32_examples_per_s", "training, fp32 (median over seeds)", round(fp32), "examples/s"),
                Figure("bf16_examples_per_s", "training, bf16 autocast (median over seeds)", round(bf16), "examples/s"),
                Figure("bf16_over_fp32_speed", "training speed, bf16 autocast / fp32", round(bf16 / fp32, 2), "x")]
    record("cpu_bf16_learning", "CPU bf16 autocast against fp32: held-out NE of the demo's pretraining, same seeds",
           figures, notes=f"{seeds} seeds, {steps} steps each; days 1-2 train, day 3 held out.",
           extra={"intervals": intervals}, results_dir=results_dir)


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m experiments.cpu_bf16_learning")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
