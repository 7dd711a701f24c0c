"""bench.gpu_train at its tiny CPU size: the models train a few steps and report finite figures
(on a GPU the same script measures bf16 throughput; CI only checks it runs)."""

from __future__ import annotations

import math

from bench import gpu_train


def test_gpu_train_bench_runs_tiny_on_cpu(capsys):
    results = gpu_train.main(["--tiny"])
    assert set(results) == {"kunlun", "kunlun_padded", "hstu"}
    for r in results.values():
        assert r["examples_per_s"] > 0 and math.isfinite(r["tflops"]) and r["gflop_per_example_fwd"] > 0
    assert "MFU" in capsys.readouterr().out
