"""The training data path on a real lakehouse: loader-only and pretraining examples/s, this tree
against baseline commits, side by side in one run.

    python -m bench.data_path --lakehouse DIR --ds D [--config configs/demo.yaml] [--name movielens]
                              [--baseline COMMIT ...] [--rounds 3] [--batches 80] [--steps 60] [--warmup 10]

Each arm runs in its own subprocess inside its tree (this one, or a `git worktree` of each
--baseline), with that tree's gem, on the same lakehouse and the train manifest jobs.mix wrote for
--ds, built as the pretraining job builds it (gem.train.daily: the config's tasks the manifest
holds, the loader cut at what the model reads):
  loader      `--batches` batches of ResumableLoader with the config's loader (loader.num_workers
              worker processes, or in process as loader.in_process says; --in-process / --workers
              choose), twice: the first pass starts with an empty host cache (gem.data.local_cache, a
              new folder per arm and round; a tree without one decodes every pass) and is reported
              as the cold figure; the second, timed the same way, is the loader's steady state: examples/s,
              and each worker process's own memory at its largest (USS: what it does not share with
              the training process it forked from; in process, the training process's resident
              growth while loading);
  pretrain    the default model (the config's) trained through gem.train.Trainer for `--steps` steps
              after `--warmup` untimed ones, no checkpoint, with the host cache the loader arm filled
              (a daily run finds the earlier days' files there): examples/s, and the loader's share of
              the CPU time (its worker processes' CPU over all CPU spent; in-process, the time the
              training loop waits in the loader over the wall time).
Rounds alternate the arms, so the host's drift lands on all of them; the summary gives each arm's
median and each ratio to the first --baseline within rounds. Figures are published through
bench.results as `data_path_<name>`. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer

REPO = Path(__file__).resolve().parents[1]


# ---- one arm (runs inside the tree under test, with that tree's gem: imported in the functions) ---
class MemorySampler(threading.Thread):
    """Polls this process's resident memory and its children's unique memory (USS: the pages a
    forked worker does not share with its parent) every 50 ms: the largest of each."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.me = psutil.Process()
        self.own_max, self.children_max = 0, {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            self.own_max = max(self.own_max, self.me.memory_info().rss)
            for child in self.me.children(recursive=True):
                try:
                    uss = child.memory_full_info().uss
                    self.children_max[child.pid] = max(self.children_max.get(child.pid, 0), uss)
                except psutil.NoSuchProcess:  # a worker that exited between the listing and the read
                    pass

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def train_loader_setup(lakehouse: str, config: str, ds: str, in_process: bool | None, cache_dir: str = ""
           ) -> tuple[Any, Any, tuple[str, ...], Any]:
    """(cfg, the train manifest, the tasks, the loader config) as gem.train.daily builds them. An older
    tree's config may lack a newer option (LoaderConfig.capped, in_process): the arm then runs as that
    tree's pretraining did."""
    import dataclasses

    from gem.config import load_config
    from gem.data.manifest import read_manifest

    cfg = load_config(config or None, overrides={"lakehouse_uri": lakehouse}, environ={})
    manifest = read_manifest(cfg, ds, "train")
    names = {s.name for s in manifest.sources}
    tasks = tuple(f"{s}/{t}" for s, t in cfg.tasks if f"{s}/{t}" in names)
    loader_cfg = cfg.loader.capped(cfg.model.sequence_lengths()) if hasattr(cfg.loader, "capped") else cfg.loader
    if in_process is not None and hasattr(loader_cfg, "in_process"):
        loader_cfg = dataclasses.replace(loader_cfg, in_process=in_process)
    if cache_dir and hasattr(loader_cfg, "local_cache_dir"):
        loader_cfg = dataclasses.replace(loader_cfg, local_cache_dir=cache_dir)
    return cfg, manifest, tasks, loader_cfg


def _in_process(loader_cfg: Any) -> bool:
    return bool(getattr(loader_cfg, "in_process", False)) or not loader_cfg.num_workers


def loader_arm(lakehouse: str, config: str, ds: str, batches: int, in_process: bool | None, cache_dir: str
               ) -> dict[str, Any]:
    from gem.data.loader import ExampleStream, ResumableLoader

    _, manifest, tasks, loader_cfg = train_loader_setup(lakehouse, config, ds, in_process, cache_dir)
    t0, cold = time.perf_counter(), 0
    for batch in ResumableLoader(ExampleStream(manifest, tasks, loader_cfg)).batches(limit=batches):
        cold += batch.size  # the first pass: an empty host cache, the imports the workers make
    cold_seconds = time.perf_counter() - t0
    before = psutil.Process().memory_info().rss
    sampler = MemorySampler()
    sampler.start()
    loader = ResumableLoader(ExampleStream(manifest, tasks, loader_cfg))
    t0, n = time.perf_counter(), 0
    for batch in loader.batches(limit=batches):
        n += batch.size
    seconds = time.perf_counter() - t0
    sampler.stop()
    workers_mib = ([round((sampler.own_max - before) / 2**20)] if _in_process(loader_cfg)
                   else sorted(round(v / 2**20) for v in sampler.children_max.values()))
    return {"examples_per_s": n / seconds, "examples": n, "seconds": seconds, "worker_mib": workers_mib,
            "first_pass_examples_per_s": cold / cold_seconds, "in_process": _in_process(loader_cfg)}


def pretrain_arm(lakehouse: str, config: str, ds: str, steps: int, warmup: int, in_process: bool | None,
                 cache_dir: str) -> dict[str, Any]:
    import torch

    from gem.data.encode import DENSE_COLUMNS
    from gem.data.loader import SPARSE_FEATURES, ExampleStream, ResumableLoader
    from gem.model.build import build_task

    try:
        from gem.train.trainer import Trainer
    except ImportError:  # a tree whose training loop is the module gem.train
        from gem.train import Trainer

    torch.manual_seed(0)
    cfg, manifest, tasks, loader_cfg = train_loader_setup(lakehouse, config, ds, in_process, cache_dir)
    loader = ResumableLoader(ExampleStream(manifest, tasks, loader_cfg))
    stamps: list[float] = []
    sizes: list[int] = []
    waited = [0.0]  # seconds the timed steps spent waiting on the loader

    class Timed:  # the loader, its batches stamped: each stamp is the end of the previous step
        def batches(self, limit: int | None = None):
            it = loader.batches(limit=limit)
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                if len(stamps) > warmup:
                    waited[0] += time.perf_counter() - t0
                stamps.append(time.perf_counter())
                sizes.append(batch.size)
                yield batch

        def state_dict(self) -> dict[str, Any]:
            return loader.state_dict()

        def load_state_dict(self, state: dict[str, Any]) -> None:
            loader.load_state_dict(state)

    task = build_task(cfg.model, tasks, SPARSE_FEATURES, len(DENSE_COLUMNS), cfg.train.task_weights)
    train = cfg.train.__class__(**{**cfg.train.__dict__, "steps": warmup + steps + 1, "checkpoint_every": 10**9})
    with tempfile.TemporaryDirectory() as run_dir:  # never written: no checkpoint in the run's steps
        cpu0 = os.times()
        trainer = Trainer(task, Timed(), train, Path(run_dir))
        trainer.fit()
        cpu1 = os.times()
        getattr(trainer, "close", lambda: None)()  # the one-rank process group, where the tree has one
    timed = stamps[warmup:]  # timed[i] .. timed[i + 1]: the step on batch warmup + i
    wall = timed[-1] - timed[0]
    own = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    children = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    share = waited[0] / wall if _in_process(loader_cfg) else children / max(own + children, 1e-9)
    return {"examples_per_s": sum(sizes[warmup:-1]) / wall, "step_s": wall / (len(timed) - 1),
            "loader_cpu_share": share, "threads": torch.get_num_threads()}


# ---- the comparison (this tree) -----------------------------------------------------------------
def run_arm(tree: Path, args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"arm {args[:2]} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def command_line(
    lakehouse: Annotated[str, typer.Option(help="a lakehouse with a train manifest for --ds (jobs.mix)")],
    ds: Annotated[str, typer.Option(help="the manifest's day")],
    config: Annotated[str, typer.Option(
        help="the pipeline config, relative to each tree; empty: each tree's defaults")] = "",
    name: Annotated[str, typer.Option(help="the history's name in the result: data_path_<name>")] = "movielens",
    baseline: Annotated[list[str] | None, typer.Option(help="commits compared with this tree (repeat)")] = None,
    rounds: Annotated[int, typer.Option()] = 3,
    batches: Annotated[int, typer.Option(help="loader batches timed per arm")] = 80,
    steps: Annotated[int, typer.Option(help="training steps timed per arm")] = 60,
    warmup: Annotated[int, typer.Option(help="training steps before the timed ones")] = 10,
    in_process: Annotated[bool | None, typer.Option(
        "--in-process/--workers", help="the loader in process or in worker processes (default: the config's)")] = None,
    arm: Annotated[str | None, typer.Option("--arm", hidden=True)] = None,
    cache_dir: Annotated[str, typer.Option("--cache-dir", hidden=True)] = "",
    results_dir: Annotated[Path | None, typer.Option(help="folder for the result's JSON (default: docs/benchmarks)")]
    = None,
) -> None:
    """Loader-only and pretraining examples/s on a lakehouse: baseline commits against this tree."""
    lakehouse = str(Path(lakehouse).resolve())
    if arm == "loader":
        print(json.dumps(loader_arm(lakehouse, config, ds, batches, in_process, cache_dir)))
        return
    if arm == "pretrain":
        print(json.dumps(pretrain_arm(lakehouse, config, ds, steps, warmup, in_process, cache_dir)))
        return
    baselines = list(baseline or [])
    work = Path(tempfile.mkdtemp(prefix="gem-data-path-"))
    trees = {"this tree": REPO}
    try:
        for commit in baselines:
            trees[commit] = work / commit
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(trees[commit]), commit],
                           check=True, capture_output=True)
        results: dict[str, dict[str, list[dict[str, Any]]]] = {t: {"loader": [], "pretrain": []} for t in trees}
        flags = ["--lakehouse", lakehouse, "--ds", ds, "--config", config, "--batches", str(batches),
                 "--steps", str(steps), "--warmup", str(warmup),
                 *([] if in_process is None else ["--in-process" if in_process else "--workers"])]
        for r in range(rounds):
            caches = {label: work / f"cache-{r}-{i}" for i, label in enumerate(trees)}  # empty for each round
            for mode in ("loader", "pretrain"):
                for label, tree in trees.items():
                    try:
                        got = run_arm(tree, ["--arm", mode, *flags, "--cache-dir", str(caches[label])])
                    except RuntimeError as e:  # a baseline that cannot read this lakehouse: said, not fatal
                        print(f"round {r + 1} {mode} {label}: failed ({str(e).splitlines()[-1]})", flush=True)
                        continue
                    results[label][mode].append(got)
                    print(f"round {r + 1} {mode} {label}: {json.dumps(got)}", flush=True)
        publish(results, name, lakehouse, ds, config, baselines, rounds, in_process, results_dir)
    finally:
        for commit in baselines:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(trees[commit])], check=False)
        shutil.rmtree(work, ignore_errors=True)


def publish(results: dict[str, dict[str, list[dict[str, Any]]]], name: str, lakehouse: str, ds: str, config: str,
            baselines: list[str], rounds: int, in_process: bool | None, results_dir: Path | None) -> None:
    """Each arm's medians and the ratios of this tree to the first baseline (within rounds), printed and
    published as data_path_<name>."""
    from bench.results import RESULTS_DIR, Figure, record  # arms run in trees that may lack it

    def median(label: str, mode: str, key: str) -> float | None:
        values = [x[key] for x in results[label][mode]]
        return statistics.median(values) if values else None

    figures = []
    print(f"\n{name}: {lakehouse} ds={ds} ({config or 'default config'}), median of {rounds} rounds")
    for label in results:
        key = "this_tree" if label == "this tree" else label
        loader, train = median(label, "loader", "examples_per_s"), median(label, "pretrain", "examples_per_s")
        first = median(label, "loader", "first_pass_examples_per_s")
        share = median(label, "pretrain", "loader_cpu_share")
        mib = max(max(x["worker_mib"]) for x in results[label]["loader"]) if results[label]["loader"] else None
        print(f"  {label:12s} loader {loader or 0:9.0f} examples/s (first pass {first or 0:.0f}; largest worker {mib} MiB)"
              f" | pretrain "
              f"{train or 0:7.0f} examples/s, loader's CPU share {share or 0:.0%}")
        if loader is not None:
            figures += [Figure(f"{key}_loader_examples_per_s", f"{label}: loader only", round(loader), "examples/s"),
                        Figure(f"{key}_loader_first_pass_examples_per_s", f"{label}: loader only, first pass (an "
                               "empty host cache)", round(first or 0), "examples/s"),
                        Figure(f"{key}_worker_mib", f"{label}: the largest loader worker's own memory (USS; in "
                               "process: the training process's growth)", mib, "MiB")]
        if train is not None:
            figures += [Figure(f"{key}_pretrain_examples_per_s", f"{label}: pretraining", round(train), "examples/s"),
                        Figure(f"{key}_loader_cpu_share", f"{label}: the loader's share of the CPU in pretraining",
                               round(share, 3), "")]
    for commit in baselines:
        for mode, key in (("loader", "examples_per_s"), ("loader", "first_pass_examples_per_s"),
                          ("pretrain", "examples_per_s")):
            pairs = [n[key] / b[key] for n, b in zip(results["this tree"][mode], results[commit][mode], strict=False)
                     if key in n and key in b]
            what = "loader_first_pass" if key.startswith("first") else mode
            if pairs:
                ratio = statistics.median(pairs)
                print(f"  this tree / {commit}, {what}: {ratio:.2f}x (within rounds: "
                      f"{', '.join(f'{p:.2f}' for p in pairs)})")
                figures.append(Figure(f"{what}_over_{commit}", f"this tree / {commit}, {what.replace('_', ' ')}, "
                                      "within rounds (median)", round(ratio, 2), "x"))
    record(f"data_path_{name}", f"The training data path on the {name} history: this tree against "
           f"{', '.join(baselines) or 'itself'}", figures,
           notes=f"ds={ds}, {config or 'default config'}; {rounds} rounds; loader "
                 f"{ {None: 'as the config says', True: 'in process', False: 'in worker processes'}[in_process] }.",
           extra={"baselines": baselines, "runs": results}, results_dir=results_dir or RESULTS_DIR)


if __name__ == "__main__":
    typer.run(command_line)
