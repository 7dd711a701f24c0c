"""gem.model.ops.jagged_attention against the padded attention it replaces: for GDPA and softmax,
each jagged form equals the padded one under its mask at every real position, in values and in
gradients, with empty sequences and sequences longer than the window."""

from __future__ import annotations

import pytest
import torch

from gem.model.ops.attention import attend
from gem.model.ops.jagged import JaggedLayout, to_jagged, to_padded
from gem.model.ops.jagged_attention import seed_pooling, summary_attention, window_attention
from gem.model.ops.masks import padding_mask, sliding_window_mask

LENGTHS = torch.tensor([5, 0, 11, 1, 3])  # an empty sequence, and one longer than the windows below
OFFSETS = torch.cat([torch.zeros(1, dtype=torch.long), LENGTHS.cumsum(0)])
LAYOUT = JaggedLayout.of(OFFSETS)
ROWS = LAYOUT.rows
H, DH = 2, 4
ACTIVATIONS = ("silu", "gelu")
ATTENTIONS = pytest.mark.parametrize("attention", ["gdpa", "softmax"])


def _leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True) for shape in shapes]


def _heads_first(stream: torch.Tensor) -> torch.Tensor:
    """(N, H, Dh) stream -> (B, H, L, Dh) padded blocks."""
    return to_padded(stream, OFFSETS).transpose(1, 2)


def _assert_same(jagged: torch.Tensor, padded: torch.Tensor, leaves: list[torch.Tensor]) -> None:
    torch.testing.assert_close(jagged, padded)
    weights = torch.randn(jagged.shape, generator=torch.Generator().manual_seed(9), dtype=jagged.dtype)
    for a, b in zip(torch.autograd.grad((jagged * weights).sum(), leaves),
                    torch.autograd.grad((padded * weights).sum(), leaves), strict=True):
        torch.testing.assert_close(a, b)


@ATTENTIONS
def test_summary_attention_equals_padded_attention_to_the_summary_tokens(attention):
    n = int(LENGTHS.sum())
    q, k, v = leaves = _leaves((n, H, DH), (5, H, 3, DH), (5, H, 3, DH))
    jagged = summary_attention(attention, q, k, v, LAYOUT, ACTIVATIONS, 0.5, 1 / 3)
    real = padding_mask(LENGTHS, int(LENGTHS.max()))[:, None, :, None]  # (B, 1, L, 1)
    padded = attend(attention, _heads_first(q), k, v, ACTIVATIONS, 0.5, 1 / 3, real.expand(-1, 1, -1, 3))
    _assert_same(jagged, to_jagged(padded.transpose(1, 2), LENGTHS), leaves)


@ATTENTIONS
@pytest.mark.parametrize("window", [1, 3, 16])
def test_window_attention_equals_padded_sliding_window_attention(attention, window):
    """The stream's band with a segment mask reads exactly each token's window in its own sequence."""
    n = int(LENGTHS.sum())
    q, k, v = leaves = _leaves((n, H, DH), (n, H, DH), (n, H, DH))
    jagged = window_attention(attention, q, k, v, ROWS, ACTIVATIONS, 0.5, 1 / window, window)
    mask = sliding_window_mask(LENGTHS, int(LENGTHS.max()), window)
    padded = attend(attention, _heads_first(q), _heads_first(k), _heads_first(v), ACTIVATIONS, 0.5, 1 / window, mask)
    _assert_same(jagged, to_jagged(padded.transpose(1, 2), LENGTHS), leaves)


@ATTENTIONS
def test_seed_pooling_equals_padded_seed_attention(attention):
    n, seeds = int(LENGTHS.sum()), 3
    q, k, v = leaves = _leaves((seeds, H, DH), (n, H, DH), (n, H, DH))
    jagged = seed_pooling(attention, q, k, v, LAYOUT, ACTIVATIONS, 0.5, 1 / 11)  # (B, H, S, Dh)
    mask = padding_mask(LENGTHS, int(LENGTHS.max()))[:, None, None, :]  # (B, 1, 1, L)
    seeds_q = q.transpose(0, 1)[None].expand(LENGTHS.numel(), -1, -1, -1)  # (B, H, S, Dh)
    padded = attend(attention, seeds_q, _heads_first(k), _heads_first(v), ACTIVATIONS, 0.5, 1 / 11, mask)
    _assert_same(jagged, padded, leaves)
    assert not jagged[1].any()  # the empty sequence pools to 0


def test_an_empty_stream_attends_to_nothing():
    empty = torch.zeros(0, H, DH)
    rows = torch.zeros(0, dtype=torch.long)
    assert window_attention("gdpa", empty, empty, empty, rows, ACTIVATIONS, 1.0, 1.0, 4).shape == (0, H, DH)
    no_tokens = JaggedLayout.of(torch.zeros(3, dtype=torch.long))
    for attention in ("gdpa", "softmax"):
        pooled = seed_pooling(attention, torch.randn(3, H, DH), empty, empty, no_tokens, ACTIVATIONS, 1.0, 1.0)
        assert pooled.shape == (2, H, 3, DH) and not pooled.any()


def test_seed_pooling_needs_one_activation_per_head():
    n = int(LENGTHS.sum())
    seeds, k, v = _leaves((3, H, DH), (n, H, DH), (n, H, DH))
    with pytest.raises(ValueError, match="1 activations for 2 heads"):
        seed_pooling("gdpa", seeds, k, v, LAYOUT, ("silu",), 0.5, 1.0)
