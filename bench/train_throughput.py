"""CPU training throughput at the demo size: a baseline commit's code against this tree's, side by side.

    python -m bench.train_throughput [--baseline COMMIT --rounds 3 --steps 120 --checkpoint-every 60]

The demo's model (configs/demo.yaml: small Kunlun, torchrec tables, batch 512) trains through each
tree's own gem.train.Trainer on the same examples (both arms read the same rows): by default this
tree's generator at the demo's volumes over 3 days, day 3's impressions as examples with long-tailed
histories cut strictly before each impression (--world baseline: the baseline tree's generator,
gem.study.traffic, which the baseline commit must then have, in a smaller world of short histories).
  * baseline arm: the baseline tree's code on batches as its loader forms them (stream order,
    sequences cut at the loader's lengths 256 / 128 / 32);
  * new arm: this tree's code on batches as its loader forms them with the demo config
    (loader.length_sort_batches: rows of a buffer of that many batches sorted by length,
    gem.data.length_batching, the same function the loader calls; 1, the default, keeps stream
    order), the model computing each batch in model.kunlun.length_groups groups;
  * new code on the baseline's batches, to split the gain between the model and the batching;
  * the new arm with train.cpu_bf16 (bf16 autocast);
  * the new arm with train.compile (torch.compile of the dense body, inductor's C++ kernels, dynamic
    shapes): it warms up on every batch once, then times as many steps on them again; its compile
    seconds (a cold inductor cache in the first round, warm after) and the steps after which it pays
    for itself against the eager arm are reported. The other new arms run eager in fp32.
Arms run in alternating subprocesses (the baseline from a `git worktree` of --baseline); each
trains as the demo's pretraining does, its train.steps with a checkpoint every
train.checkpoint_every steps, and reports its mean step time after warm-up, saves included
(each arm's batches: the first ones its loader emits, as many as it trains on), and its mean step
before and after the first save. The summary: each arm's median over rounds, the ratios of the
medians, new / baseline within each round (a round's arms run minutes apart at most, so their ratio
sees less of the host's drift than the medians do), and each arm's padding share (the trainer's
padding_ratio: padding / padded block positions for the baseline, the padded share of the sequence
FLOPs for the jagged layout). The figures are published through bench.results (train_throughput).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

REPO = Path(__file__).resolve().parents[1]
LOADER_LENGTHS = {"impression": 256, "click": 128, "conversion": 32}  # LoaderConfig defaults (the demo's)


# ---- examples (run inside the baseline tree, so both arms read identical rows) -------------------
# The worlds examples can come from: (days simulated, impressions a day, users, ads). "demo": this
# tree's generator at configs/demo.yaml's volumes, the last of its 3 pipeline days before the held-out
# day (histories as long as the demo's pretraining sees); "baseline": the baseline tree's generator
# in a smaller world (6k users, short histories).
WORLDS = {"demo": (3, 50_000, 2_000, 500), "baseline": (2, 60_000, 6_000, 2_000)}


def make_examples(out: Path, world: str, seed: int = 7) -> None:
    """The last day of a simulation of `world` (WORLDS) -> flat arrays in `out` (.npz)."""
    from gem.study.traffic import batches, simulate

    days, per_day, users, ads = WORLDS[world]
    traffic = simulate(days=days, impressions_per_day=per_day, users=users, ads=ads, seed=seed)
    (batch,) = batches(traffic, (days - 1,), 10**9, LOADER_LENGTHS, seed=seed)  # every example, shuffled
    arrays = {"user": batch.sparse["user_id"].values.numpy(), "ad": batch.sparse["ad_id"].values.numpy(),
              "surface": batch.sparse["surface"].values.numpy(), "position": batch.sparse["position"].values.numpy(),
              "clicked": batch.labels.sum(1).numpy(), "time_us": batch.impression_times.numpy()}
    for event, seq in batch.sequences.items():
        arrays[f"{event}.offsets"] = seq.offsets.numpy()
        for name, values in seq.values.items():
            arrays[f"{event}.{name}"] = values.numpy()
    np.savez(out, **arrays)


# ---- batches (this tree composes them; each arm's worker rebuilds them with its own Batch) -------
def compose(examples: Path, out: Path, new_loader: bool, batch_size: int, count: int) -> None:
    """The first `count` full batches as the baseline's loader forms them (stream order, sequences
    cut at the loader's lengths) or this tree's (cut at what the model reads, rows length-sorted
    within buffers of loader.length_sort_batches) -> a torch file of plain tensors."""
    import torch

    from gem.config import load_config
    from gem.data.encode import DENSE_COLUMNS
    from gem.data.length_batching import length_sorted_batches

    cfg = load_config(REPO / "configs" / "demo.yaml", environ={})
    tasks = [f"{s}/{t}" for s, t in cfg.tasks]
    ex = np.load(examples)
    n = len(ex["user"])
    offsets = {e: ex[f"{e}.offsets"] for e in LOADER_LENGTHS}
    cut = cfg.loader.capped(cfg.model.sequence_lengths()) if new_loader else cfg.loader
    # The newest `cut` events of each example's history (LOADER_LENGTHS holds at least that many).
    starts = {e: np.maximum(offsets[e][:-1], offsets[e][1:] - cut.max_length(e)) for e in LOADER_LENGTHS}
    lengths = np.stack([offsets[e][1:] - starts[e] for e in LOADER_LENGTHS], axis=1)
    rows = np.arange(n)
    if new_loader:
        buffer = batch_size * cut.length_sort_batches
        groups = [rows[lo:lo + buffer][g] for lo in range(0, n, buffer)
                  for g in length_sorted_batches(lengths[lo:lo + buffer], batch_size, [0, 0, 0, lo, 0])]
    else:
        groups = [rows[lo:lo + batch_size] for lo in range(0, n, batch_size)]
    # The first `count` full batches in the order the loader emits them (a length-sorted buffer's come
    # in a seeded order, so they are a sample of it): each arm trains on distinct batches, as the
    # demo's pretraining does, never on one batch over and over.
    groups = [g for g in groups if len(g) == batch_size][:count]
    rng = np.random.default_rng(0)
    dense_dim = len(DENSE_COLUMNS)
    out_batches = []
    for g in groups:
        b = len(g)
        task_of = rng.integers(0, len(tasks), b)
        sparse = {name: torch.from_numpy(rng.integers(0, 1 << 40, b)) for name in
                  ("advertiser_id", "campaign_id", "objective", "creative_type")}
        sparse |= {"user_id": torch.from_numpy(ex["user"][g]), "ad_id": torch.from_numpy(ex["ad"][g]),
                   "surface": torch.from_numpy(ex["surface"][g]), "position": torch.from_numpy(ex["position"][g])}
        seqs = {}
        for e in LOADER_LENGTHS:
            first, end = starts[e][g], offsets[e][g + 1]
            index = np.concatenate([np.arange(lo, hi) for lo, hi in zip(first, end, strict=True)]).astype(np.int64)
            fields = {f: torch.from_numpy(ex[f"{e}.{f}"][index]) for f in ("ad_id", "surface", "objective", "gap_s")}
            seqs[e] = {"offsets": torch.from_numpy(np.concatenate([[0], np.cumsum(end - first)]).astype(np.int64)),
                       **fields}
        mask = np.zeros((b, len(tasks)), dtype=bool)
        mask[np.arange(b), task_of] = True
        out_batches.append({
            "dense": torch.from_numpy(rng.normal(size=(b, dense_dim)).astype(np.float32)), "sparse": sparse,
            "sequences": seqs, "labels": torch.from_numpy(mask * ex["clicked"][g][:, None].astype(np.float32)),
            "label_mask": torch.from_numpy(mask), "weights": torch.from_numpy(mask.astype(np.float32)),
            "tasks": tasks, "times": torch.from_numpy(ex["time_us"][g])})
    torch.save(out_batches, out)


# ---- one arm (runs inside the tree under test, with that tree's gem) -----------------------------
def _demo_train_config():
    """configs/demo.yaml's train section (this tree's): the steps and checkpoint cadence of the demo's pretraining."""
    from gem.config import load_config

    return load_config(REPO / "configs" / "demo.yaml", environ={}).train


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def worker(batches_path: Path, steps: int, warmup: int, checkpoint_every: int, cpu_bf16: bool = False,
           compile_body: bool = False) -> dict[str, object]:
    import torch

    from gem.config import load_config
    from gem.data.batch import Batch, Jagged, Sparse
    from gem.data.encode import DENSE_COLUMNS
    from gem.data.loader import SPARSE_FEATURES
    from gem.model.build import build_task
    from gem.train.trainer import Trainer

    torch.manual_seed(0)
    cfg = load_config(Path.cwd() / "configs" / "demo.yaml", environ={})
    raw = torch.load(batches_path, weights_only=False)
    batches = []
    for r in raw:
        b = r["dense"].shape[0]
        ones = torch.ones(b, dtype=torch.int32)
        batches.append(Batch(
            dense=r["dense"], sparse={f: Sparse(r["sparse"][f], ones) for f in SPARSE_FEATURES},
            sequences={e: Jagged({k: v for k, v in s.items() if k != "offsets"}, s["offsets"])
                       for e, s in r["sequences"].items()},
            labels=r["labels"], label_mask=r["label_mask"], weights=r["weights"], tasks=tuple(r["tasks"]),
            impression_times=r["times"]))
    stamps: list[float] = []
    graphs: list[int] = []  # graphs compiled by the time the timed steps start (train.compile)

    # Not gem.train.trainer.CyclingStream: this worker also runs in the baseline tree, which predates it.
    class Stream:
        def batches(self, limit=None):
            for i in range(limit):
                stamps.append(time.perf_counter())  # the previous step has finished
                if i == warmup:
                    graphs.append(compiled_graphs())
                yield batches[i % len(batches)]

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    task = build_task(cfg.model, tuple(raw[0]["tasks"]), SPARSE_FEATURES, len(DENSE_COLUMNS))
    # Checkpoints every `checkpoint_every` steps, as the demo's training does (each save is timed in its
    # step, and whatever it leaves behind in the later steps).
    overrides = ({"steps": warmup + steps + 1, "checkpoint_every": checkpoint_every}
                 | ({"cpu_bf16": True} if cpu_bf16 else {}) | ({"compile": True} if compile_body else {}))
    train = cfg.train.__class__(**{**cfg.train.__dict__, **overrides})
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(task, Stream(), train, Path(run_dir))
        result = trainer.fit()
        trainer.close()
    # Mean, not median: length-sorted batches differ in cost by design, and throughput is their mean.
    steps_s = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:], strict=False)]  # step warmup + i
    step_s = statistics.fmean(steps_s)
    # The steps before the first save and after it (the save's own step left out): what a save leaves behind.
    saved = checkpoint_every - warmup - 1  # index in steps_s of the step that ends with the first save
    around = ({"before_first_save_s": round(statistics.fmean(steps_s[:saved]), 4),
               "after_first_save_s": round(statistics.fmean(steps_s[saved + 1:]), 4)}
              if 0 < saved < len(steps_s) - 1 else {})
    # Under train.compile the warm-up holds the compilations: its excess over as many timed steps.
    return {"step_s": step_s, "examples_per_s": raw[0]["dense"].shape[0] / step_s, **around,
            "warmup_excess_s": round(stamps[warmup] - stamps[0] - warmup * step_s, 1),
            **({"graphs_compiled_while_measured": compiled_graphs() - graphs[0]} if compile_body else {}),
            "padding": {e: round(r, 4) for e, r in result.padding_ratio.items()}, "threads": torch.get_num_threads()}


def run_arm(tree: Path, batches: Path, steps: int, warmup: int, checkpoint_every: int,
            cpu_bf16: bool = False, compile_body: bool = False, compile_cache: Path | None = None
            ) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if compile_cache is not None:  # the bench's own inductor cache: cold in the first round, warm after
        env["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(batches),
                          "--steps", str(steps), "--warmup", str(warmup), "--checkpoint-every", str(checkpoint_every),
                          *(["--cpu-bf16"] if cpu_bf16 else []), *(["--compile"] if compile_body else [])],
                         cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"arm in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Plan:
    """What a run compares: the baseline commit, whose examples (the world), and how the arms train:
    rounds, timed steps, steps between checkpoints, warm-up steps."""

    baseline: str
    world: str
    rounds: int
    steps: int
    checkpoint_every: int
    warmup: int


def command_line(
    baseline: Annotated[str, typer.Option(help="the commit whose code the new arms are compared with")] = "af6e102",
    baseline_tree: Annotated[Path | None, typer.Option(help="an existing checkout of it (else a worktree)")] = None,
    rounds: Annotated[int, typer.Option()] = 3,
    steps: Annotated[int | None, typer.Option(help="timed steps (default: the demo's train.steps)")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(
        help="steps between checkpoints (default: the demo's train.checkpoint_every)")] = None,
    warmup: Annotated[int, typer.Option()] = 2,
    worker_batches: Annotated[Path | None, typer.Option("--worker", hidden=True)] = None,
    world: Annotated[str, typer.Option(
        help=f"whose examples ({', '.join(sorted(WORLDS))}): this tree's generator at the demo's volumes, "
             "or the baseline's world")] = "demo",
    make_examples_to: Annotated[Path | None, typer.Option("--make-examples", hidden=True)] = None,
    cpu_bf16: Annotated[bool, typer.Option("--cpu-bf16", hidden=True)] = False,
    compile_body: Annotated[bool, typer.Option("--compile", hidden=True)] = False,
    # Not bench.results.ResultsDirOption: the workers run this file in the baseline tree, whose
    # bench package may not have that module; only the summary (this tree) imports it.
    results_dir: Annotated[Path | None, typer.Option(
        help="folder for the result's JSON (default: docs/benchmarks)")] = None,
) -> None:
    """CPU training throughput at the demo size: a baseline commit's code against this tree's, side by side."""
    if world not in WORLDS:
        raise typer.BadParameter(f"one of {', '.join(sorted(WORLDS))}", param_hint="--world")
    if make_examples_to:
        make_examples(make_examples_to, world)
        return
    if steps is None or checkpoint_every is None:  # resolved here: a worker may run under the baseline's gem
        demo = _demo_train_config()
        steps = demo.steps if steps is None else steps
        checkpoint_every = demo.checkpoint_every if checkpoint_every is None else checkpoint_every
    if worker_batches:
        print(json.dumps(worker(worker_batches, steps, warmup, checkpoint_every, cpu_bf16, compile_body)))
        return
    compare(Plan(baseline, world, rounds, steps, checkpoint_every, warmup), baseline_tree, results_dir)


def compare(plan: Plan, baseline_tree: Path | None, results_dir: Path | None) -> None:
    """The arms side by side, plan.rounds times, in subprocesses; the summary printed and published."""
    work = Path(tempfile.mkdtemp(prefix="gem-train-bench-"))
    tree = baseline_tree
    if tree is None:
        tree = work / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), plan.baseline], check=True,
                       capture_output=True)
    try:
        if plan.world == "baseline" and not (tree / "gem" / "study" / "traffic.py").is_file():
            raise SystemExit(f"--world baseline makes examples with the baseline tree's gem.study.traffic, "
                             f"which {plan.baseline} does not have: use --world demo or a later --baseline")
        examples = work / "examples.npz"
        generator = REPO if plan.world == "demo" else tree  # both arms read the same rows either way
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--make-examples", str(examples),
                        "--world", plan.world], cwd=generator, env={**os.environ, "PYTHONPATH": str(generator)},
                       check=True)
        count = plan.warmup + plan.steps + 1
        stream, grouped = work / "stream.pt", work / "sorted.pt"
        compose(examples, stream, False, 512, count)
        compose(examples, grouped, True, 512, count)
        # name: (tree, batches, train.cpu_bf16, train.compile)
        arms = {"baseline": (tree, stream, False, False), "new": (REPO, grouped, False, False),
                "new code, stream-order batches": (REPO, stream, False, False),
                "new, bf16 autocast": (REPO, grouped, True, False),
                "new, torch.compile": (REPO, grouped, False, True)}
        results: dict[str, list[dict[str, object]]] = {k: [] for k in arms}
        for r in range(plan.rounds):
            for name, (root, batches, cpu_bf16, compile_body) in arms.items():
                # The compiled arm warms up on every batch once: inductor compiles again when a batch's
                # token counts cross a size its kernels were specialized at (a reduction over more than
                # 4,096 rows takes another accumulator). It then measures as many steps on the same
                # batches again (a checkpoint every checkpoint_every steps still); the worker reports
                # any graph compiled while it was timed.
                warmup = count if compile_body else plan.warmup
                results[name].append(run_arm(root, batches, plan.steps, warmup, plan.checkpoint_every, cpu_bf16,
                                             compile_body, work / "inductor-cache"))
                print(f"round {r + 1} {name}: {results[name][-1]}", flush=True)
        medians = {k: statistics.median(x["examples_per_s"] for x in v) for k, v in results.items()}
        print(f"\nCPU training at the demo size (batch 512, {results['new'][0]['threads']} threads), "
              f"median over {plan.rounds} rounds of the mean of {plan.steps} steps, a checkpoint every "
              f"{plan.checkpoint_every}:")
        for name, value in medians.items():
            print(f"  {name:32s} {value:8.0f} examples/s   padding {results[name][0]['padding']}")
        print(f"  speed-up new / baseline: {medians['new'] / medians['baseline']:.2f}x "
              f"(model alone: {medians['new code, stream-order batches'] / medians['baseline']:.2f}x; "
              f"in bf16 autocast: {medians['new, bf16 autocast'] / medians['baseline']:.2f}x)")
        # Each round's arms ran minutes apart at most: their ratio sees less of the host's drift.
        paired = [n["examples_per_s"] / b["examples_per_s"] for n, b in zip(results["new"], results["baseline"],
                                                                                 strict=True)]
        print(f"  new / baseline within each round: {', '.join(f'{r:.2f}' for r in paired)} "
              f"(median {statistics.median(paired):.2f}x)")
        compiled = results["new, torch.compile"]
        paired = [c["examples_per_s"] / b["examples_per_s"] for c, b in zip(compiled, results["baseline"], strict=True)]
        print(f"  torch.compile / baseline: {medians['new, torch.compile'] / medians['baseline']:.2f}x, within each "
              f"round {', '.join(f'{r:.2f}' for r in paired)} (median {statistics.median(paired):.2f}x)")
        # Compilation is in the compiled arm's warm-up, left out of its mean: the steps after which it
        # has paid for itself against the eager arm of the same round.
        for r, (c, e) in enumerate(zip(compiled, results["new"], strict=True), start=1):
            saved = e["step_s"] - c["step_s"]
            even = f"{c['warmup_excess_s'] / saved:.0f} steps" if saved > 0 else "never"
            print(f"  round {r}: compiling took {c['warmup_excess_s']:.0f} s "
                  f"({'cold' if r == 1 else 'warm'} inductor cache), paid back after {even}")
        publish(results, plan, results_dir)
    finally:
        if baseline_tree is None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)  # the examples and batches: about 0.6 GB


ARM_KEYS = {"baseline": "baseline", "new": "new", "new code, stream-order batches": "new_code_stream_batches",
            "new, bf16 autocast": "new_bf16", "new, torch.compile": "new_compile"}


def publish(results: dict[str, list[dict[str, object]]], plan: Plan, results_dir: Path | None) -> None:
    """Each arm's median examples/s, the ratios to the baseline (of the medians and within rounds) and
    the compile seconds, as the `train_throughput` result."""
    from bench.results import RESULTS_DIR, Figure, record

    def rate(arm: str) -> float:
        return statistics.median(x["examples_per_s"] for x in results[arm])

    def paired(arm: str) -> float:
        return statistics.median(n["examples_per_s"] / b["examples_per_s"]
                                 for n, b in zip(results[arm], results["baseline"], strict=True))

    base = rate("baseline")
    figures = [Figure(f"{key}_examples_per_s", f"{arm} (median over rounds)", round(rate(arm)), "examples/s")
               for arm, key in ARM_KEYS.items()]
    figures += [Figure(f"{key}_over_baseline", f"{arm} / baseline (medians)", round(rate(arm) / base, 2), "x")
                for arm, key in ARM_KEYS.items() if arm != "baseline"]
    figures += [Figure("new_over_baseline_paired", "new / baseline within each round (median)",
                       round(paired("new"), 2), "x"),
                Figure("new_compile_over_baseline_paired", "new, torch.compile / baseline within each round (median)",
                       round(paired("new, torch.compile"), 2), "x")]
    compiled = results["new, torch.compile"]
    figures.append(Figure("compile_cold_s", "torch.compile, compiling from a cold inductor cache",
                          compiled[0]["warmup_excess_s"], "s"))
    if len(compiled) > 1:
        figures.append(Figure("compile_warm_s", "torch.compile, compiling from a warm inductor cache (median)",
                              statistics.median(c["warmup_excess_s"] for c in compiled[1:]), "s"))
    record("train_throughput", "CPU training at the demo size: a baseline commit against this tree, side by side",
           figures, notes=f"baseline {plan.baseline}; {plan.rounds} rounds of {plan.steps} steps, a checkpoint every "
                          f"{plan.checkpoint_every}; batch 512, {results['new'][0]['threads']} threads; "
                          f"examples from the {plan.world} world.",
           extra={"baseline": plan.baseline,
                  "padding": {key: results[arm][0]["padding"] for arm, key in ARM_KEYS.items()}},
           results_dir=results_dir or RESULTS_DIR)


if __name__ == "__main__":
    typer.run(command_line)
