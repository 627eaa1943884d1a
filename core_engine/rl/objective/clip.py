"""PPO's clip rule, torch-free: the loss applies it to tensors, the UI's per-token
diagnostics to plain floats, so both always agree on which tokens the clip stopped."""

from typing import TypeVar

Value = TypeVar("Value")


def clip_active(ratio: Value, advantage: Value, clip_eps: float) -> Value:
    """Whether the clip zeroes a token's gradient: its importance ratio left the trust region
    ``[1 - clip_eps, 1 + clip_eps]`` in the direction its advantage pushes it. Floats give a
    bool, tensors an elementwise bool tensor."""
    return ((ratio < 1 - clip_eps) & (advantage < 0)) | ((ratio > 1 + clip_eps) & (advantage > 0))
