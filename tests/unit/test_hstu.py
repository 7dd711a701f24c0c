"""HSTU baseline: the padded batch equals example-by-example runs; gradients flow; FLOPs formula
matches torch's counter for the STU stack."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from gem.model.configs import HSTUConfig
from gem.model.flops import hstu_body_flops
from gem.model.hstu import HSTU, HSTULayer

SPARSE = ("user_id", "ad_id", "surface")
VOCAB = {"surface": 7, "objective": 6}


def _inputs(cfg, lengths, b, seed=0):
    g = torch.Generator().manual_seed(seed)
    sparse = {f: torch.randn(b, cfg.dim, generator=g, dtype=torch.float64) for f in SPARSE}
    seqs = {}
    for e, ls in lengths.items():
        n = sum(ls)
        seqs[e] = {"id_emb": torch.randn(n, cfg.dim, generator=g, dtype=torch.float64),
                   "surface": torch.randint(0, 7, (n,), generator=g), "objective": torch.randint(0, 6, (n,), generator=g),
                   "gap_s": torch.rand(n, generator=g) * 1e5, "offsets": torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()])}
    return sparse, torch.randn(b, 4, generator=g, dtype=torch.float64), seqs


def test_padded_batch_equals_example_by_example():
    torch.manual_seed(0)
    cfg = HSTUConfig()
    model = HSTU(cfg, SPARSE, 4, VOCAB).double().eval()
    lengths = {"impression": [3, 0, 70, 1], "click": [0, 2, 5, 0], "conversion": [1, 0, 0, 9]}
    sparse, dense, seqs = _inputs(cfg, lengths, 4)
    out = model(sparse, dense, seqs)
    assert out.shape == (4, model.out_dim)
    for i in range(4):
        one = {e: {k: v[int(s["offsets"][i]):int(s["offsets"][i + 1])] for k, v in s.items() if k != "offsets"}
               | {"offsets": torch.tensor([0, int(s["offsets"][i + 1] - s["offsets"][i])])} for e, s in seqs.items()}
        single = model({f: v[i:i + 1] for f, v in sparse.items()}, dense[i:i + 1], one)
        assert torch.allclose(out[i:i + 1], single, atol=1e-10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_stu_flops_formula_matches_counter():
    layer = HSTULayer(dim=32, heads=2, max_len=50, rab_buckets=8)
    x = torch.randn(3, 50, 32)
    with FlopCounterMode(display=False) as counter:
        layer(x, torch.full((3,), 50))
    assert counter.get_total_flops() == 3 * hstu_body_flops(HSTUConfig(dim=32, heads=2, layers=1), 0, 0, 50)["layer0.stu"]
