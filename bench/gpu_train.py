"""Training-step throughput and model TFLOP/s of Kunlun (jagged and padded layouts) and HSTU at the same
width and sequence length, each trained by the pipeline's own training loop.

    python -m bench.gpu_train [--batch 256 --dim 256 --length 512 --steps 20]   # on a GPU: bf16
    python -m bench.gpu_train --tiny                                            # CPU smoke (CI)

Each model is the train task pretraining builds (gem.model.build.build_task: embeddings, body,
DomainExpertHeads, the masked weighted loss and the LoopFM history autoencoder beside it) with the
"torch" sparse backend, so plain nn.Embedding tables hold the ids and the script imports no torchrec,
Delta or Spark (it runs on the GPU image). gem.train.trainer.Trainer trains it, so a step is what a
pretraining step is: bf16 autocast on CUDA, the loss and gradient finiteness checks, the learning-rate
schedule and the fused AdamW. Batches are synthetic gem.data.batch.Batch objects laid out as the
loader cuts them, with every sequence at full length (no padding), so FLOPs are exact. Model FLOPs
per step = 3 x forward FLOPs (gem.model.flops for the task's own config, heads included; backward
~ 2 x forward; the history autoencoder's small share is not counted), over the median step time:
each step is one Trainer.fit call, whose wall time ends with a CUDA synchronize, after 3 warm-up
steps. MFU is reported against the H200 dense bf16 spec (989 TFLOP/s) and against a matmul peak
timed in the same run (8192^3 bf16 on GPU). The models run in the same process, one after the
other, on the same batch. A run on CUDA publishes its figures through bench.results (gpu_train); a
CPU run (--tiny, CI's smoke) and a --no-record run only print them.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import run_function
from gem.config import TrainConfig
from gem.data.batch import Batch, Jagged, Sparse
from gem.data.encode import DENSE_COLUMNS, VOCABULARIES
from gem.data.loader import MAX_POSITION, SPARSE_FEATURES
from gem.data.snapshots import MODEL_FIELDS
from gem.model.build import build_task
from gem.model.configs import EmbeddingConfig, EventConfig, HeadConfig, HSTUConfig, KunlunConfig, ModelConfig
from gem.model.flops import body_out_dim, heads_flops, hstu_body_flops, kunlun_flops
from gem.train.trainer import CyclingStream, Trainer
from schemas.ids import HASHED_IDS

H200_BF16_SPEC_TFLOPS = 989.0
SPARSE = SPARSE_FEATURES
TASKS = tuple(f"{s}/{t}" for s in ("fb_feed", "ig_feed", "reels", "stories", "marketplace", "audience_network")
              for t in ("click", "offsite_purchase", "app_install", "lead"))
SURFACES = len(dict.fromkeys(t.split("/")[0] for t in TASKS))  # DomainExpertHeads: one expert per surface
DENSE_DIM = len(DENSE_COLUMNS)  # the loader's dense inputs: every counter of the user and of the ad
HEADS = HeadConfig()
WARMUP_STEPS = 3


def _ids(name: str, n: int, g: torch.Generator) -> torch.Tensor:
    """(n,) int64 ids as the loader encodes `name`: 63-bit hashes, vocabulary index + 1 (0 unknown),
    or position + 1."""
    if name in HASHED_IDS:
        return torch.randint(0, 2**62, (n,), generator=g)
    high = len(VOCABULARIES[name]) + 1 if name in VOCABULARIES else MAX_POSITION + 2
    return torch.randint(0, high, (n,), generator=g)


def synthetic_batch(b: int, lengths: dict[str, int], seed: int = 0) -> Batch:
    """B examples with every sequence at its full length and every task drawn (weight 1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    sequences = {}
    for event, n in lengths.items():
        values = {f: _ids(f, b * n, g) for f in MODEL_FIELDS[event]}
        values["gap_s"] = torch.rand(b * n, generator=g) * 1e6
        sequences[event] = Jagged(values, torch.arange(0, b * n + 1, n, dtype=torch.int64))
    return Batch(
        dense=torch.randn(b, DENSE_DIM, generator=g),
        sparse={f: Sparse(_ids(f, b, g), torch.ones(b, dtype=torch.int32)) for f in SPARSE},
        sequences=sequences,
        labels=(torch.rand(b, len(TASKS), generator=g) < 0.05).float(),
        label_mask=torch.ones(b, len(TASKS), dtype=torch.bool),
        weights=torch.ones(b, len(TASKS)),
        tasks=TASKS,
        impression_times=torch.full((b,), 1_767_225_600_000_000, dtype=torch.int64) + torch.arange(b),
    )



def synthetic_inputs(b: int, dim: int, lengths: dict[str, int], device: torch.device, seed: int = 0):
    """synthetic_batch's tensors as a body-level forward reads them (bench.precompute): ({feature: (B,)
    ids}, dense (B, DENSE_DIM), {event: {"ids", "surface", "objective", "gap_s", "offsets"}}, labels).
    dim: unused (the ids are the same at any width)."""
    batch = synthetic_batch(b, lengths, seed).to(device)
    seq = {e: {"ids": j.values["ad_id"], **{k: j.values[k] for k in ("surface", "objective", "gap_s")},
               "offsets": j.offsets} for e, j in batch.sequences.items()}
    return {f: s.values for f, s in batch.sparse.items()}, batch.dense, seq, batch.labels

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


def model_configs(kunlun: KunlunConfig, hstu: HSTUConfig) -> dict[str, ModelConfig]:
    """The three models: Kunlun in its default jagged layout and in the padded reference layout (the
    same function), and HSTU; pretraining's embeddings and heads."""
    def model(arch: str, kunlun_cfg: KunlunConfig) -> ModelConfig:
        return ModelConfig(arch=arch, kunlun=kunlun_cfg, hstu=hstu, heads=HEADS,
                           embeddings=EmbeddingConfig(dim=kunlun.dim))

    padded = dataclasses.replace(kunlun, sequence_layout="padded")
    return {"kunlun": model("kunlun", kunlun), "kunlun_padded": model("kunlun", padded),
            "hstu": model("hstu", kunlun)}


def forward_flops(cfg: ModelConfig) -> int:
    """Forward FLOPs per example of the task build_task makes of `cfg` (sequences at max_len), with
    the heads as its DomainExpertHeads are built (cfg.heads, one expert per surface of TASKS)."""
    if cfg.arch == "kunlun":
        return kunlun_flops(cfg.kunlun, len(SPARSE), DENSE_DIM, len(TASKS), SURFACES, cfg.heads.hidden,
                            cfg.heads.shared_experts)["total"]
    heads = heads_flops(body_out_dim(cfg, len(SPARSE)), len(TASKS), SURFACES, cfg.heads.hidden,
                        cfg.heads.shared_experts)
    return sum(hstu_body_flops(cfg.hstu, len(SPARSE), DENSE_DIM).values()) + heads


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


def run_model(cfg: ModelConfig, batch: Batch, flops_per_example: int, steps: int, device: torch.device,
              bf16: bool) -> dict[str, float]:
    """Train build_task's task for `cfg` through Trainer, one fit call per step; the median step after
    the warm-up. Trainer stops on a non-finite loss or gradient (NonFiniteLossError)."""
    task = build_task(cfg, TASKS, SPARSE, DENSE_DIM, sparse_backend="torch")
    train = TrainConfig(steps=steps + WARMUP_STEPS, lr=1e-4, bf16=bf16, cpu_bf16=False,
                        checkpoint_every=steps + WARMUP_STEPS)
    trainer = Trainer(task, CyclingStream([batch]), train, run_dir=None, device=device)
    try:
        times = [trainer.fit(trainer.step + 1).seconds for _ in range(train.steps)][WARMUP_STEPS:]
    finally:
        trainer.close()
    step_s = statistics.median(times)
    b = batch.size
    return {"step_s": step_s, "examples_per_s": b / step_s, "tflops": 3 * flops_per_example * b / step_s / 1e12}


@dataclasses.dataclass(frozen=True)
class Size:
    """What a run trains: the batch, the models' width, impression length and layers, the timed steps."""

    batch: int
    dim: int
    length: int
    layers: int
    steps: int


TINY = Size(batch=4, dim=64, length=16, layers=2, steps=2)  # --tiny: a seconds-long CPU smoke run


def command_line(
    batch: Annotated[int, typer.Option()] = 256,
    dim: Annotated[int, typer.Option()] = 256,
    length: Annotated[int, typer.Option()] = 512,
    layers: Annotated[int, typer.Option()] = 4,
    steps: Annotated[int, typer.Option()] = 20,
    tiny: Annotated[bool, typer.Option("--tiny", help="a seconds-long CPU smoke run (never published)")] = False,
    no_record: Annotated[bool, typer.Option("--no-record", help="print the figures only (a smoke run's)")] = False,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> dict[str, dict[str, float]]:
    size = TINY if tiny else Size(batch, dim, length, layers, steps)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = device.type == "cuda"
    torch.manual_seed(0)
    np.random.seed(0)
    kunlun_cfg, hstu_cfg, lengths = configs(size.dim, size.length, size.layers)
    examples = synthetic_batch(size.batch, lengths).to(device)
    models = model_configs(kunlun_cfg, hstu_cfg)
    flops = {name: forward_flops(cfg) for name, cfg in models.items()}
    results = {}
    for name, cfg in models.items():  # one task on the device at a time
        results[name] = run_model(cfg, examples, flops[name], size.steps, device, bf16)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    peak = matmul_peak_tflops(device, torch.bfloat16 if bf16 else torch.float32, 8192 if bf16 else 512)
    print(f"device {device} ({'bf16 autocast' if bf16 else 'fp32'}), batch {size.batch}, dim {size.dim}, "
          f"impression length {size.length}, layers {size.layers}; matmul peak {peak:,.1f} TFLOP/s (this run)")
    print(f"{'model':<14} {'GFLOP/ex fwd':>12} {'step ms':>9} {'ex/s':>10} {'TFLOP/s':>9} {'MFU spec':>9} "
          f"{'MFU meas':>9}")
    for name, r in results.items():
        r.update({"gflop_per_example_fwd": flops[name] / 1e9, "mfu_spec": r["tflops"] / H200_BF16_SPEC_TFLOPS,
                  "mfu_measured_peak": r["tflops"] / peak})
        print(f"{name:<14} {flops[name] / 1e9:>12.3f} {1e3 * r['step_s']:>9.1f} {r['examples_per_s']:>10,.0f} "
              f"{r['tflops']:>9.3f} {r['mfu_spec']:>9.2%} {r['mfu_measured_peak']:>9.2%}")
    if device.type == "cuda" and not (tiny or no_record):
        publish(results, peak, size, results_dir)
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]] | None:
    """The figures of each model (None after --help)."""
    return run_function(command_line, argv, prog="python -m bench.gpu_train", help=__doc__.splitlines()[0])


def publish(results: dict[str, dict[str, float]], peak: float, size: Size, results_dir: Path) -> None:
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
           notes=f"batch {size.batch}, dim {size.dim}, impression length {size.length}, {size.layers} layers, "
                 f"{size.steps} timed steps of gem.train.trainer.Trainer; synthetic full-length sequences.",
           results_dir=results_dir)


if __name__ == "__main__":
    main()
