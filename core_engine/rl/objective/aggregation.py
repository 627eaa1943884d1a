"""Loss aggregations: a micro-batch's per-token losses [N, T] to its share of the step's loss,
each a registered pure function (`AGGREGATIONS`, the config's `loss_type`, TRL's names).

A step is trained in micro-batches (and over ranks); every aggregation divides by totals of
the whole step (`StepTotals`, summed over micro-batches and ranks before the first backward),
so the micro-batches' losses, and their gradients, add up exactly to the step's:

- `dapo` (today's; TRL's default): sum over the step's tokens / the step's trained tokens.
- `grpo`: the mean over the step's sequences of each sequence's token mean (its tokens clamped
  to >= 1, as TRL).
- `bnpo`: each micro-batch's own token mean, averaged over the step's micro-batches (TRL: the
  local batch's token mean / gradient accumulation steps). Per micro-batch by definition: its
  value depends on how the step is split (`max_tokens_per_micro_batch`).
- `dr_grpo`: sum over the step's tokens / (the step's sequences x `completion_length`), TRL's
  sum / (sequences x max_completion_length) over the accumulated step.
- `seq_mean_token_sum` (verl): the mean over the step's sequences of each sequence's token sum.

Every aggregation is linear in the per-token losses: the KL term goes through the same one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from core_engine.rl.objective.choices import LOSS_TYPES
from core_engine.rl.objective.registry import Registry


@dataclass(frozen=True)
class StepTotals:
    """What a step's aggregation divides by: its trained tokens, sequences and micro-batches
    (over all ranks), `completion_length` (dr_grpo's constant: the job's `max_tokens`) and the
    tokens the entropy bonus averages over (the trained ones, or the top-entropy ones)."""

    tokens: float
    sequences: int
    micro_batches: int
    completion_length: int = 1
    bonus_tokens: float | None = None

    def __post_init__(self) -> None:
        if self.bonus_tokens is None:
            object.__setattr__(self, "bonus_tokens", self.tokens)


Aggregation = Callable[[torch.Tensor, torch.Tensor, StepTotals], torch.Tensor]
AGGREGATIONS: Registry[Aggregation] = Registry("loss_type", LOSS_TYPES)


@AGGREGATIONS.register("dapo")
def dapo(loss: torch.Tensor, weight: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    return (loss * weight).sum() / totals.tokens


@AGGREGATIONS.register("grpo")
def grpo(loss: torch.Tensor, weight: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    per_sequence = (loss * weight).sum(-1) / weight.sum(-1).clamp(min=1.0)
    return per_sequence.sum() / totals.sequences


@AGGREGATIONS.register("bnpo")
def bnpo(loss: torch.Tensor, weight: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    return (loss * weight).sum() / weight.sum().clamp(min=1.0) / totals.micro_batches


@AGGREGATIONS.register("dr_grpo")
def dr_grpo(loss: torch.Tensor, weight: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    return (loss * weight).sum() / (totals.sequences * totals.completion_length)


@AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(
    loss: torch.Tensor, weight: torch.Tensor, totals: StepTotals
) -> torch.Tensor:
    return (loss * weight).sum(-1).sum() / totals.sequences
