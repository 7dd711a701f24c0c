"""Gradient scaling: the identity forward, the incoming gradient times beta backward.

    forward:  y = x
    backward: dL/dx = beta * dL/dy

ExFM's auxiliary distillation head reads the student's shared body through this op, so the
distillation loss reaches the head's own parameters in full but the body only at beta times its
gradient (beta = 0: the body learns from the true labels alone; beta = 1: no scaling).

The plain reference is the same function written with detach: beta * x + (1 - beta) * sg(x) has
the value x and the gradient beta.

Example:
    >>> x = torch.ones(2, requires_grad=True)
    >>> scale_gradient(x, 0.25).sum().backward()
    >>> x.grad
    tensor([0.2500, 0.2500])
"""

from __future__ import annotations

import torch


def scale_gradient_reference(x: torch.Tensor, beta: float) -> torch.Tensor:
    """beta * x + (1 - beta) * stop_gradient(x): value x, gradient beta."""
    return beta * x + (1.0 - beta) * x.detach()


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, beta: float) -> torch.Tensor:  # type: ignore[override]
        ctx.beta = beta
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad * ctx.beta, None


def scale_gradient(x: torch.Tensor, beta: float) -> torch.Tensor:
    """x unchanged (any shape); its gradient multiplied by beta. One autograd node, no extra
    forward arithmetic (the reference computes two products and a sum)."""
    return _ScaleGradient.apply(x, beta)
