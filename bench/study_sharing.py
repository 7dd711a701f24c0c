"""The quality study's training on one GPU: one process alone against several sharing it.

    python -m bench.study_sharing [--jobs kunlun@2,interformer@2,dlrm@2] [--processes 1,4,8]
                                  [--batch 4096] [--steps 20]

The gpu preset runs its jobs in forked worker processes that share the GPU (gem.study.study): each
training step of these small models launches thousands of kernels, so one process alone leaves the
GPU waiting on Python, and the question is how many processes pay. For each job (sized by the
preset's own sizing to its compute target) and each process count P, P forked processes each train
the job through gem.study.runner.run (the study's training, batches moved to the GPU once) for
`--steps` batches of the preset's traffic at a smaller volume, side by side; the figure is the
examples per second of all P together (P x steps x batch over the slowest process's time), and
its ratio to one process alone. On CUDA in bf16, published through bench.results (study_sharing);
`--device cpu` is a smoke run (one thread per process), printed only.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from pathlib import Path
from typing import Annotated, Literal

# NVML answers whether there is a GPU: the parent must not initialize CUDA before it forks.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch
import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import run_function
from gem.study.presets import PRESETS
from gem.study.runner import run
from gem.study.study import Study

_SHARED: tuple = ()  # (config, batches) of the job under test, inherited by the forked processes


def _one_process(_: int) -> float:
    cfg, batches, device = _SHARED
    torch.set_num_threads(1)
    run(cfg, batches[:3], {}, 1e-3, 0, 1, device, True)  # warm-up: CUDA context, kernels, allocator
    return run(cfg, batches, {}, 1e-3, 0, 1, device, True).seconds


def measure(cfg, batches, processes: int, device: torch.device) -> float:
    """Examples per second of `processes` forked processes training side by side."""
    global _SHARED
    _SHARED = (cfg, batches, device)
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        seconds = pool.map(_one_process, range(processes))
    return processes * sum(b.size for b in batches) / max(seconds)


def command_line(
    jobs: Annotated[str, typer.Option()] = "kunlun@2,interformer@2,dlrm@2",
    processes: Annotated[str, typer.Option()] = "1,4,8",
    batch: Annotated[int | None, typer.Option(help="default: the gpu preset's")] = None,
    steps: Annotated[int, typer.Option()] = 20,
    device: Annotated[Literal["cuda", "cpu"], typer.Option()] = "cuda",
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> dict[str, dict[int, float]]:
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA: nothing to measure")
        return {}
    gpu = PRESETS["gpu"]
    preset = dataclasses.replace(gpu, batch_size=batch or gpu.batch_size, device=device,
                                 traffic=dataclasses.replace(gpu.traffic, impressions_per_day=60_000))
    study = Study(preset, log=lambda _: None)
    planned, _, _ = study.plan()
    batches = study.data("train", study.tasks)[:steps]
    counts = [int(p) for p in processes.split(",")]
    print(f"batch {preset.batch_size}, {len(batches)} steps per process; examples/s of all processes together")
    results: dict[str, dict[int, float]] = {}
    for name in jobs.split(","):
        job = planned[name]
        started = time.perf_counter()
        results[name] = {p: measure(job.config, batches, p, study.device) for p in counts}
        alone = results[name][counts[0]]
        cells = "  ".join(f"{p} proc {r:>9,.0f} ({r / alone:.2f}x)" for p, r in results[name].items())
        print(f"{name:<16} {job.flops / 1e6:>6.1f} MFLOP/ex  {cells}  [{time.perf_counter() - started:.0f} s]", flush=True)
    if device == "cuda":
        publish(results, preset.batch_size, len(batches), results_dir)
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[int, float]] | None:
    """Each job's examples/s per process count (None after --help)."""
    return run_function(command_line, argv, prog="python -m bench.study_sharing", help=__doc__.splitlines()[0])


def publish(results: dict[str, dict[int, float]], batch: int, steps: int, results_dir: Path) -> None:
    """Each job's examples/s per process count and its ratio to the first count, as `study_sharing`."""
    figures = []
    for name, by_count in results.items():
        key, (first, alone) = name.replace("@", "_"), next(iter(by_count.items()))
        for p, rate in by_count.items():
            figures.append(Figure(f"{key}_p{p}_examples_per_s", f"{name}, {p} processes together", round(rate),
                                  "examples/s"))
            if p != first:
                figures.append(Figure(f"{key}_p{p}_over_p{first}", f"{name}, {p} processes / {first}",
                                      round(rate / alone, 2), "x"))
    record("study_sharing", "The quality study's training on one GPU: processes sharing it against one alone",
           figures, notes=f"batch {batch}, {steps} steps per process, bf16.", results_dir=results_dir)


if __name__ == "__main__":
    main()
