"""Kunlun: shapes and gradients; the padded batch equals example-by-example (jagged) runs; padding
and events beyond max_len change nothing; CompSkip reuses HSP; event-level depth."""

from __future__ import annotations

import dataclasses

import torch

from gem.model.kunlun import Kunlun, KunlunConfig

SPARSE = ("user_id", "ad_id", "surface")
DENSE = 5


def _inputs(lengths: dict[str, list[int]], b: int, cfg: KunlunConfig, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sparse = {f: torch.randn(b, cfg.dim, generator=g) for f in SPARSE}
    dense = torch.randn(b, DENSE, generator=g)
    seqs = {}
    for e, ls in lengths.items():
        n = sum(ls)
        seqs[e] = {
            "id_emb": torch.randn(n, cfg.dim, generator=g),
            "surface": torch.randint(0, 7, (n,), generator=g),
            "objective": torch.randint(0, 6, (n,), generator=g),
            "gap_s": torch.rand(n, generator=g) * 1e6,
            "offsets": torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()]),
        }
    return sparse, dense, seqs


def _example(sparse, dense, seqs, i):
    one = {f: v[i : i + 1] for f, v in sparse.items()}
    s1 = {}
    for e, s in seqs.items():
        lo, hi = int(s["offsets"][i]), int(s["offsets"][i + 1])
        s1[e] = {k: v[lo:hi] for k, v in s.items() if k != "offsets"} | {"offsets": torch.tensor([0, hi - lo])}
    return one, dense[i : i + 1], s1


def _model(cfg=None):
    torch.manual_seed(0)
    cfg = cfg or KunlunConfig(layers=3, events={
        "impression": dataclasses.replace(KunlunConfig().events["impression"], depth=3, window=3),
        "click": dataclasses.replace(KunlunConfig().events["click"], depth=2, window=2),
        "conversion": KunlunConfig().events["conversion"],
    })
    return Kunlun(cfg, SPARSE, DENSE).double().eval(), cfg


def _double(x):
    if isinstance(x, dict):
        return {k: _double(v) for k, v in x.items()}
    return x.double() if x.is_floating_point() else x


LENGTHS = {"impression": [5, 0, 9, 1], "click": [2, 3, 0, 4], "conversion": [0, 1, 0, 2]}


def test_padded_batch_equals_example_by_example():
    model, cfg = _model()
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    batch = model(sparse, dense, seqs)
    assert batch.shape == (4, cfg.interaction_tokens * cfg.dim)
    for i in range(4):
        assert torch.allclose(batch[i : i + 1], model(*_example(sparse, dense, seqs, i)), atol=1e-10)


def test_only_the_most_recent_max_len_events_matter():
    model, cfg = _model()
    sparse, dense, seqs = map(_double, _inputs({"impression": [70], "click": [1], "conversion": [1]}, 1, cfg))
    out = model(sparse, dense, seqs)
    changed = {e: dict(s) for e, s in seqs.items()}
    emb = changed["impression"]["id_emb"].clone()
    emb[: 70 - cfg.events["impression"].max_len] += 100.0  # older than the last max_len: dropped
    changed["impression"]["id_emb"] = emb
    assert torch.allclose(out, model(sparse, dense, changed))
    emb[-1] += 1.0  # the most recent event: matters
    assert not torch.allclose(out, model(sparse, dense, changed))


def test_gradients_reach_every_input_and_parameter():
    model, cfg = _model()
    model.train()
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    for s in seqs.values():
        s["id_emb"].requires_grad_(True)
    model(sparse, dense, seqs).square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    assert all(s["id_emb"].grad.abs().sum() > 0 for s in seqs.values())


def test_compskip_and_event_depth():
    model, cfg = _model()
    layers = model.layers
    assert [bool(layer.hsp) for layer in layers] == [True, False, True]  # fresh HSP on GDPA layers only
    assert [sorted(layer.seq) for layer in layers] == [
        ["click", "conversion", "impression"], ["click", "impression"], ["impression"]]
    assert [layer.seq["impression"].personalized for layer in layers] == [True, False, True]
