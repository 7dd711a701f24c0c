"""bench.gpu_train at its tiny CPU size: the models train a few steps and report finite figures
(on a GPU the same script measures bf16 throughput; CI only checks it runs). On a GPU, both GPU
benches at a small size."""

from __future__ import annotations

import math

from bench import gpu_train
from tests.support import needs_cuda


def test_gpu_train_bench_runs_tiny_on_cpu(capsys):
    results = gpu_train.main(["--tiny"])
    assert set(results) == {"kunlun", "kunlun_padded", "hstu"}
    for r in results.values():
        assert r["examples_per_s"] > 0 and math.isfinite(r["tflops"]) and r["gflop_per_example_fwd"] > 0
    assert "MFU" in capsys.readouterr().out


@needs_cuda
def test_gpu_benches_run_small_on_the_gpu():
    from bench import precompute

    results = gpu_train.main(["--batch", "16", "--dim", "64", "--length", "64", "--layers", "2", "--steps", "3",
                              "--no-record"])
    assert all(r["tflops"] > 0 and math.isfinite(r["step_s"]) for r in results.values())
    roofline = precompute.gpu_bench(batch=256, steps=3)
    assert roofline is not None and 0 < roofline["roofline_share"] <= 1.5
