"""What a training job needs at the least, checked against what the worker has before any
weights are loaded.

The floor: the trainer's fp32 weights, gradients and AdamW's two moments (16 bytes per
parameter, 12 with bfloat16 moments), a KL reference model (4 bytes per parameter), the
engine's own copy when it computes in a lower precision or the trainer's weights are sharded,
and the engine's KV pool when it is
kept during the training phase. A LoRA job instead holds its frozen base once, in the engine's
dtype (the engine serves it; its KL reference is a module tree over the same base tensors, no
copy), plus 16 (12) bytes per adapter parameter, counted as fp32.
Over N devices (ranks), each device's share: with full weights FSDP2 shards the trainer's
weights, gradients and moments (and the frozen KL reference) into N parts, and all-gathers one
decoder layer at a time in its compute dtype (bf16 on CUDA), with the root (embedding, final
norm, LM head) gathered through the step (the KL reference's too); forward and backward
prefetch may hold a second layer, counted on top like the activations. Each rank loads only
its shards (`core_engine.rl.ranks.state`): no whole fp32 copy ever exists on a rank. Each
rank's engine keeps its own full copy (in its dtype, fp32 too) and KV pool. A LoRA job
replicates its frozen base and its adapter on every rank, and `sharding = "replicate"` all of a
full-weight job: nothing of them shrinks with N.
A reward model of the job's reward list (`core_engine.rl.rewards.reward_model`) is held on
every device that scores, in the dtype it scores in: once per process that scores (two when a
child process generates).
Activations, the log-softmax chunks and the process itself come on top, so a job refused here
could never have run; one that passes may still need more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core_engine.adapters import count_adapter_parameters
from core_engine.cache.sizing import kv_budget_bytes
from core_engine.engine import resolve_dtype
from core_engine.model import CausalLM, ModelConfig
from core_engine.rl.config import GRPOConfig
from core_engine.rl.rewards.mix import parse_rewards
from core_engine.rl.rewards.reward_model import REWARD_MODEL, reward_model_parameters
from core_engine.rl.trainer.optimizer import optimizer_state_bytes

GIB = 2**30
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20


class InsufficientMemoryError(ValueError):
    """The worker cannot hold even the job's floor (see the module docstring)."""


@dataclass(frozen=True)
class Footprint:
    parameters: int
    trainer_bytes: int  # fp32 weights (LoRA: the adapter's) + gradients + AdamW moments
    reference_bytes: int
    engine_copy_bytes: int
    kv_bytes: int
    adapter_parameters: int = 0  # LoRA: the trained parameters
    base_bytes: int = 0  # LoRA: the frozen base, shared by the trainer and the engine
    devices: int = 1  # ranks of the job; every byte count here is one device's
    gathered_bytes: int = 0  # FSDP2: one decoder layer's and the root's parameters gathered
    reward_model_bytes: int = 0  # the job's reward models, as they score

    @property
    def total_bytes(self) -> int:
        return (
            self.trainer_bytes
            + self.reference_bytes
            + self.engine_copy_bytes
            + self.kv_bytes
            + self.base_bytes
            + self.gathered_bytes
            + self.reward_model_bytes
        )

    def describe(self) -> str:
        shard = f" (1/{self.devices} shard)" if self.gathered_bytes else ""
        parts = [f"{self.trainer_bytes / GIB:.2f} GiB fp32 weights + gradients + AdamW{shard}"]
        if self.adapter_parameters:
            parts = [
                f"{self.base_bytes / GIB:.2f} GiB frozen base shared with the engine",
                f"{self.trainer_bytes / GIB:.2f} GiB LoRA adapter ({self.adapter_parameters:,} "
                "parameters) + gradients + AdamW",
            ]
        if self.reference_bytes:
            parts.append(f"{self.reference_bytes / GIB:.2f} GiB KL reference{shard}")
        if self.gathered_bytes:
            parts.append(f"{self.gathered_bytes / GIB:.2f} GiB one layer and the roots gathered")
        if self.engine_copy_bytes:
            parts.append(f"{self.engine_copy_bytes / GIB:.2f} GiB engine copy")
        if self.kv_bytes:
            parts.append(f"{self.kv_bytes / GIB:.2f} GiB KV kept while training")
        if self.reward_model_bytes:
            parts.append(f"{self.reward_model_bytes / GIB:.2f} GiB reward model")
        per_device = f" per device over {self.devices}" if self.devices > 1 else ""
        return f"{self.parameters:,} parameters{per_device}: " + " + ".join(parts)


def meta_model(hf_config: Any) -> CausalLM:
    """The model a config describes, built on the meta device: nothing is allocated, even
    while initialising."""
    with torch.device("meta"):
        return CausalLM(ModelConfig.from_hf(hf_config))


def numel(module: nn.Module) -> int:
    """Distinct parameters of `module` (tied ones once)."""
    return sum(p.numel() for p in module.parameters())


def count_parameters(hf_config: Any) -> int:
    """Distinct parameters of the model a config describes (tied embeddings once)."""
    return numel(meta_model(hf_config))


def shard_parameters(model: nn.Module, devices: int) -> int:
    """One device's share of `model`'s parameters under FSDP2 (`shard_numel`). All at 1."""
    return sum(shard_numel(p, devices) for p in model.parameters())


def shard_numel(tensor: torch.Tensor, devices: int) -> int:
    """The elements of `tensor` the device with most of it holds under FSDP2, which splits a
    tensor on its first dimension into `devices` shards of ceil(rows / devices) rows (short
    ones padded); a scalar whole. A DTensor's shape is the whole tensor's."""
    if tensor.dim() == 0:
        return 1
    return -(-tensor.shape[0] // devices) * (tensor.numel() // tensor.shape[0])


def layer_parameters(model: CausalLM) -> int:
    """Parameters of one decoder layer (FSDP2's unit; all layers are the same shape)."""
    return numel(model.model.layers[0])


def root_parameters(model: CausalLM) -> int:
    """Parameters outside the decoder layers (embedding, final norm, LM head: FSDP2's root)."""
    return numel(model) - sum(numel(layer) for layer in model.model.layers)


def fsdp_compute_dtype(device: torch.device) -> torch.dtype:
    """The dtype FSDP2 gathers a layer in: bf16 mixed precision on CUDA, fp32 elsewhere (the
    engine's "auto")."""
    return resolve_dtype("auto", device)


def reward_model_bytes(config: GRPOConfig, device: torch.device) -> int:
    """What the job's reward models take on `device` (see the module docstring)."""
    if isinstance(config.reward, str) or config.reward is None:
        return 0
    terms = [t for t in parse_rewards(config.reward) if t.name == REWARD_MODEL]
    if not terms:
        return 0
    copies = 2 if config.generates_in_process(device.type) else 1
    itemsize = resolve_dtype("auto", device).itemsize
    return copies * itemsize * sum(reward_model_parameters(t.model or "") for t in terms)


def training_footprint(
    config: GRPOConfig, hf_config: Any, device: torch.device, devices: int = 1
) -> Footprint:
    """One device's floor for `config` on a job of `devices` ranks (see the module docstring)."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1, got {devices}")
    model = meta_model(hf_config)
    parameters = numel(model)
    engine_dtype = resolve_dtype(config.engine_dtype, device)
    sharded = devices > 1 and config.shards_weights
    shares_policy = engine_dtype == torch.float32 and not sharded  # serves the trainer's own
    engine_copy = 0 if shares_policy else parameters * engine_dtype.itemsize
    kv = 0
    keeps_kv = not config.release_kv_during_training or config.pipeline != "sync"
    if keeps_kv and device.type == "cpu":  # CUDA: sized from free; pipelined: it generates
        pools = 2 if config.generates_in_process(device.type) else 1  # + the child's engine
        kv = pools * kv_budget_bytes(config.kv_cache_bytes, 1.0, device)
    per_trained = 8 + optimizer_state_bytes(config.optimizer_state_dtype)
    if config.lora is not None:  # replicated on every rank: nothing depends on `devices`
        adapter = count_adapter_parameters(hf_config, config.lora)
        return Footprint(
            parameters=parameters,
            trainer_bytes=per_trained * adapter,
            reference_bytes=0,
            engine_copy_bytes=0,
            kv_bytes=kv,
            adapter_parameters=adapter,
            base_bytes=parameters * engine_dtype.itemsize,
            devices=devices,
            reward_model_bytes=reward_model_bytes(config, device),
        )
    shard = shard_parameters(model, devices if sharded else 1)
    gathered = 0
    if sharded:  # a root stays gathered through the step, the KL reference's too (`ranks.step`)
        in_flight = layer_parameters(model) + root_parameters(model) * (2 if config.kl_coef else 1)
        gathered = in_flight * fsdp_compute_dtype(device).itemsize
    return Footprint(
        parameters=parameters,
        trainer_bytes=per_trained * shard,
        reference_bytes=4 * shard if config.kl_coef else 0,  # sharded as the policy
        engine_copy_bytes=engine_copy,
        kv_bytes=kv,
        devices=devices,
        gathered_bytes=gathered,
        reward_model_bytes=reward_model_bytes(config, device),
    )


def available_bytes(device: torch.device) -> int:
    """Memory this job may still take: free device memory on CUDA, else the host's
    MemAvailable (what Linux can hand out without swapping)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


def check_footprint(footprint: Footprint, available: int, device: torch.device) -> None:
    if footprint.total_bytes > available:
        raise InsufficientMemoryError(
            f"this job needs at least {footprint.total_bytes / GIB:.2f} GiB on {device} "
            f"({footprint.describe()}), but only {available / GIB:.2f} GiB is available: use a "
            "smaller model or a worker with more memory"
        )


def check_room_for(config: GRPOConfig, device: torch.device, devices: int = 1) -> Footprint:
    """Refuse (`InsufficientMemoryError`) a job whose floor on each of `devices` ranks exceeds
    what `device` has free."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(config.model, local_files_only=True)
    footprint = training_footprint(config, hf_config, device, devices)
    check_footprint(footprint, available_bytes(device), device)
    return footprint


def return_large_frees_to_the_os() -> bool:
    """Have glibc give every allocation of `MMAP_THRESHOLD` or more its own mapping, unmapped
    when freed. By default the threshold climbs to 32 MiB as large blocks are freed, and then
    layer-sized tensors live in the heap and per-thread arenas, where freed memory fragments:
    on the 0.5B-shape job through the queue that cost 1.2 GiB of peak RSS. Returns False where
    glibc is not the allocator (nothing changes)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False
