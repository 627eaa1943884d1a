"""The trainer's optimizer: AdamW over fp32 master weights, its moments in fp32 or bfloat16.

fp32 moments take 8 bytes per parameter, as much as the weights and gradients together; kept in
bfloat16 they take 4, which is what lets a 0.5B policy train within 8 GB on a CPU (fp32 AdamW
alone is 7.4 GiB there). The bfloat16 variant computes every update in fp32 from the stored
moments, a bounded chunk at a time, and rounds the moments back for storage (bfloat16 keeps 8
significant bits: each stored moment is within 0.4% of its fp32 value). Its first step equals
fp32 AdamW's; later steps differ only by that rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from core_engine.rl.config import OPTIMIZER_STATE_DTYPES

CHUNK = 1 << 22  # elements updated at once: bounds the fp32 temporaries (16 MiB each)


def build_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float, state_dtype: str
) -> torch.optim.Optimizer:
    """fp32 moments: torch's fused AdamW (one pass per parameter, no parameter-sized
    temporaries). bfloat16 moments: `BF16StateAdamW`."""
    if state_dtype == "float32":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    if state_dtype == "bfloat16":
        return BF16StateAdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer_state_dtype must be one of {OPTIMIZER_STATE_DTYPES}")


def optimizer_state_bytes(state_dtype: str) -> int:
    """Bytes per parameter of the two moments."""
    return 8 if state_dtype == "float32" else 4


class BF16StateAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, as `torch.optim.AdamW`) with bfloat16 moments."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: torch.nn.Parameter, group: dict) -> None:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.bfloat16)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.bfloat16)
        state["step"] += 1
        step = float(state["step"])
        lr, (beta1, beta2) = group["lr"], group["betas"]
        step_size = lr / (1 - beta1**step)
        root_correction = math.sqrt(1 - beta2**step)
        weights, grads = param.view(-1), param.grad.view(-1)
        first, second = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
        for start in range(0, weights.numel(), CHUNK):
            part = slice(start, start + CHUNK)
            grad = grads[part].float()
            m = first[part].float().lerp_(grad, 1 - beta1)
            v = second[part].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            weights[part].mul_(1 - lr * group["weight_decay"])
            denominator = (v.sqrt() / root_correction).add_(group["eps"])
            weights[part].addcdiv_(m, denominator, value=-step_size)
            first[part].copy_(m)
            second[part].copy_(v)
