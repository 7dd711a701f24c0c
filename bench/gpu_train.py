"""Training-step throughput and model TFLOP/s of Kunlun (jagged and padded layouts) and HSTU at the same
width and sequence length.

    python -m bench.gpu_train [--batch 256 --dim 256 --length 512 --steps 20]   # on a GPU: bf16
    python -m bench.gpu_train --tiny                                            # CPU smoke (CI)

Imports only torch, numpy and the project's pure-torch model code (no torchrec, no Spark): plain
nn.Embedding tables stand in for the sharded embeddings, and batches are synthetic with every
sequence at full length (no padding), so FLOPs are exact. Model FLOPs per step = 3 x forward FLOPs
(gem.model.flops / gem.model.hstu; backward ~ 2 x forward), over the median step time, timed with
CUDA events after warm-up. MFU is reported against the H200 dense bf16 spec (989 TFLOP/s) and
against a matmul peak timed in the same run (8192^3 bf16 on GPU). Both models run in the same
process, one after the other, on the same batch shapes. A run on CUDA publishes its figures through
bench.results (gpu_train); a CPU run (--tiny, CI's smoke) and a --no-record run only print them.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch
from torch import nn

from bench.results import Figure, add_results_dir_arg, record
from gem.model.configs import EventConfig, HSTUConfig, KunlunConfig
from gem.model.flops import heads_flops, hstu_body_flops, kunlun_flops
from gem.model.heads import DomainExpertHeads
from gem.model.hstu import HSTU
from gem.model.kunlun import Kunlun

H200_BF16_SPEC_TFLOPS = 989.0
SPARSE = ("user_id", "ad_id", "advertiser_id", "campaign_id", "surface", "objective", "creative_type", "position")
TASKS = tuple(f"{s}/{t}" for s in ("fb_feed", "ig_feed", "reels", "stories", "marketplace", "audience_network")
              for t in ("click", "offsite_purchase", "app_install", "lead"))
DENSE_DIM = 420
VOCAB = {"surface": 7, "objective": 6}


def synthetic_inputs(b: int, dim: int, lengths: dict[str, int], device: torch.device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    sparse_ids = {f: torch.randint(0, 10_000, (b,), generator=g).to(device) for f in SPARSE}
    seq = {}
    for e, n in lengths.items():
        total = b * n
        seq[e] = {"ids": torch.randint(0, 10_000, (total,), generator=g).to(device),
                  "surface": torch.randint(0, 7, (total,), generator=g).to(device),
                  "objective": torch.randint(0, 6, (total,), generator=g).to(device),
                  "gap_s": (torch.rand(total, generator=g) * 1e6).to(device),
                  "offsets": torch.arange(0, total + 1, n).to(device)}
    dense = torch.randn(b, DENSE_DIM, generator=g).to(device)
    labels = (torch.rand(b, len(TASKS), generator=g) < 0.05).float().to(device)
    return sparse_ids, dense, seq, labels


class Bench(nn.Module):
    """Embeddings + body + heads + loss, the shape of GemTrainTask without the Batch plumbing."""

    def __init__(self, body: nn.Module, dim: int) -> None:
        super().__init__()
        self.tables = nn.ModuleDict({f: nn.Embedding(10_000, dim) for f in SPARSE})
        self.body = body
        self.heads = DomainExpertHeads(body.out_dim, TASKS, 64, 2)

    def forward(self, sparse_ids, dense, seq, labels):
        sparse = {f: self.tables[f](v) for f, v in sparse_ids.items()}
        sequences = {e: {"id_emb": self.tables["ad_id"](s["ids"]), **{k: s[k] for k in ("surface", "objective",
                                                                                          "gap_s", "offsets")}}
                     for e, s in seq.items()}
        logits = self.heads(self.body(sparse, dense, sequences))
        return nn.functional.binary_cross_entropy_with_logits(logits, labels)


def heads_flops_per_example(in_dim: int) -> int:
    return heads_flops(in_dim, len(TASKS), 6, 64, 2)


def configs(dim: int, length: int, layers: int) -> tuple[KunlunConfig, HSTUConfig, dict[str, int]]:
    lengths = {"impression": length, "click": max(1, length // 4), "conversion": max(1, length // 16)}
    heads = max(1, dim // 64)
    acts = tuple(("silu", "gelu")[i % 2] for i in range(heads))
    events = {
        "impression": EventConfig(width=dim, activations=acts, seeds=16, summary_tokens=4, depth=layers,
                                  window=min(length, 128), max_len=lengths["impression"]),
        "click": EventConfig(width=dim, activations=acts, seeds=8, summary_tokens=2, depth=layers,
                             window=min(lengths["click"], 64), max_len=lengths["click"]),
        "conversion": EventConfig(width=max(64, dim // 2), activations=acts[: max(1, heads // 2)], seeds=4,
                                  summary_tokens=2, depth=max(1, layers // 2), window=min(lengths["conversion"], 16),
                                  max_len=lengths["conversion"]),
    }
    kunlun = KunlunConfig(dim=dim, layers=layers, summary_tokens=8, dense_tokens=2, experts=2, expert_layers=1,
                          wukong_rank=16, mlp_hidden=4 * dim, events=events)
    hstu = HSTUConfig(dim=dim, heads=heads, layers=layers, mlp_hidden=4 * dim, max_len=lengths)
    return kunlun, hstu, lengths


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        t = _timer(device)
        a @ b
        times.append(t())
    return 2 * n**3 / statistics.median(times) / 1e12


def _timer(device: torch.device):
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop() -> float:
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3

        return stop
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0


def run_model(name: str, model: nn.Module, inputs, flops_per_example: int, steps: int, device: torch.device,
              bf16: bool) -> dict[str, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b = inputs[1].shape[0]
    times = []
    for i in range(steps + 3):  # 3 warm-up steps
        t = _timer(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = t()
        if i >= 3:
            times.append(elapsed)
        if not torch.isfinite(loss):
            raise RuntimeError(f"{name}: loss is {loss.item()}")
    step_s = statistics.median(times)
    tflops = 3 * flops_per_example * b / step_s / 1e12
    return {"step_s": step_s, "examples_per_s": b / step_s, "tflops": tflops}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long CPU smoke run (never published)")
    parser.add_argument("--no-record", action="store_true", help="print the figures only (a smoke run's)")
    add_results_dir_arg(parser)
    args = parser.parse_args(argv)
    if args.tiny:
        args.batch, args.dim, args.length, args.layers, args.steps = 4, 64, 16, 2, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = device.type == "cuda"
    torch.manual_seed(0)
    np.random.seed(0)
    kunlun_cfg, hstu_cfg, lengths = configs(args.dim, args.length, args.layers)
    inputs = synthetic_inputs(args.batch, args.dim, lengths, device)
    # Kunlun in its default jagged layout and in the padded reference layout (the same function).
    padded_cfg = dataclasses.replace(kunlun_cfg, sequence_layout="padded")
    kunlun = Bench(Kunlun(kunlun_cfg, SPARSE, DENSE_DIM), args.dim).to(device)
    padded = Bench(Kunlun(padded_cfg, SPARSE, DENSE_DIM), args.dim).to(device)
    hstu = Bench(HSTU(hstu_cfg, SPARSE, DENSE_DIM, VOCAB), args.dim).to(device)
    flops = {name: kunlun_flops(cfg, len(SPARSE), DENSE_DIM, len(TASKS), 6, 64, 2)["total"]
             for name, cfg in (("kunlun", kunlun_cfg), ("kunlun_padded", padded_cfg))}
    hstu_len = sum(lengths.values()) + 1
    flops["hstu"] = (sum(hstu_body_flops(hstu_cfg, len(SPARSE), DENSE_DIM, hstu_len).values())
                     + heads_flops_per_example(hstu.body.out_dim))
    results = {name: run_model(name, model, inputs, flops[name], args.steps, device, bf16)
               for name, model in (("kunlun", kunlun), ("kunlun_padded", padded), ("hstu", hstu))}
    peak = matmul_peak_tflops(device, torch.bfloat16 if bf16 else torch.float32, 8192 if bf16 else 512)
    print(f"device {device} ({'bf16 autocast' if bf16 else 'fp32'}), batch {args.batch}, dim {args.dim}, "
          f"impression length {args.length}, layers {args.layers}; matmul peak {peak:,.1f} TFLOP/s (this run)")
    print(f"{'model':<14} {'GFLOP/ex fwd':>12} {'step ms':>9} {'ex/s':>10} {'TFLOP/s':>9} {'MFU spec':>9} "
          f"{'MFU meas':>9}")
    for name, r in results.items():
        r.update({"gflop_per_example_fwd": flops[name] / 1e9, "mfu_spec": r["tflops"] / H200_BF16_SPEC_TFLOPS,
                  "mfu_measured_peak": r["tflops"] / peak})
        print(f"{name:<14} {flops[name] / 1e9:>12.3f} {1e3 * r['step_s']:>9.1f} {r['examples_per_s']:>10,.0f} "
              f"{r['tflops']:>9.3f} {r['mfu_spec']:>9.2%} {r['mfu_measured_peak']:>9.2%}")
    if device.type == "cuda" and not (args.tiny or args.no_record):
        publish(results, peak, args)
    return results


def publish(results: dict[str, dict[str, float]], peak: float, args: argparse.Namespace) -> None:
    """Each model's step time, throughput and MFU, and the layouts' and models' ratios, as `gpu_train`."""
    names = {"kunlun": "Kunlun (jagged)", "kunlun_padded": "Kunlun (padded)", "hstu": "HSTU"}
    figures = []
    for name, r in results.items():
        figures += [
            Figure(f"{name}_step_ms", f"{names[name]}: median training step", round(1e3 * r["step_s"], 1), "ms"),
            Figure(f"{name}_examples_per_s", f"{names[name]}: training", round(r["examples_per_s"]), "examples/s"),
            Figure(f"{name}_tflops", f"{names[name]}: model FLOPs", round(r["tflops"], 2), "TFLOP/s"),
            Figure(f"{name}_mfu_spec", f"{names[name]}: MFU against the H200 bf16 spec ({H200_BF16_SPEC_TFLOPS:.0f})",
                   round(100 * r["mfu_spec"], 2), "%"),
            Figure(f"{name}_mfu_peak", f"{names[name]}: MFU against this run's matmul peak",
                   round(100 * r["mfu_measured_peak"], 2), "%"),
        ]
    kunlun = results["kunlun"]["step_s"]
    figures += [
        Figure("matmul_peak_tflops", "matmul peak, timed in the same run (8192^3 bf16)", round(peak), "TFLOP/s"),
        Figure("padded_over_jagged_step", "Kunlun step time, padded / jagged layout",
               round(results["kunlun_padded"]["step_s"] / kunlun, 2), "x"),
        Figure("hstu_over_kunlun_step", "step time, HSTU / Kunlun (jagged)",
               round(results["hstu"]["step_s"] / kunlun, 2), "x"),
    ]
    record("gpu_train", "Training-step throughput on a GPU (bf16): Kunlun jagged and padded, HSTU", figures,
           notes=f"batch {args.batch}, dim {args.dim}, impression length {args.length}, {args.layers} layers, "
                 f"{args.steps} timed steps; synthetic full-length sequences.", results_dir=args.results_dir)


if __name__ == "__main__":
    main()
