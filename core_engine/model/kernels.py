"""The engine's fp32 CPU matrix products through oneDNN where they pay.

On this project's CPUs oneDNN's fp32 matmul (`torch.ops.mkldnn._linear_pointwise`, the plain
weight as it is, nothing packed or copied) ran the decoder's products 1.2-2.6x faster than
`F.linear` on one thread once a product holds at least 2^21 multiply-adds, and slower below
(a fixed ~12 us per call): measured from 19 x 128 to 151,936 x 896 weights at 1 to 1,024 rows.
Its results differ from `F.linear`'s by rounding alone (~1e-6 relative: another summation
order). Only the engine's forwards use it (`engine_kernels`, per thread): the trainer's forward
and backward keep `F.linear` and its autograd.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

MIN_MULTIPLY_ADDS = 2**21


class _EngineThread(threading.local):
    active = False  # inside `engine_kernels` on this thread


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_engine = _EngineThread()
_AVAILABLE = onednn_available()


class engine_kernels:
    """The engine's forwards on this thread may use oneDNN for their linears (a plain class:
    entered at every engine step, it must cost next to nothing)."""

    def __enter__(self) -> None:
        self.before = _engine.active
        _engine.active = _AVAILABLE

    def __exit__(self, *exc: object) -> None:
        _engine.active = self.before


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same names) whose engine forward of an fp32 CPU batch of
    rows takes oneDNN's matmul when the product is large enough to gain from it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            _engine.active
            and x.shape[0] * self.in_features * self.out_features >= MIN_MULTIPLY_ADDS
            and x.dim() == 2
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and self.weight.dtype == torch.float32
        ):
            bias = None if self.bias is None else self.bias.detach()
            weight = self.weight.detach()
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
