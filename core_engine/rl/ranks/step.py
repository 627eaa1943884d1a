"""One optimizer step over the job's ranks, equal to the one-process step on the same batch.

Each rank holds its share of the step's samples (`share.rank_share`). The loss of a step
divides by the step's totals (trained tokens, sequences, micro-batches: `StepTotals`), an
all-reduce here, which each rank passes to `objective.update.accumulate_gradients`: its
gradient is then exactly its share of the step's gradient. The ranks' gradients are summed,
not averaged: by FSDP2's reduce-scatter after every backward (divide factor 1,
`shard.shard_full_weights`), or, replicated, by one all-reduce of the trainable gradients after
the last. The norm is clipped over the whole (sharded) gradient and the optimizer steps every
rank's part.

FSDP2 gathers each layer's weights in every forward, a collective: every rank runs as many
micro-batches as the rank with the most, a rank with fewer running padding ones (one token,
masked out of the loss: its gradient exactly zero, its statistics dropped).

The statistics (`UpdateResult`) are the whole step's on every rank: each rank's, already in
units of the step, gathered and combined in rank order (`objective.update.combine_updates`);
log-probs come back in the batch's order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from core_engine.model import CausalLM
from core_engine.rl.objective.aggregation import StepTotals
from core_engine.rl.objective.update import (
    TrainSample,
    UpdateResult,
    UpdateSettings,
    accumulate_gradients,
    combine_updates,
    pack_micro_batches,
)
from core_engine.rl.ranks.shard import is_sharded

# What a rank with fewer micro-batches than the others computes meanwhile (FSDP2 only): one
# token, masked out of the loss, so its gradient is exactly zero.
PADDING = TrainSample(prompt=[0], response=[0], behaviour=[0.0], advantage=0.0, loss_mask=[0])


def distributed_backward(
    model: CausalLM,
    share: Sequence[TrainSample],
    settings: UpdateSettings,
    reference: CausalLM | None = None,
) -> UpdateResult:
    """The whole step's gradient in `model`'s .grad on every rank (its shard, with FSDP2), and
    the whole step's statistics; this rank computes on its `share` only, normalised by the
    step's trained tokens."""
    mine = len(pack_micro_batches([s.num_tokens for s in share], settings.max_tokens))
    trained = sum(s.trained_tokens for s in share)
    tokens, sequences, micro_batches = _all_reduce([trained, len(share), mine], dist.ReduceOp.SUM)
    length = settings.objective.completion_length
    totals = StepTotals(float(tokens) or 1.0, sequences or 1, micro_batches or 1, length)
    sharded = is_sharded(model)
    if sharded:  # as many forwards as the rank with the most: FSDP2 gathers in each
        (rounds,) = _all_reduce([mine], dist.ReduceOp.MAX)
    update = accumulate_gradients(model, share, settings, reference, totals)
    if sharded:
        for _ in range(rounds - mine):
            accumulate_gradients(model, [PADDING], settings, reference, totals)
        if reference is not None and is_sharded(reference):  # its root: gathered until now
            reference.reshard()
    else:
        reduce_replicated_gradients(model)
    everyone: list[UpdateResult | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, update)
    return combine_updates([part for part in everyone if part is not None])


def _all_reduce(values: list[int], op: dist.ReduceOp) -> list[int]:
    tensor = torch.tensor(values, dtype=torch.int64, device=_collective_device())
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def _collective_device() -> torch.device:
    """Where the group's collectives take their tensors: nccl's on this rank's CUDA device."""
    if dist.get_backend() == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_replicated_gradients(model: CausalLM) -> None:
    """The trainable parameters' gradients summed over the ranks (one all-reduce of them all,
    flattened; a rank that computed none contributes zeros)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1).float() for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for param in params:
        count = param.grad.numel()
        param.grad.copy_(flat[offset : offset + count].view_as(param.grad))
        offset += count


def clip_gradients(model: CausalLM, max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_` over the whole gradient, also when it is sharded (the
    norm of FSDP2's DTensor gradients is reduced across the ranks); returns the norm."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)
