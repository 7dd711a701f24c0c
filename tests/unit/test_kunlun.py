"""Kunlun: shapes and gradients; the padded batch equals example-by-example (jagged) runs; padding
and events beyond max_len change nothing; CompSkip reuses HSP; event-level depth. Each ablation switch
(KunlunConfig.attention, pooling, compskip, sliding_window, event_personalization) builds, trains a
step, keeps padding out and differs from the default where it should; user_representation."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from gem.config import ConfigError, load_config
from gem.model.flops import kunlun_flops
from gem.model.kunlun import HSP, Kunlun, KunlunConfig, MeanPool, Padded, Stream
from gem.model.ops.jagged import JaggedLayout, jagged_mean, to_jagged
from tests.support import ON_DEVICES, needs_cuda

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


def _config(**switches) -> KunlunConfig:
    return KunlunConfig(layers=3, events={
        "impression": dataclasses.replace(KunlunConfig().events["impression"], depth=3, window=3),
        "click": dataclasses.replace(KunlunConfig().events["click"], depth=2, window=2),
        "conversion": KunlunConfig().events["conversion"],
    }, **switches)


def _model(cfg=None):
    torch.manual_seed(0)
    cfg = cfg or _config()
    return Kunlun(cfg, SPARSE, DENSE).double().eval(), cfg


# Each ablation switch away from its default (and all at once); "default" is the full model.
VARIANTS = {"default": {}, "softmax": {"attention": "softmax"}, "mean_pooling": {"pooling": "mean"},
            "no_compskip": {"compskip": False}, "full_attention": {"sliding_window": False},
            "shared_events": {"event_personalization": False},
            "all": {"attention": "softmax", "pooling": "mean", "compskip": False, "sliding_window": False,
                    "event_personalization": False}}
variants = pytest.mark.parametrize("switches", VARIANTS.values(), ids=VARIANTS.keys())


def _double(x):
    if isinstance(x, dict):
        return {k: _double(v) for k, v in x.items()}
    return x.double() if x.is_floating_point() else x


LENGTHS = {"impression": [5, 0, 9, 1], "click": [2, 3, 0, 4], "conversion": [0, 1, 0, 2]}


@variants
def test_padded_batch_equals_example_by_example(switches):
    model, cfg = _model(_config(**switches))
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


@variants
def test_gradients_reach_every_input_and_parameter_and_a_step_trains(switches):
    model, cfg = _model(_config(**switches))
    model.train()
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    for s in seqs.values():
        s["id_emb"].requires_grad_(True)
    target = torch.randn(4, model.out_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = (model(sparse, dense, seqs) - target).square().mean()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    assert all(s["id_emb"].grad.abs().sum() > 0 for s in seqs.values())
    torch.optim.SGD(model.parameters(), lr=1e-3).step()  # one small step down the gradient lowers the loss
    with torch.no_grad():
        assert (model(sparse, dense, seqs) - target).square().mean() < loss


def test_compskip_and_event_depth():
    model, _ = _model()
    layers = model.layers
    assert [bool(layer.hsp) for layer in layers] == [True, False, True]  # fresh HSP on GDPA layers only
    assert [sorted(layer.seq) for layer in layers] == [
        ["click", "conversion", "impression"], ["click", "impression"], ["impression"]]
    assert [layer.seq["impression"].personalized for layer in layers] == [True, False, True]


def _noise_in_padding(model: Kunlun, seed: int = 7) -> list[int]:
    """Pre-hooks that fill every padded position of S read by a pooler or a sequence layer with large
    noise; returns the list that counts the positions filled (hooks stay registered)."""
    g, filled = torch.Generator().manual_seed(seed), []

    def hook(module, args):
        (s, lengths), *rest = args
        pad = ~(torch.arange(s.shape[1])[None, :] < lengths[:, None])  # (B, L)
        filled.append(int(pad.sum()))
        noise = torch.randn(s.shape, generator=g, dtype=s.dtype) * 100.0
        return (Padded(torch.where(pad[:, :, None], noise, s), lengths), *rest)

    for layer in model.layers:
        for module in [*layer.hsp.values(), *layer.seq.values()]:
            module.register_forward_pre_hook(hook)
    for module in model.final_hsp.values():
        module.register_forward_pre_hook(hook)
    return filled


@variants
def test_padding_content_changes_nothing(switches):
    """In the padded layout every read of a padded sequence (pooling, personalized and
    self-attention, the readout) is masked: garbage in the padding leaves every output as it was."""
    model, cfg = _model(_config(**switches, sequence_layout="padded"))
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    clean = model(sparse, dense, seqs)
    filled = _noise_in_padding(model)
    noisy = model(sparse, dense, seqs)
    assert sum(filled) > 0  # the hooks did put garbage in
    torch.testing.assert_close(noisy, clean, rtol=0, atol=1e-10)


def test_switches_are_validated_and_load_from_config():
    with pytest.raises(ValueError, match="attention"):
        KunlunConfig(attention="flash")
    with pytest.raises(ValueError, match="pooling"):
        KunlunConfig(pooling="max")
    with pytest.raises(ValueError, match="shared_event"):
        KunlunConfig(event_personalization=False, shared_event="view")
    cfg = load_config(environ={"GEM__MODEL__KUNLUN__COMPSKIP": "false", "GEM__MODEL__KUNLUN__ATTENTION": "softmax"})
    assert cfg.model.kunlun.compskip is False and cfg.model.kunlun.attention == "softmax"
    assert cfg.model.kunlun.sliding_window and cfg.model.kunlun.event_personalization  # defaults: the full model
    with pytest.raises(ConfigError, match="bool"):
        load_config(environ={"GEM__MODEL__KUNLUN__SLIDING_WINDOW": "3"})


def _same_weights(switches: dict, other: dict) -> tuple[Kunlun, Kunlun, KunlunConfig]:
    a, cfg = _model(_config(**switches))
    b, _ = _model(_config(**other))
    b.load_state_dict(a.state_dict())  # strict: the two variants have the same parameters
    return a, b, cfg


def test_softmax_attention_differs_from_gdpa_with_the_same_weights():
    gdpa_model, softmax_model, cfg = _same_weights({}, {"attention": "softmax"})
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    assert not torch.allclose(gdpa_model(sparse, dense, seqs), softmax_model(sparse, dense, seqs))
    assert all(m.attention == "softmax" for layer in softmax_model.layers for m in layer.seq.values())
    assert all(m.attention == "softmax" for m in softmax_model.final_hsp.values())


def test_softmax_hsp_weights_sum_to_one_over_the_real_positions():
    """HSP's seed attention under softmax: with V = 1 (kv's value half zeroed, bias 1) each seed's
    pooled vector is the sum of its weights, 1 for a non-empty sequence and 0 for an empty one."""
    cfg = _config(attention="softmax")
    hsp = HSP(cfg.events["click"], cfg.dim, "softmax").double()
    w = cfg.events["click"].width
    with torch.no_grad():
        hsp.kv.weight[w:] = 0.0
        hsp.kv.bias[w:] = 1.0
    captured = {}
    hsp.compress.register_forward_pre_hook(lambda m, args: captured.update(pooled=args[0]))
    s, lengths = torch.randn(3, 5, w, dtype=torch.float64), torch.tensor([5, 2, 0])
    offsets = torch.tensor([0, 5, 7, 7])
    for seq in (Padded(s, lengths), Stream(to_jagged(s, lengths), JaggedLayout.of(offsets))):
        hsp(seq)
        expected = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)[:, None, None].expand_as(captured["pooled"])
        torch.testing.assert_close(captured["pooled"], expected)


def test_mean_pooling_is_a_masked_mean_with_as_many_tokens():
    model, cfg = _model(_config(pooling="mean", length_groups=1))  # one forward call per pooler to hook
    default, _ = _model()
    assert model.out_dim == default.out_dim  # the interaction arch sees as many tokens
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    seen = {}
    for e, pool in model.layers[0].hsp.items():
        assert isinstance(pool, MeanPool)
        pool.register_forward_hook(lambda m, args, out, e=e: seen.update({e: (args, out)}))
    model(sparse, dense, seqs)
    assert sorted(seen) == sorted(cfg.events)
    for e, ((stream,), out) in seen.items():
        mean = jagged_mean(stream.values, stream.offsets)  # (B, w): the mean of the real tokens
        assert out.shape == (4, cfg.events[e].summary_tokens, cfg.dim)
        torch.testing.assert_close(out, model.layers[0].hsp[e].proj(mean).view(4, -1, cfg.dim))


def _pool_calls(model: Kunlun) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = {}
    for i, layer in enumerate(model.layers):
        for e, pool in layer.hsp.items():
            pool.register_forward_hook(lambda m, args, out, e=e, i=i: calls.setdefault(e, []).append(i))
    return calls


def test_compskip_off_pools_on_every_layer_and_costs_what_the_docstring_says():
    on, cfg_on = _model(_config(length_groups=1))  # one forward call per pooler to count
    off, cfg_off = _model(_config(compskip=False, length_groups=1))
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg_on))
    calls_on, calls_off = _pool_calls(on), _pool_calls(off)
    on(sparse, dense, seqs), off(sparse, dense, seqs)
    assert calls_on == {"impression": [0, 2], "click": [0], "conversion": [0]}  # odd layers reuse the cache
    assert calls_off == {"impression": [0, 1, 2], "click": [0, 1], "conversion": [0]}  # each layer within depth
    # FLOPs: off costs exactly the odd layers' pooling (the counter test holds both counts to torch's).
    args = {"n_sparse": 8, "dense_dim": 42, "tasks": 24, "surfaces": 6, "head_hidden": 64, "shared_experts": 2}
    f_on, f_off = kunlun_flops(cfg_on, **args), kunlun_flops(cfg_off, **args)
    assert f_off["total"] - f_on["total"] == f_off["layer1.pooling"] > 0
    quoted = re.search(r"off costs ([\d,]+) more forward FLOPs", KunlunConfig.__doc__).group(1)
    default_on, default_off = kunlun_flops(KunlunConfig(), **args), kunlun_flops(KunlunConfig(compskip=False), **args)
    assert default_off["total"] - default_on["total"] == int(quoted.replace(",", ""))


@pytest.mark.parametrize("attention", ["gdpa", "softmax"])
def test_full_attention_equals_the_window_when_the_window_covers_the_sequence(attention):
    """sliding_window off == a window of max_len (>= every length) with the same weights; a short
    window differs once a sequence is longer than it."""
    full, windowed, cfg = _same_weights({"sliding_window": False, "attention": attention},
                                        {"attention": attention})
    covering = _config(attention=attention)
    covering = dataclasses.replace(covering, events={
        e: dataclasses.replace(c, window=c.max_len) for e, c in covering.events.items()})
    wide, _ = _model(covering)
    wide.load_state_dict(full.state_dict())
    assert all(layer.seq[e].window is None for layer in full.layers[1::2] for e in layer.seq)
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))  # impression lengths up to 9 > window 3
    out = full(sparse, dense, seqs)
    torch.testing.assert_close(out, wide(sparse, dense, seqs), rtol=0, atol=1e-12)
    assert not torch.allclose(out, windowed(sparse, dense, seqs))


def test_shared_event_settings_give_every_type_the_impression_settings():
    model, cfg = _model(_config(event_personalization=False))
    shared = cfg.events["impression"]
    for e, c in cfg.effective_events.items():
        assert c == dataclasses.replace(shared, max_len=cfg.events[e].max_len)  # only the data length stays
    assert model.event_embed["conversion"]["time"].embedding_dim == shared.width != cfg.events["conversion"].width
    assert [sorted(layer.seq) for layer in model.layers] == [["click", "conversion", "impression"]] * 3  # depth 3
    assert model.layers[1].seq["conversion"].window == shared.window
    assert model.final_hsp["conversion"].heads == len(shared.activations)
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    assert model(sparse, dense, seqs).shape == (4, cfg.interaction_tokens * cfg.dim)


@pytest.mark.parametrize("switches", [{}, {"pooling": "mean", "attention": "softmax"}], ids=["default", "mean_softmax"])
def test_user_representation_is_the_first_layer_pooling_and_the_user_tokens(switches):
    model, cfg = _model(_config(**switches, length_groups=1))  # the forward's tensors in one call to hook
    sparse, dense, seqs = map(_double, _inputs(LENGTHS, 4, cfg))
    pooled, x_in = {}, {}
    for e, pool in model.layers[0].hsp.items():
        pool.register_forward_hook(lambda m, args, out, e=e: pooled.update({e: out}))
    model.layers[0].register_forward_pre_hook(lambda m, args: x_in.update(x=args[0]))
    model(sparse, dense, seqs)
    user = model.user_representation(sparse, seqs)
    n_seq = sum(c.summary_tokens for c in cfg.events.values())
    assert user.shape == (4, n_seq + 1, cfg.dim)
    expected = torch.cat([*(pooled[e] for e in sorted(pooled)),
                          x_in["x"][:, SPARSE.index("user_id")][:, None]], dim=1)  # the forward's own tensors
    torch.testing.assert_close(user, expected, rtol=0, atol=0)
    # The ad's features (its ids, the dense counters) change the prediction, not the user side.
    ad = {**sparse, "ad_id": sparse["ad_id"] + 1.0, "surface": -sparse["surface"]}
    assert not torch.allclose(model(ad, dense + 1.0, seqs), model(sparse, dense, seqs))
    torch.testing.assert_close(model.user_representation(ad, seqs), user, rtol=0, atol=0)


PARITY_LENGTHS = {"impression": [5, 0, 9, 1, 70, 2, 3, 0], "click": [2, 3, 0, 4, 1, 0, 8, 2], "conversion": [0] * 8}


def _to(x, device):
    return {k: _to(v, device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)


@ON_DEVICES
@variants
def test_jagged_layout_gives_the_padded_outputs_and_gradients(switches, device):
    """The jagged layout (the default: streams of real tokens, gem.model.ops.jagged_attention)
    computes the function the padded reference does: outputs, input and parameter gradients. The
    lengths include empty sequences, one over max_len, and an event type with no token at all. On a
    GPU the jagged outputs also equal the CPU's."""
    results = []
    for layout in ("padded", "jagged"):
        model, cfg = _model(_config(**switches, sequence_layout=layout))
        model.train().to(device)
        sparse, dense, seqs = (_to(_double(x), device) for x in _inputs(PARITY_LENGTHS, 8, cfg))
        seqs["click"]["id_emb"].requires_grad_(True)
        out = model(sparse, dense, seqs)
        out.square().sum().backward()
        results.append((out.detach(), seqs["click"]["id_emb"].grad, {n: p.grad for n, p in model.named_parameters()}))
    (out_p, emb_p, grads_p), (out_j, emb_j, grads_j) = results
    if device != "cpu":
        on_cpu, cfg = _model(_config(**switches))
        sparse, dense, seqs = map(_double, _inputs(PARITY_LENGTHS, 8, cfg))
        torch.testing.assert_close(out_j.cpu(), on_cpu.train()(sparse, dense, seqs).detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(out_j, out_p, rtol=0, atol=1e-10)
    torch.testing.assert_close(emb_j, emb_p, rtol=0, atol=1e-9)
    assert grads_p.keys() == grads_j.keys()
    for name in grads_p:
        # A type with no token: the padded layout computes on one masked position (zero gradients),
        # the jagged one computes nothing (no gradient).
        jagged, padded = (g if g is not None else torch.zeros_like(p) for g, p in
                          ((grads_j[name], dict(model.named_parameters())[name]),
                           (grads_p[name], dict(model.named_parameters())[name])))
        torch.testing.assert_close(jagged, padded, rtol=0, atol=1e-9, msg=name)


@pytest.mark.parametrize("switches", [VARIANTS["default"], VARIANTS["all"]], ids=["default", "all"])
@needs_cuda
def test_jagged_layout_under_cuda_bf16_autocast_matches_float32(switches):
    """The training and precompute path on a GPU: bf16 autocast in both layouts gives the float32
    logits to bf16's precision, and gradients reach the sequence embeddings."""
    outs = {}
    for layout in ("padded", "jagged"):
        model, cfg = _model(_config(**switches, sequence_layout=layout))
        model = model.float().train().cuda()
        sparse, dense, seqs = (_to(x, "cuda") for x in _inputs(PARITY_LENGTHS, 8, cfg))
        seqs["click"]["id_emb"].requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(sparse, dense, seqs)
        out.float().square().sum().backward()
        assert torch.isfinite(seqs["click"]["id_emb"].grad).all() and seqs["click"]["id_emb"].grad.abs().sum() > 0
        outs[layout] = (out.float().detach(), model(sparse, dense, seqs).detach())
    for layout, (bf16, fp32) in outs.items():
        torch.testing.assert_close(bf16, fp32, rtol=0.05, atol=0.05, msg=layout)
    torch.testing.assert_close(outs["jagged"][0], outs["padded"][0], rtol=0.05, atol=0.05)


def test_length_groups_need_the_padded_layout():
    with pytest.raises(ValueError, match="length_groups"):
        KunlunConfig(length_groups=2)
    with pytest.raises(ValueError, match="sequence_layout"):
        KunlunConfig(sequence_layout="ragged")


@variants
def test_length_groups_give_the_one_group_outputs_and_gradients(switches):
    """Computing the batch in length groups (each padded to its own longest) changes only the padding:
    the outputs and every parameter's gradient equal those of the whole batch padded as one block."""
    lengths = {"impression": [5, 0, 9, 1, 70, 2, 3, 0], "click": [2, 3, 0, 4, 1, 0, 8, 2],
               "conversion": [0, 1, 0, 2, 0, 0, 3, 1]}
    grads, outs = [], []
    for groups in (1, 3):
        model, cfg = _model(dataclasses.replace(_config(**switches), sequence_layout="padded", length_groups=groups))
        model.train()
        sparse, dense, seqs = map(_double, _inputs(lengths, 8, cfg))
        out = model(sparse, dense, seqs)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert torch.allclose(outs[0], outs[1], atol=1e-10)
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-9) for n in grads[0])
