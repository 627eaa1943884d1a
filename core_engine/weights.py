"""Weight sets: the canonical tensors of a model, their file, their checksum, and validation
of updates.

The checksum is SHA-256 over (name, dtype, shape, bytes) of every served tensor in name order.
The trainer computes it over the weights it sends and compares it with the engine's
acknowledgement, which is computed from the tensors the engine forward actually reads.
A model carrying a LoRA adapter (`core_engine.adapters`) serves its adapter: its weight updates
and its checksum of record cover the adapter's tensors alone, under the keys of PEFT's saved file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from core_engine.user_files import WEIGHTS_FILE

ADAPTER_KEY_PREFIX = "base_model.model."  # PEFT's saved keys: the PeftModel wrapper's path


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


def adapter_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of the PEFT adapter `model` carries, keyed as in its `adapter_model.safetensors`
    (`base_model.model.<module>.lora_A.weight`, ...) and sharing the live storage; empty for a
    model without one."""
    if not getattr(model, "peft_config", None):
        return {}
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, save_embedding_layers=False)
    return {ADAPTER_KEY_PREFIX + name: tensor for name, tensor in state.items()}


def served_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a weight update replaces and the checksum of record covers: the adapter's tensors of
    a model carrying one, else every canonical tensor."""
    return adapter_weights(model) or canonical_weights(model)


def published_weights(model: nn.Module, engine_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What a new version of `model` sends to an engine computing in `engine_dtype`: the
    adapter's tensors (PEFT keys), else every weight converted to that dtype (the tensors
    themselves when they already have it)."""
    adapter = adapter_weights(model)
    if adapter:
        return adapter
    return {k: v.detach().to(engine_dtype) for k, v in canonical_weights(model).items()}


def save_weights(model: nn.Module | Mapping[str, torch.Tensor], directory: Path) -> None:
    """The model's canonical weights (tied copies once), or the given ones, as
    ``directory/model.safetensors``, which `load_model` and Hugging Face read back."""
    given = canonical_weights(model) if isinstance(model, nn.Module) else model
    weights = {k: v.detach().contiguous() for k, v in given.items()}
    save_file(weights, directory / WEIGHTS_FILE, metadata={"format": "pt"})


def model_checksum(model: nn.Module) -> str:
    """The checksum of record of what `model` serves or trains (`served_weights`)."""
    return weights_checksum(served_weights(model))


def weights_checksum(weights: Mapping[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        data = tensor.contiguous().cpu().reshape(-1).view(torch.uint8)
        digest.update(memoryview(data.numpy()))
    return digest.hexdigest()


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_FINGERPRINT_CHUNK = 1 << 24
_FINGERPRINT_PRIME = 65_521


def weights_fingerprint(weights: Mapping[str, torch.Tensor]) -> str:
    """A cheap identity check of a weight set, computed where the tensors live (on the GPU: a
    few milliseconds for a 7B model, against seconds for `weights_checksum`).

    Per tensor, the raw bits as integers are summed plain and position-weighted: any change of
    one element, and any swap of two, changes it. Not cryptographic: the full SHA-256
    (`weights_checksum`) stays the checksum of record, computed at checkpoints.
    """
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach()
        bits = tensor.contiguous().reshape(-1).view(_INT_VIEW[tensor.element_size()])
        plain = weighted = 0
        for start in range(0, bits.numel(), _FINGERPRINT_CHUNK):
            chunk = bits[start : start + _FINGERPRINT_CHUNK].to(torch.int64)
            index = torch.arange(start, start + chunk.numel(), device=chunk.device)
            plain += int(chunk.sum())
            weighted += int((chunk * (index % _FINGERPRINT_PRIME + 1)).sum())
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|{plain}|{weighted}|".encode())
    return digest.hexdigest()


def update_digest(weights: Mapping[str, torch.Tensor]) -> str:
    """What every weight update is verified by: on CUDA `weights_fingerprint` (on the device,
    milliseconds), elsewhere `weights_checksum` (faster than the fingerprint on a CPU)."""
    if any(t.is_cuda for t in weights.values()):
        return weights_fingerprint(weights)
    return weights_checksum(weights)


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
