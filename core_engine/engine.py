"""The one way to build an engine: device, dtype, weights, tokenizer and one end-of-sequence
rule, for the trainer, evaluation, the Playground, the OpenAI server and the demo."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from core_engine.adapters import (
    adapter_base,
    add_saved_adapter,
    is_adapter_dir,
    load_adapted_model,
)
from core_engine.model import CausalLM, ModelConfig, checkpoint_eos_ids, load_model, load_state
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.task import DTYPE_NAMES
from core_engine.weights import adapter_weights

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


class DeviceError(ValueError):
    """The requested device does not exist on this machine."""


def resolve_device(device: str | torch.device) -> torch.device:
    """A device that exists here, or a clear error naming what does."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"unknown device {device!r}: {exc}") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise DeviceError(f"unsupported device {device!r}: use 'cpu' or 'cuda[:N]'")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if (resolved.index or 0) >= count:
        raise DeviceError(f"device {device!r} does not exist here ({count} CUDA devices visible)")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """`None` or "auto": bf16 on CUDA, fp32 elsewhere; else one of `DTYPES`."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def end_of_sequence_ids(tokenizer: Any, checkpoint: str | Path | None) -> tuple[int, ...]:
    """The tokenizer's EOS plus every id in the checkpoint's generation_config.json (instruct
    checkpoints list several): generation stops on any of them, everywhere."""
    eos = set(checkpoint_eos_ids(checkpoint)) if checkpoint is not None else set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return tuple(sorted(eos))


def engine_model(model: CausalLM, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """`model` itself when it already has this dtype and device (one copy of the weights:
    a weight sync is then a version bump plus its checks); else a copy converted tensor by
    tensor, never holding a second full-precision copy. A model carrying a LoRA adapter is
    only served as it is (its base is shared, never copied)."""
    weight = model.lm_head.weight
    if weight.dtype == dtype and weight.device == device:
        return model
    if adapter_weights(model):
        raise ValueError(
            f"a model carrying an adapter is served as it is: its base is {weight.dtype} on "
            f"{weight.device}, the engine asked for {dtype} on {device}"
        )
    with torch.device("meta"):
        copy = CausalLM(model.config)
    copy = copy.to(dtype).to_empty(device=device)
    copy.tie_weights()
    copy.reset_rope()
    load_state(copy, model.state_dict())
    return copy.eval()


def meta_model(
    checkpoint: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = "auto",
) -> CausalLM:
    """The model `load_engine(checkpoint, device=, dtype=)` builds, on the meta device: its
    sizes (`weight_bytes`, an adapter's included) and KV plan (`plan_for`), with no weights
    read or allocated."""
    from transformers import AutoConfig

    adapter = is_adapter_dir(checkpoint)
    base = adapter_base(checkpoint) if adapter else checkpoint
    target = resolve_dtype(dtype, resolve_device(device))
    config = ModelConfig.from_hf(AutoConfig.from_pretrained(base, local_files_only=True))
    with torch.device("meta"):
        model = CausalLM(config).to(target)
    model.tie_weights()
    return add_saved_adapter(model, checkpoint, low_cpu_mem_usage=True) if adapter else model


def weight_bytes(model: CausalLM) -> int:
    """The bytes of a model's parameters (tied ones once) and buffers (the RoPE tables)."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def load_engine(
    source: str | Path | CausalLM,
    config: EngineConfig | None = None,
    *,
    tokenizer: Any = None,
    checkpoint: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = "auto",
    policy_version: int = 0,
) -> InferenceScheduler:
    """An engine serving a checkpoint directory (`source` path) or a model in memory.

    `checkpoint` is the directory whose tokenizer and generation_config.json apply (default:
    `source` when it is a path; the base's for an adapter). The EOS ids of `config` are extended
    by `end_of_sequence_ids`. A PEFT adapter directory is served as its base
    (`base_model_name_or_path`) + the adapter.
    """
    device = resolve_device(device)
    target = resolve_dtype(dtype, device)
    if checkpoint is None and not isinstance(source, CausalLM):
        checkpoint = adapter_base(source) if is_adapter_dir(source) else source
    if tokenizer is None and checkpoint is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    if isinstance(source, CausalLM):
        model = engine_model(source, target, device)
    elif is_adapter_dir(source):
        model = load_adapted_model(source, target, device)
    else:
        model = load_model(source, target, device)
    config = config or EngineConfig()
    eos = set(config.eos_token_ids) | set(end_of_sequence_ids(tokenizer, checkpoint))
    config = replace(config, eos_token_ids=tuple(sorted(eos)))
    return InferenceScheduler(model, config, tokenizer, policy_version=policy_version)
