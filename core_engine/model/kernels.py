"""The decoder's fp32 CPU matrix products through oneDNN where they pay, forward and backward.

On this project's CPUs oneDNN's fp32 matmul (`torch.ops.mkldnn._linear_pointwise`, on the
weight as it is, nothing packed or copied) ran the decoder's products 1.2-2.6x faster than
`F.linear` on one thread once a product holds at least 2^21 multiply-adds, and slower below
(a fixed ~12 us per call): measured from 19 x 128 to 151,936 x 896 weights at 1 to 2,048 rows.
The backward's two products are linears too, on transposed views that oneDNN reads in place
(x W^T's input gradient g W, its weight gradient g^T x: ~2x `mm` at the trainer's shapes), so
the engine's forwards and the trainer's forward and backward take the same path. Results differ
from `F.linear`'s by rounding alone (~1e-6 relative: another summation order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MIN_MULTIPLY_ADDS = 2**21
# g^T x sums over the rows: oneDNN lost to `mm` (2x) when they were few (16 rows, 4,864 x 896)
MIN_WEIGHT_GRADIENT_ROWS = 64


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_AVAILABLE = onednn_available()


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x weight^T (+ bias) by oneDNN; x and weight may be transposed views."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """x W^T + b with its three gradients, each product by oneDNN (rows of x: tokens)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # e.g. a sum's expanded gradient
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad, weight.t(), None)
        if ctx.needs_input_grad[1]:
            if x.shape[0] >= MIN_WEIGHT_GRADIENT_ROWS:
                grad_weight = _product(grad.t(), x.t(), None)
            else:
                grad_weight = grad.t().mm(x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same names) whose fp32 CPU products take oneDNN's matmul
    when they are large enough to gain from it, with autograd when it records."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if x.dim() else 0
        if not (
            _AVAILABLE
            and rows * self.in_features * self.out_features >= MIN_MULTIPLY_ADDS
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and self.weight.dtype == torch.float32
        ):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features).contiguous()
        records = torch.is_grad_enabled() and (
            x.requires_grad
            or self.weight.requires_grad
            or (self.bias is not None and self.bias.requires_grad)
        )
        if records:
            out = _OneDNNLinear.apply(flat, self.weight, self.bias)
        else:
            bias = None if self.bias is None else self.bias.detach()
            out = _product(flat, self.weight.detach(), bias)
        return out.view(*x.shape[:-1], self.out_features)
