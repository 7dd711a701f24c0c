"""The FLOP formulas equal what torch's FLOP counter measures on a forward pass at full lengths."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from gem.model.build import build_task
from gem.model.configs import ARCHITECTURES, KunlunConfig
from gem.model.flops import kunlun_flops, model_flops
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


@pytest.mark.parametrize("switches", KUNLUN_VARIANTS.values(), ids=KUNLUN_VARIANTS.keys())
@pytest.mark.parametrize("impression_window", [32, 8])  # 8: 64 positions take the blocked band form
def test_formulas_match_the_flop_counter(impression_window, switches):
    from dataclasses import replace

    base = KunlunConfig(layers=3)
    impression = replace(base.events["impression"], window=impression_window)
    cfg = replace(base, events={**base.events, "impression": impression}, **switches)
    body = Kunlun(cfg, SPARSE, dense_dim=10)
    heads = DomainExpertHeads(body.out_dim, TASKS, hidden=24, shared_experts=2)
    b = 3
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
