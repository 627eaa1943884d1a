"""The trainer's policy laid out over the job's ranks, once the process group is up.

Full weights: FSDP2, `fully_shard` on every decoder layer, then on the root (embedding, final
norm, LM head): parameters, gradients and AdamW state are sharded, each rank holding 1/N, and
a layer's full weights exist only while it computes. fp32 on CPU; bf16 compute with fp32
gradient reduction on CUDA. The reduction of gradients is a plain sum (FSDP2 divides by N by
default): each rank's gradients already carry the whole step's normaliser
(`core_engine.rl.ranks.step`).

Replicated (LoRA always; full weights with `sharding = "replicate"`, DDP's layout): every rank
holds the whole policy (each rank loaded the same checkpoint), its trainable parameters
broadcast from rank 0 here (PEFT initialises A at random, per process), and its optimizer
state; only the gradients travel, summed by one all-reduce after the backward
(`step.reduce_replicated_gradients`). For a policy one device holds this is one collective a
step instead of FSDP2's per-layer gathers in every forward and backward and at the weight sync.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)

from core_engine.model import CausalLM

# The methods the trainer calls on the policy instead of `forward`: FSDP2 gathers the root's
# parameters (embedding, final norm, LM head) before them too.
TRAINING_FORWARDS = ("hidden_states_packed",)


def distribute_policy(model: CausalLM, shard: bool) -> CausalLM:
    """`model` (already loaded on this rank's device, with its adapter if any) laid out over
    the process group's ranks: every weight sharded, or the trainable ones replicated."""
    if shard:
        return shard_full_weights(model, model.lm_head.weight.device)
    replicate_trainable(model)
    return model


def shard_full_weights(model: CausalLM, device: torch.device) -> CausalLM:
    """FSDP2 over every rank of the group, in place: per decoder layer, then the root;
    gradients summed across ranks, not averaged. `model` may be on the meta device (its
    shards are then allocated on `device` by `to_empty`)."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    precision = MixedPrecisionPolicy()
    if device.type == "cuda":
        precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)
    for name in TRAINING_FORWARDS:
        register_fsdp_forward_method(model, name)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # a plain sum: ReduceOp.SUM, on gloo as on nccl
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def replicate_trainable(model: CausalLM) -> None:
    """Every rank's trainable parameters (all, or LoRA's adapter and any `modules_to_save`) set
    to rank 0's."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                dist.broadcast(param.data, src=0)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are sharded by FSDP2 (else replicated on every rank)."""
    return isinstance(model, FSDPModule)
