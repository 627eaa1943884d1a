"""A sharded trainer's state, read and written by `torch.distributed.checkpoint` (DCP) in
safetensors, each rank its own shard: never a whole copy of the weights or of the optimizer
state on one rank.

Loading (`load_sharded_model`): the policy (and the KL reference) is built on the meta device,
sharded by FSDP2, and only then given storage: each rank's 1/N. DCP's Hugging Face reader then
copies into it exactly the rows this rank holds (safetensors slices of the checkpoint's files),
from the model directory at start or from a version's directory on resume.

Saving (`save_sharded_state`, a collective): every rank writes its shard of the weights, and
DCP's consolidation (on rank 0, one tensor at a time through the files, no gather) turns them
into the version's ``model.safetensors``, which any number of ranks (or one process, or
`transformers`) loads. The optimizer tensors stay sharded, under ``optimizer/`` (keyed as
`trainer.checkpoint` keys them: parameter index, field); DCP reshards them on a resume on
another number of ranks (`load_optimizer_shards`), also from a one-process checkpoint's single
``optimizer.safetensors``. Its scalars (the parameter groups) stay in
``trainer_state.json``. Several machines: the output directory must be shared by all ranks.
DCP's safetensors writer builds each file whole in memory before writing it, so each rank
writes its shards in files of at most `FILE_BYTES` (`file_indices`): one file per rank would
stage a second copy of all its weights, or of all its optimizer state.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint._consolidate_hf_safetensors import (
    consolidate_safetensors_files,  # what the writer's own consolidation runs (torch 2.13)
)
from transformers import AutoConfig

from core_engine.model import CausalLM, ModelConfig
from core_engine.rl.footprint.estimate import shard_numel
from core_engine.rl.ranks.group import from_rank0
from core_engine.rl.ranks.shard import shard_full_weights
from core_engine.rl.trainer.checkpoint import SHARDED_OPTIMIZER, split_optimizer_state
from core_engine.user_files import WEIGHTS_FILE
from core_engine.weights import canonical_weights

# DCP's Hugging Face writer: the weight shards it consolidates, its single file and index
CONSOLIDATED_FROM = "sharded"
CONSOLIDATED_FILE = "model-00001-of-00001.safetensors"
CONSOLIDATED_INDEX = "model.safetensors.index.json"
FILE_BYTES = 32 * 2**20  # a rank's shards per file it writes at most (a larger tensor alone)


def load_sharded_model(directory: str | Path, device: torch.device) -> CausalLM:
    """The fp32 model of the Hugging Face `directory`, sharded by FSDP2 over the process
    group's ranks, each rank allocating and reading only its shard. A collective."""
    hf_config = AutoConfig.from_pretrained(directory, local_files_only=True)
    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_hf(hf_config))
    shard_full_weights(model, device)
    model.to_empty(device=device)
    model.reset_rope()  # buffers are not in the checkpoint
    dcp.load(canonical_weights(model), storage_reader=HuggingFaceStorageReader(str(directory)))
    return model.eval()


def save_sharded_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, staging: Path | None
) -> None:
    """Every rank's shard of `model`'s weights, consolidated into ``model.safetensors``, and of
    `optimizer`'s tensors (`trainer.checkpoint`'s keys) under ``optimizer/``, in rank 0's
    `staging` directory (None on the other ranks). A collective."""
    directory = from_rank0(staging)
    weights = canonical_weights(model)
    sharded = directory / CONSOLIDATED_FROM
    dcp.save(weights, storage_writer=shard_writer(sharded, weights))
    if dist.get_rank() == 0:  # one file, named as `save_weights` names it
        consolidate_safetensors_files(str(sharded), str(directory), dict.fromkeys(weights, 1))
        shutil.rmtree(sharded)
        (directory / CONSOLIDATED_INDEX).unlink()
        (directory / CONSOLIDATED_FILE).rename(directory / WEIGHTS_FILE)
    tensors, _ = split_optimizer_state(optimizer.state_dict())
    dcp.save(tensors, storage_writer=shard_writer(directory / SHARDED_OPTIMIZER, tensors))


def shard_writer(directory: Path, tensors: dict[str, torch.Tensor]) -> HuggingFaceStorageWriter:
    """DCP's writer of every rank's shards of `tensors` into `directory`, in `file_indices`."""
    files = file_indices(tensors, dist.get_world_size())
    return HuggingFaceStorageWriter(str(directory), files, save_distributed=True)


def file_indices(tensors: dict[str, torch.Tensor], ranks: int) -> dict[str, int]:
    """Name -> the file (numbered from 1) each rank writes its shard of the tensor into:
    consecutive tensors, at most `FILE_BYTES` of one rank's shards per file (a larger tensor
    alone). From the whole tensors' shapes (a DTensor's are), so the same on every rank."""
    files, file, size = {}, 1, 0
    for name, tensor in tensors.items():
        share = shard_numel(tensor, ranks) * tensor.element_size()
        if size and size + share > FILE_BYTES:
            file, size = file + 1, 0
        files[name] = file
        size += share
    return files


def load_optimizer_shards(
    optimizer: torch.optim.Optimizer, directory: Path, param_groups: list[dict[str, Any]]
) -> None:
    """`optimizer`'s state from the checkpoint `directory`, each rank reading its shard of
    every tensor (whatever number of ranks wrote it: its ``optimizer/`` shards, or one
    process's ``optimizer.safetensors``); `param_groups`: the saved scalars."""
    initialise_state(optimizer)
    tensors = {}
    for index, param in enumerate(p for g in optimizer.param_groups for p in g["params"]):
        for field, value in optimizer.state[param].items():
            tensors[f"{index}.{field}"] = value
    sharded = directory / SHARDED_OPTIMIZER
    source = sharded if sharded.is_dir() else directory
    reader = HuggingFaceStorageReader(str(source))
    dcp.load(tensors, storage_reader=reader, no_dist=not dist.is_initialized())
    for group, saved in zip(optimizer.param_groups, param_groups, strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})


def initialise_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter its (sharded) optimizer state, as its first step would: one step on
    zero gradients at learning rate 0, which leaves the parameters exactly as they are."""
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate


def is_sharded_checkpoint(directory: Path) -> bool:
    """Whether `directory`'s optimizer state was written in shards (by a sharded run)."""
    return (directory / SHARDED_OPTIMIZER).is_dir()
