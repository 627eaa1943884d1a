"""What the trainer trains: every weight in fp32 (full), or a LoRA adapter in fp32 over a frozen
base in the engine's dtype (bf16 on CUDA), which the colocated engine serves as it is: one copy
of the base in the worker, shared by the trainer and the engine.

Here: loading the policy at start or resume (with LoRA, the base's checksum is computed once per
run and must equal the one the checkpoint recorded), its trainable parameters, what each version
publishes to the engine, and the KL reference. The optimizer takes the parameters that require
gradients: with LoRA the adapter's alone.
"""

from __future__ import annotations

from pathlib import Path

import torch

from core_engine.adapters import add_adapter, base_checksum, base_view, read_adapter
from core_engine.engine import resolve_dtype
from core_engine.model import CausalLM, load_model
from core_engine.rl.checkpoint import read_trainer_state
from core_engine.rl.config import GRPOConfig


class BaseChangedError(ValueError):
    """A LoRA run's base checkpoint is not the one its checkpoints were trained on."""


def load_policy(
    config: GRPOConfig, resume: Path | None, device: torch.device
) -> tuple[CausalLM, str | None]:
    """The policy, from `config.model` or the checkpoint `resume`, in eval mode (the trainer
    switches to training mode for its own forwards only: the engine serves the same modules);
    with LoRA also the base's checksum (`core_engine.adapters.base_checksum`), else None."""
    if config.lora is None:
        return load_model(resume or config.model, torch.float32, device), None
    model = load_model(config.model, resolve_dtype(config.engine_dtype, device), device)
    checksum = base_checksum(model)
    if resume is not None:
        recorded = read_trainer_state(resume).get("base_checksum")
        if recorded != checksum:
            raise BaseChangedError(
                f"the base {config.model} has checksum {checksum[:12]}, but {resume} was trained "
                f"on {str(recorded)[:12]}: resume with the base the run started from"
            )
    add_adapter(model, config.lora)
    if resume is not None:
        read_adapter(model, resume)
    return model.eval(), checksum  # PEFT's new modules start in training mode


def kl_reference(config: GRPOConfig, model: CausalLM, device: torch.device) -> CausalLM | None:
    """The KL anchor, the starting policy (also when resuming): with LoRA a module tree of its
    own over the policy's frozen base tensors (`base_view`: B starts at zero, so the base is
    the starting policy; the served modules are never switched); else a second fp32 copy of
    `config.model`."""
    if not config.kl_coef:
        return None
    if config.lora is not None:
        return base_view(model)
    return load_model(config.model, torch.float32, device).eval()
