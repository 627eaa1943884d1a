"""PPO's clip rule, torch-free: the loss applies it to tensors, the UI's per-token
diagnostics to plain floats, so both always agree on which tokens the clip stopped."""

from typing import TypeVar

Value = TypeVar("Value")


def clipped_low(ratio: Value, advantage: Value, clip_eps: float) -> Value:
    """The ratio fell below ``1 - clip_eps`` where the advantage pushes it down (TRL's
    ``is_low_clipped``)."""
    return (ratio < 1 - clip_eps) & (advantage < 0)


def clipped_high(ratio: Value, advantage: Value, clip_eps_high: float) -> Value:
    """The ratio rose above ``1 + clip_eps_high`` where the advantage pushes it up (TRL's
    ``is_high_clipped``)."""
    return (ratio > 1 + clip_eps_high) & (advantage > 0)


def clip_active(
    ratio: Value, advantage: Value, clip_eps: float, clip_eps_high: float | None = None
) -> Value:
    """Whether the clip zeroes a token's gradient: its importance ratio left the trust region
    ``[1 - clip_eps, 1 + clip_eps_high]`` (None: symmetric) in the direction its advantage
    pushes it. Floats give a bool, tensors an elementwise bool tensor."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    return clipped_low(ratio, advantage, clip_eps) | clipped_high(ratio, advantage, high)
