"""Sliding-window self-GDPA: the dense form (L x L scores, masked to the window) against the blocked
band form (gem.model.ops.gdpa.windowed_gdpa), forward + backward, side by side in one run.

    python -m bench.windowed_attention [--batch 512] [--repeats 10]

Prints milliseconds per step and the ratio dense / band for each (length, window), and publishes
them through bench.results (windowed_attention); the models take the band form from
gem.model.ops.gdpa.BAND_MIN_WINDOWS windows on.
"""

from __future__ import annotations

import functools
import time
from typing import Annotated

import torch
import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.model.ops.gdpa import gdpa, windowed_gdpa
from gem.model.ops.masks import sliding_window_mask

SHAPES = ((64, 32), (32, 16), (128, 32), (512, 32), (2048, 64))  # (length, window)


def step_seconds(fn, repeats: int) -> float:
    for _ in range(2):  # warm-up
        fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def dense_step(q, k, v, activations, mask, window: int) -> None:
    """Forward + backward of GDPA over full L x L scores under the sliding-window mask."""
    gdpa(q, k, v, activations, 0.25, 1 / window, mask).sum().backward()


def band_step(q, k, v, activations, lengths, window: int) -> None:
    """Forward + backward of the band kernel: only the window's scores."""
    windowed_gdpa(q, k, v, activations, 0.25, 1 / window, lengths, window).sum().backward()


def command_line(
    batch: Annotated[int, typer.Option()] = 512,
    heads: Annotated[int, typer.Option()] = 2,
    head_dim: Annotated[int, typer.Option()] = 16,
    repeats: Annotated[int, typer.Option()] = 10,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> int:
    torch.manual_seed(0)
    activations = ("silu", "gelu", "silu", "relu")[:heads]
    figures = []
    for length, window in SHAPES:
        rows = max(1, batch * 64 // length)  # about the same number of positions per step
        q, k, v = (torch.randn(rows, heads, length, head_dim, requires_grad=True) for _ in range(3))
        lengths = torch.randint(1, length + 1, (rows,))

        mask = sliding_window_mask(lengths, length, window)
        dense = functools.partial(dense_step, q, k, v, activations, mask, window)
        band = functools.partial(band_step, q, k, v, activations, lengths, window)
        d, b = step_seconds(dense, repeats), step_seconds(band, repeats)
        print(f"L={length:>5} window={window:>3} batch={rows:>4}: dense {d * 1e3:8.1f} ms  band {b * 1e3:8.1f} ms  "
              f"dense/band {d / b:5.2f}", flush=True)
        shape = f"L={length}, window {window}, batch {rows}"
        figures += [Figure(f"L{length}_w{window}_dense_ms", f"{shape}: dense", round(d * 1e3, 2), "ms"),
                    Figure(f"L{length}_w{window}_band_ms", f"{shape}: band", round(b * 1e3, 2), "ms"),
                    Figure(f"L{length}_w{window}_dense_over_band", f"{shape}: dense / band", round(d / b, 2), "x")]
    record("windowed_attention", "Sliding-window self-GDPA, forward + backward: dense scores against the band kernel",
           figures, notes=f"{heads} heads of {head_dim}, {repeats} timed steps after 2 warm-up; "
                          f"{torch.get_num_threads()} threads, fp32.", results_dir=results_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.windowed_attention")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())
