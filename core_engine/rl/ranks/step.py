"""One optimizer step over the job's ranks, equal to the one-process step on the same batch.

Each rank holds its share of the step's samples (`share.rank_share`). The GRPO loss of a step
is its samples' token sums divided by the step's trained tokens, `T`, an all-reduce here. Each
rank runs `objective.update.accumulate_gradients` one micro-batch at a time: a micro-batch of
`t` trained tokens normalises by its own `t`, so its advantages and KL coefficient are scaled by
`t / T` (the loss is linear in both: PPO's clipped surrogate in a positive advantage factor,
the KL term in its coefficient) and its gradient is exactly its share of the step's gradient.
The ranks' gradients are then summed, not averaged: by FSDP2's reduce-scatter after every
backward (divide factor 1, `shard.shard_full_weights`), or with LoRA by one all-reduce of the
adapter's gradients after the last. The norm is clipped over the whole (sharded) gradient and
the optimizer steps every rank's part.

FSDP2 gathers each layer's weights in every forward, a collective: every rank runs as many
micro-batches as the rank with the most, a rank with fewer running zero-weight ones (a one-
token sample, its gradient exactly zero, its statistics dropped).

The statistics (`UpdateResult`) are the whole step's on every rank: each rank's sums in units
of the step, gathered and added in rank order; log-probs come back in the batch's order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from core_engine.model import CausalLM
from core_engine.rl.objective.update import (
    TrainSample,
    UpdateResult,
    UpdateSettings,
    accumulate_gradients,
    pack_micro_batches,
)
from core_engine.rl.ranks.group import RankInfo
from core_engine.rl.ranks.shard import is_sharded
from core_engine.rl.ranks.share import rank_share

# What a rank with fewer micro-batches than the others computes meanwhile (FSDP2 only).
PADDING = TrainSample(prompt=[0], response=[0], behaviour=[0.0], advantage=0.0)


@dataclass
class _Sums:
    """One rank's statistics, in units of the whole step (divided by its trained tokens)."""

    loss: float = 0.0
    kl: float = 0.0
    clip_fraction: float = 0.0
    ratio_outside_fraction: float = 0.0
    ratio_max: float = 1.0
    micro_batches: int = 0
    entropy_sum: float = 0.0
    entropy_tokens: int = 0
    importance: dict[str, float] = field(default_factory=dict)
    logprobs: list[list[float]] = field(default_factory=list)

    def add(self, other: _Sums) -> None:
        """`other` (a later micro-batch, or a later rank) added to these."""
        self.loss += other.loss
        self.kl += other.kl
        self.clip_fraction += other.clip_fraction
        self.ratio_outside_fraction += other.ratio_outside_fraction
        self.ratio_max = max(self.ratio_max, other.ratio_max)
        self.micro_batches += other.micro_batches
        self.entropy_sum += other.entropy_sum
        self.entropy_tokens += other.entropy_tokens
        for key, value in other.importance.items():  # sums, and maxima for the `_max` keys
            before = self.importance.get(key, value if key.endswith("_max") else 0.0)
            combined = max(before, value) if key.endswith("_max") else before + value
            self.importance[key] = combined
        self.logprobs.extend(other.logprobs)

    def result(self) -> UpdateResult:
        tokens = self.entropy_tokens
        return UpdateResult(
            loss=self.loss,
            kl=self.kl,
            clip_fraction=self.clip_fraction,
            ratio_outside_fraction=self.ratio_outside_fraction,
            ratio_max=self.ratio_max,
            micro_batches=self.micro_batches,
            logprobs=self.logprobs,
            importance=self.importance,
            entropy=self.entropy_sum / tokens if tokens else None,
        )


def train_step(
    model: CausalLM,
    optimizer: torch.optim.Optimizer,
    share: Sequence[TrainSample],
    settings: UpdateSettings,
    max_grad_norm: float,
    reference: CausalLM | None = None,
) -> tuple[UpdateResult, float]:
    """The step on this rank's `share`: gradients (`distributed_backward`), the clipped norm,
    then the optimizer step when the loss and the norm are finite (the same on every rank:
    both are the whole step's). The gradients stay for the caller to inspect."""
    optimizer.zero_grad(set_to_none=True)
    update = distributed_backward(model, share, settings, reference)
    norm = clip_gradients(model, max_grad_norm)
    if update.finite and math.isfinite(norm):
        optimizer.step()
    return update, norm


def rank_backward(
    model: CausalLM,
    samples: Sequence[TrainSample],
    group_size: int,
    info: RankInfo,
    settings: UpdateSettings,
    max_grad_norm: float,
    reference: CausalLM | None = None,
) -> tuple[UpdateResult, float]:
    """The step's gradients from this rank's share of the step's `samples` (whole groups of
    `group_size`, `share.rank_share`), clipped; returns the whole step's statistics and norm.
    The optimizer step is the caller's (through its weight channel)."""
    share = rank_share(samples, group_size, info.rank, info.world_size)
    update = distributed_backward(model, share, settings, reference)
    return update, clip_gradients(model, max_grad_norm)


def distributed_backward(
    model: CausalLM,
    share: Sequence[TrainSample],
    settings: UpdateSettings,
    reference: CausalLM | None = None,
) -> UpdateResult:
    """The whole step's gradient in `model`'s .grad on every rank (its shard, with FSDP2), and
    the whole step's statistics; this rank computes on its `share` only."""
    batches = pack_micro_batches([s.num_tokens for s in share], settings.max_tokens)
    trained = sum(s.trained_tokens for s in share)
    normaliser = float(_all_reduce(trained, dist.ReduceOp.SUM)) or 1.0
    sharded = is_sharded(model)
    rounds = _all_reduce(len(batches), dist.ReduceOp.MAX) if sharded else len(batches)
    sums = _Sums()
    for index in range(rounds):
        padding = index >= len(batches)
        part = [PADDING] if padding else [share[i] for i in batches[index]]
        tokens = 0 if padding else sum(s.trained_tokens for s in part)
        scale = tokens / normaliser
        scaled = [replace(s, advantage=s.advantage * scale) for s in part]
        part_settings = replace(settings, kl_coef=settings.kl_coef * scale)
        result = accumulate_gradients(model, scaled, part_settings, reference)
        if not padding:
            sums.add(_in_step_units(result, scale, tokens))
    if not sharded:
        reduce_adapter_gradients(model)
    return _gathered(sums).result()


def _in_step_units(result: UpdateResult, scale: float, tokens: int) -> _Sums:
    """A micro-batch's statistics (normalised by its own `tokens`) as shares of the step's.
    Its loss already is one: its advantages and KL coefficient were scaled."""
    return _Sums(
        loss=result.loss,
        kl=result.kl * scale,
        clip_fraction=result.clip_fraction * scale,
        ratio_outside_fraction=result.ratio_outside_fraction * scale,
        ratio_max=result.ratio_max,
        micro_batches=result.micro_batches,
        entropy_sum=(result.entropy or 0.0) * tokens,
        entropy_tokens=tokens if result.entropy is not None else 0,
        importance=dict(result.importance),
        logprobs=result.logprobs,
    )


def _gathered(mine: _Sums) -> _Sums:
    """Every rank's sums, added in rank order (the same result on every rank)."""
    everyone: list[_Sums | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    total = _Sums()
    for sums in everyone:
        assert sums is not None
        total.add(sums)
    return total


def _all_reduce(value: int, op: dist.ReduceOp) -> int:
    tensor = torch.tensor([value], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(tensor, op=op)
    return int(tensor.item())


def _collective_device() -> torch.device:
    """Where the group's collectives take their tensors: nccl's on this rank's CUDA device."""
    if dist.get_backend() == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_adapter_gradients(model: CausalLM) -> None:
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
