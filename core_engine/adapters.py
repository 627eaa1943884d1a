"""LoRA adapters through PEFT: a job's settings, injection into our decoder (its `nn.Linear`
modules carry Hugging Face names), the saved PEFT format, the base's checksum, merged export.

A model carrying an adapter is our `CausalLM` with PEFT's LoRA layers in place of its targeted
projections: one module tree, the frozen base shared by the trainer and the engine, served
unmerged (x W^T + s (x A^T) B^T). Its saved form is what `PeftModel.save_pretrained` writes
(adapter_config.json + adapter_model.safetensors), so `PeftModel.from_pretrained` on the Hugging
Face base loads it. The LoRA matrices are fp32 over a base of any dtype (bf16 on CUDA);
`modules_to_save` copies keep the base's dtype. B starts at zero: version 0 equals the base.
The adapter's tensors and their checksum are `core_engine.weights.adapter_weights` and
`model_checksum`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from peft.tuners.tuners_utils import cast_adapter_dtype
from safetensors.torch import load_file, save_file
from torch import nn

from core_engine.atomic_dir import new_dir
from core_engine.lora_settings import (
    ADAPTER_CONFIG,
    ADAPTER_FILE,
    ALL_LINEAR,
    LoraSettings,
    read_adapter_config,
)
from core_engine.model import CausalLM, ModelConfig, load_model
from core_engine.weight_updates import copy_weights
from core_engine.weights import (
    adapter_weights,
    canonical_weights,
    validate_update,
    weights_checksum,
)

ADAPTER_NAME = "default"  # PEFT's: it never appears in the saved keys


def lora_config(settings: LoraSettings, model: CausalLM) -> LoraConfig:
    """PEFT's config for `settings` on `model`; "all-linear" becomes the module names PEFT
    picks on the Hugging Face model (every `nn.Linear` but the output layer)."""
    targets = settings.target_modules
    if targets == ALL_LINEAR:
        targets = sorted(
            name
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and module is not model.lm_head
        )
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(targets),
        modules_to_save=list(settings.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )


def add_adapter(model: CausalLM, settings: LoraSettings) -> CausalLM:
    """Inject a fresh adapter into `model` in place (PEFT's initialisation: A random, B zero)
    and freeze everything else; returns `model`."""
    tied = {"lm_head", "embed_tokens"} & set(settings.modules_to_save)
    if tied and model.config.tie_word_embeddings:
        raise ValueError(
            f"invalid lora settings: modules_to_save cannot name {sorted(tied)} of a model whose "
            "LM head is tied to its embedding"
        )
    _inject(model, lora_config(settings, model))
    return model


def _inject(model: CausalLM, config: LoraConfig, low_cpu_mem_usage: bool = False) -> None:
    inject_adapter_in_model(config, model, ADAPTER_NAME, low_cpu_mem_usage)
    for name in ("lm_head", "model.embed_tokens"):
        if isinstance(model.get_submodule(name), LoraLayer):
            raise ValueError(f"a LoRA layer on {name} is not supported: train it whole instead")
    cast_adapter_dtype(model, ADAPTER_NAME)  # LoRA matrices in fp32 over a bf16 base


def count_adapter_parameters(hf_config: Any, settings: LoraSettings) -> int:
    """The trainable parameters of an adapter with `settings` on the model a `transformers`
    config describes, counted by PEFT on the meta device: nothing is allocated."""
    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_hf(hf_config))
    _inject(model, lora_config(settings, model), low_cpu_mem_usage=True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def base_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base's canonical tensors under their Hugging Face names (the adapter's
    tensors left out), as in the base checkpoint."""
    base = {}
    for name, tensor in canonical_weights(model).items():
        if ".lora_" in name or ".modules_to_save." in name:
            continue
        base[name.replace(".base_layer.", ".").replace(".original_module.", ".")] = tensor
    return base


def base_checksum(model: nn.Module) -> str:
    """`weights_checksum` of the base: recorded once per job, verified on resume."""
    return weights_checksum(base_weights(model))


def base_view(model: CausalLM) -> CausalLM:
    """The base alone as a module tree of its own over `model`'s frozen base tensors (no copy):
    the KL reference, which is the starting policy since B starts at zero. Scoring it changes
    nothing in `model`, which an engine may be serving meanwhile."""
    with torch.device("meta"):
        view = CausalLM(model.config)
    view.load_state_dict(base_weights(model), strict=False, assign=True)
    view.tie_weights()
    view.reset_rope()
    return view.eval().requires_grad_(False)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def save_adapter(model: CausalLM, directory: str | Path, base_model: str | Path) -> None:
    """Write `model`'s adapter as `PeftModel.save_pretrained` does, for the base checkpoint
    directory `base_model`."""
    config = copy.deepcopy(model.peft_config[ADAPTER_NAME])
    config.base_model_name_or_path = str(base_model)
    config.inference_mode = True
    config.save_pretrained(str(directory))
    tensors = {k: v.detach().contiguous() for k, v in adapter_weights(model).items()}
    save_file(tensors, Path(directory) / ADAPTER_FILE, metadata={"format": "pt"})


def read_adapter(model: nn.Module, directory: str | Path) -> None:
    """Copy a saved adapter's tensors into the adapter `model` carries; refuses (nothing
    changed) a file whose names, shapes or values do not fit."""
    own = adapter_weights(model)
    saved = load_file(Path(directory) / ADAPTER_FILE)
    saved = {k: v.to(own[k].dtype) if k in own else v for k, v in saved.items()}
    validate_update(own, saved)
    copy_weights(own, saved)


def adapter_base(directory: str | Path) -> str:
    """The base checkpoint a PEFT adapter directory names (`base_model_name_or_path`)."""
    return read_adapter_config(directory)["base_model_name_or_path"]


def add_saved_adapter(
    model: CausalLM, directory: str | Path, low_cpu_mem_usage: bool = False
) -> CausalLM:
    """Inject the adapter a PEFT directory describes into `model` (its base), in place, once
    its config is checked (`read_adapter_config`: a bounded rank); its tensors are read by
    `read_adapter` (on the meta device: the adapter's sizes, nothing read); returns `model`."""
    read_adapter_config(directory)
    _inject(model, LoraConfig.from_pretrained(str(directory)), low_cpu_mem_usage)
    return model


def load_adapted_model(
    directory: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> CausalLM:
    """The base named by a PEFT adapter directory, in `dtype`, with the adapter on it."""
    model = add_saved_adapter(load_model(adapter_base(directory), dtype, device), directory)
    read_adapter(model, directory)
    return model.eval()


def export_merged(adapter_dir: str | Path, output_dir: str | Path) -> Path:
    """A plain Hugging Face checkpoint (fp32) of base + adapter merged by PEFT
    (`merge_and_unload`), written whole to `output_dir` (absent or empty; `new_dir`): the
    merged copy a user asks for."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = adapter_base(adapter_dir)
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    merged = PeftModel.from_pretrained(hf, str(adapter_dir)).merge_and_unload()
    with new_dir(output_dir) as tmp:
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base, local_files_only=True).save_pretrained(tmp)
    return Path(output_dir)
