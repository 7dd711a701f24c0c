"""The FLOP formulas equal what torch's FLOP counter measures on a forward pass at full lengths, and on a
real ragged batch as it runs (kunlun_batch_flops)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from gem.model.build import build_task
from gem.model.configs import ARCHITECTURES, KunlunConfig
from gem.model.flops import kunlun_batch_flops, kunlun_flops, model_flops
from gem.model.heads import DomainExpertHeads
from gem.model.kunlun import Kunlun
from tests.support import tiny_model_config

SPARSE = ("user_id", "ad_id", "surface", "objective")
TASKS = ("reels/click", "reels/lead", "fb_feed/click")
# Kunlun's ablation switches, each away from its default, and all of them at once.
KUNLUN_VARIANTS = {"default": {}, "softmax": {"attention": "softmax"}, "mean_pooling": {"pooling": "mean"},
                   "no_compskip": {"compskip": False}, "full_attention": {"sliding_window": False},
                   "shared_events": {"event_personalization": False},
                   "all": {"attention": "softmax", "pooling": "mean", "compskip": False, "sliding_window": False,
                           "event_personalization": False}}


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# torch's counter has no formula for the CPU kernel scaled_dot_product_attention takes (it counts the
# GPU kernels): torch's own SDPA formula, registered for it.
SDPA_ON_CPU = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops}


@pytest.mark.parametrize("layout", ["jagged", "padded"])
@pytest.mark.parametrize("switches", KUNLUN_VARIANTS.values(), ids=KUNLUN_VARIANTS.keys())
@pytest.mark.parametrize("impression_window", [32, 8])  # 8: 64 padded positions take the blocked band form
def test_formulas_match_the_flop_counter(impression_window, switches, layout):
    from dataclasses import replace

    base = KunlunConfig(layers=3, sequence_layout=layout)
    impression = replace(base.events["impression"], window=impression_window)
    cfg = replace(base, events={**base.events, "impression": impression}, **switches)
    body = Kunlun(cfg, SPARSE, dense_dim=10)
    heads = DomainExpertHeads(body.out_dim, TASKS, hidden=24, shared_experts=2)
    b = 4  # every type's token stream a whole number of windows: the per-example formula is exact
    sequences = {}
    for e, c in cfg.events.items():
        n = b * c.max_len  # every example at full length: padded == real
        sequences[e] = {"id_emb": torch.randn(n, cfg.dim), "surface": torch.zeros(n, dtype=torch.long),
                        "objective": torch.zeros(n, dtype=torch.long), "gap_s": torch.rand(n),
                        "offsets": torch.arange(0, n + 1, c.max_len)}
    sparse = {f: torch.randn(b, cfg.dim) for f in SPARSE}
    with FlopCounterMode(display=False, custom_mapping=SDPA_ON_CPU) as counter:
        heads(body(sparse, torch.randn(b, 10), sequences))
    formula = kunlun_flops(cfg, n_sparse=len(SPARSE), dense_dim=10, tasks=len(TASKS), surfaces=2, head_hidden=24,
                           shared_experts=2)
    assert counter.get_total_flops() == b * formula["total"]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_formula_matches_the_flop_counter(arch):
    """model_flops of each config equals torch's count of the whole task (body + heads) at full lengths."""
    
    cfg = tiny_model_config(arch)
    tasks = ("reels/click", "reels/lead", "fb_feed/click")
    sparse_names = ("user_id", "ad_id", "surface")
    task = build_task(cfg, tasks, sparse_names, dense_dim=6)
    lengths = cfg.body_config().max_len if arch != "kunlun" else {e: c.max_len for e, c in cfg.kunlun.events.items()}
    b = 2
    sequences = {}
    for e, n_max in lengths.items():
        n = b * n_max
        sequences[e] = {"id_emb": torch.randn(n, cfg.embeddings.dim), "surface": torch.zeros(n, dtype=torch.long),
                        "objective": torch.zeros(n, dtype=torch.long), "gap_s": torch.rand(n),
                        "offsets": torch.arange(0, n + 1, n_max)}
    sparse = {f: torch.randn(b, cfg.embeddings.dim) for f in sparse_names}
    with FlopCounterMode(display=False) as counter:
        task.heads(task.body(sparse, torch.randn(b, 6), sequences))
    formula = model_flops(cfg, n_sparse=len(sparse_names), dense_dim=6, tasks=len(tasks), surfaces=2)
    assert counter.get_total_flops() == b * formula["total"], (counter.get_total_flops() / b, formula)


def _ragged_batch(cfg, tasks: tuple[str, ...], sparse_names: tuple[str, ...], dense_dim: int, b: int, seed: int = 0):
    """A Batch with long-tailed sequence lengths: most short, some past max_len (cut by the model),
    and one event type with no events at all."""
    from gem.data.batch import Batch, Jagged, Sparse

    g = torch.Generator().manual_seed(seed)
    sequences = {}
    for e, c in cfg.kunlun.events.items():
        if e == "conversion":
            lengths = torch.zeros(b, dtype=torch.long)
        else:  # geometric-like tail: median ~ max_len / 4, a few at 2 x max_len
            lengths = (torch.rand(b, generator=g) ** 3 * 2 * c.max_len).long()
        n = int(lengths.sum())
        sequences[e] = Jagged({"ad_id": torch.randint(0, 1 << 30, (n,), generator=g),
                               "surface": torch.randint(0, 7, (n,), generator=g),
                               "objective": torch.randint(0, 6, (n,), generator=g),
                               "gap_s": torch.rand(n, generator=g) * 1e6},
                              torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))
    ones = torch.ones(b, dtype=torch.int32)
    mask = torch.rand(b, len(tasks), generator=g) < 0.5
    return Batch(dense=torch.randn(b, dense_dim, generator=g),
                 sparse={f: Sparse(torch.randint(0, 1 << 30, (b,), generator=g), ones) for f in sparse_names},
                 sequences=sequences, labels=(torch.rand(b, len(tasks), generator=g) < 0.1).float(),
                 label_mask=mask, weights=mask.float(), tasks=tasks, impression_times=torch.zeros(b, dtype=torch.long))


@pytest.mark.parametrize(("layout", "length_groups"), [("jagged", 1), ("padded", 1), ("padded", 3)])
def test_batch_flops_count_what_runs_on_a_ragged_batch(layout, length_groups):
    """kunlun_batch_flops of a real long-tailed batch equals torch's count of the task's forward:
    the kept tokens alone (jagged), or padded to each type's longest kept sequence (of the batch, or
    of each length group), not to max_len; a full-length batch gives B x the per-example formula."""
    cfg = tiny_model_config("kunlun")
    cfg = dataclasses.replace(cfg, kunlun=dataclasses.replace(cfg.kunlun, sequence_layout=layout,
                                                              length_groups=length_groups))
    sparse_names, tasks, dense_dim, b = ("user_id", "ad_id", "surface"), ("reels/click", "fb_feed/click"), 6, 16
    task = build_task(cfg, tasks, sparse_names, dense_dim=dense_dim)
    batch = _ragged_batch(cfg, tasks, sparse_names, dense_dim, b)
    lengths = {e: j.lengths.tolist() for e, j in batch.sequences.items()}
    counted = kunlun_batch_flops(cfg.kunlun, lengths, len(sparse_names), dense_dim, len(tasks), 2,
                                 cfg.heads.hidden, cfg.heads.shared_experts)
    with FlopCounterMode(display=False) as counter:
        task.logits(batch)
    assert counter.get_total_flops() == counted["total"]
    at_max = kunlun_flops(cfg.kunlun, len(sparse_names), dense_dim, len(tasks), 2, cfg.heads.hidden,
                          cfg.heads.shared_experts)
    assert counted["total"] < b * at_max["total"]  # counting every sequence at max_len over-counts this batch
    full = {e: [c.max_len] * b for e, c in cfg.kunlun.events.items()}
    assert kunlun_batch_flops(cfg.kunlun, full, len(sparse_names), dense_dim, len(tasks), 2, cfg.heads.hidden,
                              cfg.heads.shared_experts)["total"] == b * at_max["total"]


def test_batch_flops_per_second_is_plausible_on_this_cpu():
    """A rough sanity figure, not a speed gate: forward + backward FLOPs (3 x forward) of a
    demo-size batch over its wall time, against a large matmul's rate timed alongside. Counting
    FLOPs that never run would push the model's rate past what the matmul reaches."""
    import time

    from gem.config import load_config

    cfg = load_config(overrides={"model": {"embeddings": {"backend": "torch"}}}, environ={}).model
    sparse_names, dense_dim, b = ("user_id", "ad_id", "surface", "position"), 20, 256
    tasks = ("reels/click", "fb_feed/click")
    torch.manual_seed(0)
    task = build_task(cfg, tasks, sparse_names, dense_dim=dense_dim)
    batch = _ragged_batch(cfg, tasks, sparse_names, dense_dim, b, seed=1)
    lengths = {e: j.lengths.tolist() for e, j in batch.sequences.items()}
    flops = 3 * kunlun_batch_flops(cfg.kunlun, lengths, len(sparse_names), dense_dim, len(tasks), 2,
                                   cfg.heads.hidden, cfg.heads.shared_experts)["total"]

    def best_seconds(fn, repeats: int = 3) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    step = best_seconds(lambda: task(batch)[0].backward())
    a = torch.randn(1024, 1024)
    matmul_rate = 2 * 1024 ** 3 / best_seconds(lambda: a @ a)
    model_rate = flops / step
    print(f"model {model_rate / 1e9:.1f} GFLOP/s (3 x {flops / 3 / 1e9:.3f} GFLOP in {step * 1e3:.0f} ms), "
          f"matmul {matmul_rate / 1e9:.1f} GFLOP/s")
    assert 0 < model_rate < 2 * matmul_rate
