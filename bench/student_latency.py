"""A student's serving artifact (ONNX on onnxruntime) beside the eager student (torch), on CPU.

    python -m bench.student_latency [--surface reels] [--requests 200] [--threads 2]

The student is the one the distill stage trains (the default config's student.variant and sizes),
with random weights: latency does not depend on what it learned. It is exported as the stage
exports it (gem.serve.export: the export's seconds are a figure), then both score the same
synthetic requests (gem.serve.export.synthetic_rows: histories and code lists longer than the model
reads, so the inputs are as large as they get):
  1. latency at batch 1 and batch 64: per call, p50 and p99 over --requests calls, each on other
     rows; the artifact's session.run on encoded inputs, the eager student's logits on the Batch
     the training loader's encoding makes of the same rows;
  2. throughput: rows/s over batches of 1,024, the same split;
  3. the scorer end to end (gem.serve.score.Artifact.logits: feature rows -> encoding -> graph) in
     rows/s, what `gem score` spends per row besides reading and writing.
Both runtimes get --threads intra-op threads (default 1: a serving process per core; on a host
whose cores other work shares, more threads than free cores make torch's waits dominate). The
host's load average at the end goes into the result's extra. The figures are published through bench.results
(student_latency). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.config import load_config
from gem.data.encode import DENSE_COLUMNS
from gem.data.loader import SPARSE_FEATURES
from gem.model.student import build_student
from gem.serve import export
from gem.serve.features import model_inputs
from gem.serve.score import Artifact

THROUGHPUT_BATCH = 1024


def percentiles_ms(seconds: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    values = np.array(seconds) * 1e3
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def timed(calls: list[Callable[[], object]]) -> list[float]:
    """Each call's seconds, after one untimed warm-up call."""
    calls[0]()
    out = []
    for call in calls:
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def command_line(
    surface: Annotated[str, typer.Option(help="the student's surface (its tasks: the config's)")] = "reels",
    requests: Annotated[int, typer.Option(min=10, help="timed calls per batch size")] = 200,
    threads: Annotated[int, typer.Option(min=1, help="intra-op threads of both runtimes (one serving process "
                                                     "per core: 1)")] = 1,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> None:
    cfg = load_config()
    tasks = tuple(f"{s}/{t}" for s, t in cfg.tasks if s == surface)
    if not tasks:
        raise typer.BadParameter(f"the config has no tasks on {surface!r}", param_hint="--surface")
    code_dim = cfg.model.history_codes.code_dim
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    task = build_student(cfg.student, tasks, SPARSE_FEATURES, len(DENSE_COLUMNS), code_dim).eval()
    with torch.no_grad():  # zero towers at initialization: every logit its bias, whatever the input
        task.heads.towers.normal_()
        if task.distill_heads is not None:
            task.distill_heads.towers.normal_()
    spec = export.student_spec(cfg.student, tasks, SPARSE_FEATURES, code_dim, cfg.start_ds)
    holdout = export.synthetic_rows(spec, 64, seed=1)
    with tempfile.TemporaryDirectory(prefix="gem-bench-artifact-") as folder:
        exported = export.export_artifact(task, cfg.student, tasks, code_dim, cfg.start_ds, Path(folder),
                                          {"student": f"bench-{cfg.student.variant}-{surface}"},
                                          [(holdout, export.rows_batch(holdout, tasks, cfg.start_ds))])
        artifact = Artifact.load(folder, threads=threads)
    print(f"export: {exported.seconds:.1f}s, ONNX opset {exported.opset}; parity on {exported.parity_rows} rows: "
          f"max |diff| {exported.max_abs_diff:.2g}")

    latency: dict[str, tuple[float, float]] = {}
    for b in (1, 64):
        rows = [export.synthetic_rows(spec, b, seed=100 + k) for k in range(requests)]
        inputs = [model_inputs(r, spec) for r in rows]
        batches = [export.rows_batch(r, tasks, cfg.start_ds) for r in rows]
        with torch.no_grad():
            latency[f"artifact_b{b}"] = percentiles_ms(timed([lambda x=x: artifact.run(x) for x in inputs]))
            latency[f"eager_b{b}"] = percentiles_ms(timed([lambda x=x: task.logits(x) for x in batches]))
        print(f"batch {b:>2}: artifact p50 {latency[f'artifact_b{b}'][0]:.3f} ms, p99 {latency[f'artifact_b{b}'][1]:.3f}"
              f" ms; eager p50 {latency[f'eager_b{b}'][0]:.3f} ms, p99 {latency[f'eager_b{b}'][1]:.3f} ms")

    big = [export.synthetic_rows(spec, THROUGHPUT_BATCH, seed=1000 + k) for k in range(4)]
    big_inputs = [model_inputs(r, spec) for r in big]
    big_batches = [export.rows_batch(r, tasks, cfg.start_ds) for r in big]
    with torch.no_grad():
        artifact_s = statistics.median(timed([lambda x=x: artifact.run(x) for x in big_inputs]))
        eager_s = statistics.median(timed([lambda x=x: task.logits(x) for x in big_batches]))
    scorer_s = statistics.median(timed([lambda r=r: artifact.logits(r) for r in big]))
    throughput = {"artifact": THROUGHPUT_BATCH / artifact_s, "eager": THROUGHPUT_BATCH / eager_s,
                  "scorer": THROUGHPUT_BATCH / scorer_s}
    print(f"throughput at batch {THROUGHPUT_BATCH}: artifact {throughput['artifact']:,.0f} rows/s, eager "
          f"{throughput['eager']:,.0f} rows/s; the scorer end to end {throughput['scorer']:,.0f} rows/s")

    def ms(key: str, which: int) -> float:
        return round(latency[key][which], 3)

    figures = [Figure("export_s", "export of one student (torch.export + ONNX)", round(exported.seconds, 1), "s")]
    for b in (1, 64):
        figures += [
            Figure(f"artifact_b{b}_p50_ms", f"artifact, batch {b}, p50", ms(f"artifact_b{b}", 0), "ms"),
            Figure(f"artifact_b{b}_p99_ms", f"artifact, batch {b}, p99", ms(f"artifact_b{b}", 1), "ms"),
            Figure(f"eager_b{b}_p50_ms", f"eager student, batch {b}, p50", ms(f"eager_b{b}", 0), "ms"),
            Figure(f"eager_b{b}_p99_ms", f"eager student, batch {b}, p99", ms(f"eager_b{b}", 1), "ms"),
        ]
    figures += [
        Figure("artifact_rows_per_s", f"artifact throughput, batch {THROUGHPUT_BATCH}", round(throughput["artifact"]),
               "rows/s"),
        Figure("eager_rows_per_s", f"eager student throughput, batch {THROUGHPUT_BATCH}", round(throughput["eager"]),
               "rows/s"),
        Figure("artifact_over_eager_rows_per_s", "artifact / eager throughput",
               round(throughput["artifact"] / throughput["eager"], 2), "x"),
        Figure("scorer_rows_per_s", "gem score's encoding and graph, end to end", round(throughput["scorer"]),
               "rows/s"),
    ]
    record("student_latency", "A student's serving artifact (ONNX, onnxruntime) beside the eager student, CPU",
           figures, notes=f"The {cfg.student.variant} student of {surface} ({len(tasks)} tasks) at the default config's "
                          f"sizes, random weights; {threads} intra-op threads each; {requests} calls per batch "
                          f"size, each on other synthetic requests (histories and FM code lists at least as long "
                          f"as the model reads).", extra={"load_average_1m": round(os.getloadavg()[0], 1)},
           results_dir=results_dir)


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.student_latency")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())
