"""Weight sets: the canonical tensors of a model, their checksum, and validation of updates.

The checksum is SHA-256 over (name, dtype, shape, bytes) of every canonical tensor in name
order. The trainer computes it over the weights it sends and compares it with the engine's
acknowledgement, which is computed from the tensors the engine forward actually reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
from torch import nn


class WeightUpdateError(ValueError):
    """A weight update was refused; the engine kept its previous weights and version."""


def canonical_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Name -> tensor for every distinct parameter/buffer that is saved (tied copies once)."""
    seen: set[int] = set()
    weights = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        weights[name] = tensor
    return weights


def weights_checksum(weights: Mapping[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        data = tensor.contiguous().cpu().reshape(-1).view(torch.uint8)
        digest.update(memoryview(data.numpy()))
    return digest.hexdigest()


def validate_update(
    current: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor]
) -> None:
    """Refuse a weight set that does not fit exactly: names, shapes, dtypes, finiteness."""
    missing = sorted(set(current) - set(update))
    extra = sorted(set(update) - set(current))
    if missing or extra:
        raise WeightUpdateError(f"weight set does not match: missing {missing}, extra {extra}")
    for name, tensor in update.items():
        own = current[name]
        if not isinstance(tensor, torch.Tensor):
            raise WeightUpdateError(f"{name}: expected a tensor, got {type(tensor).__name__}")
        if tensor.shape != own.shape:
            raise WeightUpdateError(
                f"{name}: shape {tuple(tensor.shape)} != served {tuple(own.shape)}"
            )
        if tensor.dtype != own.dtype:
            raise WeightUpdateError(f"{name}: dtype {tensor.dtype} != served {own.dtype}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WeightUpdateError(f"{name}: contains NaN or inf")
