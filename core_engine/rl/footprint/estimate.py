"""What a training job needs at the least, checked against what the worker has before any
weights are loaded.

The floor: the trainer's fp32 weights, gradients and AdamW's two moments (16 bytes per
parameter, 12 with bfloat16 moments), a KL reference model (4 bytes per parameter), the
engine's own copy when it computes in a lower precision, and the engine's KV pool when it is
kept during the training phase. A LoRA job instead holds its frozen base once, in the engine's
dtype (the engine serves it, its adapter disabled it is the KL reference), plus 16 (12) bytes
per adapter parameter, counted as fp32.
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

from core_engine.adapters import count_adapter_parameters
from core_engine.cache.sizing import kv_budget_bytes
from core_engine.engine import resolve_dtype
from core_engine.model import CausalLM, ModelConfig
from core_engine.rl.config import GRPOConfig
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

    @property
    def total_bytes(self) -> int:
        return (
            self.trainer_bytes
            + self.reference_bytes
            + self.engine_copy_bytes
            + self.kv_bytes
            + self.base_bytes
        )

    def describe(self) -> str:
        parts = [f"{self.trainer_bytes / GIB:.2f} GiB fp32 weights + gradients + AdamW"]
        if self.adapter_parameters:
            parts = [
                f"{self.base_bytes / GIB:.2f} GiB frozen base shared with the engine",
                f"{self.trainer_bytes / GIB:.2f} GiB LoRA adapter ({self.adapter_parameters:,} "
                "parameters) + gradients + AdamW",
            ]
        if self.reference_bytes:
            parts.append(f"{self.reference_bytes / GIB:.2f} GiB KL reference")
        if self.engine_copy_bytes:
            parts.append(f"{self.engine_copy_bytes / GIB:.2f} GiB engine copy")
        if self.kv_bytes:
            parts.append(f"{self.kv_bytes / GIB:.2f} GiB KV kept while training")
        return f"{self.parameters:,} parameters: " + " + ".join(parts)


def count_parameters(hf_config: Any) -> int:
    """Distinct parameters of the model a config describes (tied embeddings once), counted on
    the meta device: nothing is allocated."""
    with torch.device("meta"):  # built there: nothing is allocated, even while initialising
        model = CausalLM(ModelConfig.from_hf(hf_config))
    return sum(p.numel() for p in model.parameters())


def training_footprint(config: GRPOConfig, hf_config: Any, device: torch.device) -> Footprint:
    parameters = count_parameters(hf_config)
    engine_dtype = resolve_dtype(config.engine_dtype, device)
    engine_copy = 0 if engine_dtype == torch.float32 else parameters * engine_dtype.itemsize
    kv = 0
    keeps_kv = not config.release_kv_during_training or config.pipeline != "sync"
    if keeps_kv and device.type == "cpu":  # CUDA: sized from free; pipelined: it generates
        pools = 2 if config.generates_in_process(device.type) else 1  # + the child's engine
        kv = pools * kv_budget_bytes(config.kv_cache_bytes, 1.0, device)
    per_trained = 8 + optimizer_state_bytes(config.optimizer_state_dtype)
    if config.lora is not None:
        adapter = count_adapter_parameters(hf_config, config.lora)
        return Footprint(
            parameters=parameters,
            trainer_bytes=per_trained * adapter,
            reference_bytes=0,
            engine_copy_bytes=0,
            kv_bytes=kv,
            adapter_parameters=adapter,
            base_bytes=parameters * engine_dtype.itemsize,
        )
    return Footprint(
        parameters=parameters,
        trainer_bytes=per_trained * parameters,
        reference_bytes=4 * parameters if config.kl_coef else 0,
        engine_copy_bytes=engine_copy,
        kv_bytes=kv,
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


def check_room_for(config: GRPOConfig, device: torch.device) -> Footprint:
    """Refuse (`InsufficientMemoryError`) a job whose floor exceeds what `device` has free."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(config.model, local_files_only=True)
    footprint = training_footprint(config, hf_config, device)
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
