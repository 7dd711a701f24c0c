"""Model ops against their plain references: GDPA, masks (nothing past the window, nothing from the
future, no padding), jagged <-> padded; values and gradients."""

from __future__ import annotations

import pytest
import torch

from gem.model.ops.gdpa import gdpa, gdpa_reference
from gem.model.ops.jagged import JaggedLayout, padding_ratio, to_jagged, to_padded
from gem.model.ops.masks import sliding_window_mask, sliding_window_mask_reference

torch.manual_seed(0)


@pytest.mark.parametrize("activations", [("silu",) * 4, ("silu", "gelu", "relu", "sigmoid")])
def test_gdpa_matches_reference_values_and_gradients(activations):
    q = torch.randn(3, 4, 6, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(3, 1, 6, 5) > 0.3
    args = {"activations": activations, "alpha": 8 ** -0.5, "scale": 1 / 5, "mask": mask}
    fast, ref = gdpa(q, k, v, **args), gdpa_reference(q, k, v, **args)
    assert torch.allclose(fast, ref)
    grads_fast = torch.autograd.grad(fast.square().sum(), (q, k, v))
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads_fast, grads_ref, strict=True):
        assert torch.allclose(a, b)


def test_gdpa_masked_keys_contribute_nothing():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    mask = torch.tensor([True, True, False, False, False]).view(1, 1, 1, 5)
    out = gdpa(q, k, v, ("gelu", "silu"), 0.5, 1.0, mask)
    v2 = v.clone()
    v2[..., 2:, :] = 1e6  # changing masked values (even to huge ones) changes nothing
    k2 = k.clone()
    k2[..., 2:, :] = 3.0
    assert torch.allclose(out, gdpa(q, k2, v2, ("gelu", "silu"), 0.5, 1.0, mask))


def test_gdpa_rejects_bad_activations():
    x = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="2 heads"):
        gdpa(x, x, x, ("silu",), 1.0, 1.0)
    with pytest.raises(ValueError, match="unknown"):
        gdpa(x, x, x, ("silu", "swish9"), 1.0, 1.0)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_sliding_window_mask_matches_the_rule(window):
    lengths = [5, 0, 2, 7]
    fast = sliding_window_mask(torch.tensor(lengths), 7, window)
    assert torch.equal(fast, sliding_window_mask_reference(lengths, 7, window))
    i, j = torch.meshgrid(torch.arange(7), torch.arange(7), indexing="ij")
    assert not fast[:, 0][:, j > i].any()  # nothing from the future
    if window is not None:
        assert not fast[:, 0][:, i - j >= window].any()  # nothing past the window


def test_a_jagged_layout_pads_and_unpads_as_to_padded_and_to_jagged():
    offsets = torch.tensor([0, 2, 2, 5])
    values = torch.arange(10.0).view(5, 2)
    layout = JaggedLayout.of(offsets)
    assert layout.longest == 3 and layout.rows.tolist() == [0, 0, 2, 2, 2] and layout.index.tolist() == [0, 1, 6, 7, 8]
    assert torch.equal(layout.pad(values), to_padded(values, offsets))
    assert torch.equal(layout.unpad(layout.pad(values)), values)
    empty = JaggedLayout.of(torch.zeros(3, dtype=torch.long))  # no token: still one (padding) position
    assert empty.longest == 1 and empty.pad(torch.zeros(0, 2)).shape == (2, 1, 2)


def test_jagged_padded_round_trip_and_padding_ratio():
    offsets = torch.tensor([0, 2, 2, 5])
    values = torch.arange(10.0).view(5, 2)
    padded = to_padded(values, offsets)
    assert padded.shape == (3, 3, 2) and torch.equal(padded[1], torch.zeros(3, 2))
    assert torch.equal(to_jagged(padded, offsets.diff()), values)
    assert padding_ratio(offsets.diff()) == pytest.approx(1 - 5 / 9)
    cut = to_padded(values, offsets, max_len=2)  # the values past max_len are left out
    assert torch.equal(cut, torch.stack([values[0:2], torch.zeros(2, 2), values[2:4]]))
    grad = torch.randn(5, 2)  # gradients reach each kept value from its padded position, 0 past max_len
    leaf = values.clone().requires_grad_(True)
    (to_padded(leaf, offsets, max_len=2) * to_padded(grad, offsets, max_len=2)).sum().backward()
    assert torch.equal(leaf.grad, torch.cat([grad[:4], torch.zeros(1, 2)]))


def test_sum_kron_linear_matches_reference_and_is_a_kronecker_sum():
    from gem.model.ops.sum_kron import sum_kron_linear, sum_kron_linear_reference

    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    z, w = torch.randn(3, 6, 2, dtype=torch.float64), torch.randn(3, 4, 5, dtype=torch.float64)
    fast, ref = sum_kron_linear(x, z, w), sum_kron_linear_reference(x, z, w)
    assert fast.shape == (2, 2, 5) and torch.allclose(fast, ref)
    # As one linear map on the flattened input: sum_i kron(Z_i, W_i).
    big = sum(torch.kron(z[i], w[i]) for i in range(3))  # (6*4, 2*5)
    assert torch.allclose(fast.reshape(2, -1), x.reshape(2, -1) @ big)
    g_fast, = torch.autograd.grad(fast.sum(), x)
    g_ref, = torch.autograd.grad(ref.sum(), x)
    assert torch.allclose(g_fast, g_ref)


def test_time_gap_buckets_are_log_scaled():
    from gem.model.ops.time_encoding import time_gap_buckets

    gaps = torch.tensor([-5.0, 0.0, 30.0, 60.0, 3600.0, 86400.0 * 30, 1e12])
    assert time_gap_buckets(gaps, 16).tolist() == [0, 0, 0, 1, 5, 15, 15]


def test_wukong_layer_matches_its_formula():
    from gem.model.wukong import WukongLayer

    layer = WukongLayer(tokens=6, dim=4, rank=3, fmb_tokens=2, mlp_hidden=8).double()
    x = torch.randn(2, 6, 4, dtype=torch.float64)
    ref = []
    for b in range(2):
        inter = x[b] @ (x[b].T @ layer.y)  # (n, k)
        fmb = layer.fmb_mlp(layer.fmb_norm(inter.reshape(-1))).view(2, 4)
        lcb = layer.lcb.weight @ x[b]  # (n - n_fmb, d)
        ref.append(layer.out_norm(torch.cat([fmb, lcb]) + x[b]))
    assert torch.allclose(layer(x), torch.stack(ref))


def test_mixture_of_wukong_experts_keeps_experts_on_their_tokens():
    from gem.model.wukong import MixtureOfWukongExperts

    moe = MixtureOfWukongExperts(experts=2, layers=2, tokens=8, dim=4, rank=2, mlp_hidden=8)
    x = torch.randn(3, 8, 4, requires_grad=True)
    out = moe(x)
    grad, = torch.autograd.grad(out[:, :4].sum(), x)
    assert out.shape == x.shape and grad[:, 4:].abs().max() == 0  # expert 0 never sees expert 1's block


def test_keep_last_takes_the_most_recent():
    from gem.model.ops.jagged import keep_last

    index, offsets = keep_last(torch.tensor([0, 3, 4, 4, 9]), 2)
    assert index.tolist() == [1, 2, 3, 7, 8] and offsets.tolist() == [0, 2, 3, 3, 5]


@pytest.mark.parametrize("length,window,activations", [(7, 3, ("silu", "gelu")), (5, 9, ("relu",)),
                                                        (64, 16, ("silu", "gelu", "silu", "relu")), (33, 8, ("tanh",))])
def test_windowed_gdpa_equals_dense_gdpa_under_the_window_mask(length, window, activations):
    """Values and gradients, with padded rows and one empty sequence."""
    from gem.model.ops.gdpa import windowed_gdpa

    torch.manual_seed(length)
    q, k, v = (torch.randn(4, len(activations), length, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    lengths = torch.tensor([length, max(length - 3, 0), 1, 0])
    dense = gdpa(q, k, v, activations, 0.3, 1 / window, sliding_window_mask(lengths, length, window))
    band = windowed_gdpa(q, k, v, activations, 0.3, 1 / window, lengths, window)
    torch.testing.assert_close(band, dense)
    for a, b in zip(torch.autograd.grad(dense.sum(), (q, k, v)), torch.autograd.grad(band.sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


def _softmax_inputs(length: int, heads: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    return tuple(torch.randn(4, heads, length, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))


def test_softmax_attention_matches_reference_values_and_gradients():
    """SDPA under GDPA's masks equals an explicit masked softmax, fully masked rows (a padded query,
    an empty sequence) included: 0 there, and finite gradients everywhere."""
    from gem.model.ops.softmax_attention import softmax_attention, softmax_attention_reference

    q, k, v = _softmax_inputs(7)
    mask = sliding_window_mask(torch.tensor([7, 4, 1, 0]), 7, 3)
    fast, ref = softmax_attention(q, k, v, 0.5, mask), softmax_attention_reference(q, k, v, 0.5, mask)
    torch.testing.assert_close(fast, ref)
    assert fast[3].abs().max() == 0 and fast[1, :, 4:].abs().max() == 0  # no key: exactly 0
    grads_fast = torch.autograd.grad(fast.square().sum(), (q, k, v))
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads_fast, grads_ref, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


def test_softmax_rows_sum_to_one_over_unmasked_keys():
    """With V = 1 each output is the sum of that query's weights: 1 when it reads any key, else 0;
    masked keys' values change nothing."""
    from gem.model.ops.softmax_attention import softmax_attention

    q, k, _ = _softmax_inputs(6)
    mask = torch.rand(4, 1, 6, 6, generator=torch.Generator().manual_seed(1)) > 0.5
    mask[0, 0, 2] = False  # one query with no key at all
    mask[..., 5] = False  # one key no query reads
    out = softmax_attention(q, k, torch.ones_like(k), 0.5, mask)  # (B, H, Lq, Dh)
    reads = mask.any(-1).expand(4, 2, 6).to(out.dtype)  # (B, H, Lq)
    torch.testing.assert_close(out[..., 0], reads)
    v = torch.randn_like(k)
    v2 = v.masked_fill(~mask.any(2)[..., None], 1e6)  # (B, 1, Lk, 1): the keys no query reads
    torch.testing.assert_close(softmax_attention(q, k, v, 0.5, mask), softmax_attention(q, k, v2, 0.5, mask))


@pytest.mark.parametrize("length,window", [(7, 3), (5, 9), (64, 16), (33, 8)])
def test_windowed_softmax_equals_dense_softmax_under_the_window_mask(length, window):
    """The band layout's softmax form: values and gradients, with padded rows and one empty sequence."""
    from gem.model.ops.softmax_attention import softmax_attention, windowed_softmax_attention

    q, k, v = _softmax_inputs(length, seed=length)
    lengths = torch.tensor([length, max(length - 3, 0), 1, 0])
    dense = softmax_attention(q, k, v, 0.3, sliding_window_mask(lengths, length, window))
    band = windowed_softmax_attention(q, k, v, 0.3, lengths, window)
    torch.testing.assert_close(band, dense)
    for a, b in zip(torch.autograd.grad(dense.sum(), (q, k, v)), torch.autograd.grad(band.sum(), (q, k, v))):
        torch.testing.assert_close(a, b)
