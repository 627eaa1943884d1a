"""One policy-gradient update over a step's samples, in token-budgeted micro-batches.

Samples are packed (no padding) into micro-batches of at most `max_tokens` prompt + response
tokens; every micro-batch's loss is divided by the whole step's token count, so accumulating
their gradients gives exactly the gradient of the step's loss. Advantages come in computed for
the whole step. Nothing here steps the optimizer: the caller checks the result is finite first.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from core_engine.adapters import adapters_disabled
from core_engine.model import CausalLM
from core_engine.rl.logprobs import packed_response_logprobs
from core_engine.rl.loss import grpo_loss


@dataclass(frozen=True)
class TrainSample:
    prompt: list[int]
    response: list[int]
    behaviour: list[float]  # the engine's temperature-only log-probs of `response`
    advantage: float
    old: list[float] | None = None  # the trainer's log-probs at the rollout's version, if known
    # sampled (in part) by a version older than the trainer's: the decoupled loss applies
    off_policy: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.response)


@dataclass(frozen=True)
class UpdateSettings:
    temperature: float
    clip_eps: float
    kl_coef: float
    max_tokens: int  # per micro-batch, prompt + response
    chunk_rows: int  # rows x vocabulary held at once by the log-softmax
    checkpointing: bool = False
    tis_cap: float = 0.0  # truncated importance sampling: 0 = off
    decoupled_cap: float = 2.0  # off-policy samples: the cap of pi_proximal / pi_behaviour
    autocast: torch.dtype | None = None


@dataclass
class UpdateResult:
    loss: float
    kl: float
    clip_fraction: float
    ratio_outside_fraction: float
    ratio_max: float
    micro_batches: int
    logprobs: list[list[float]]  # the trainer's log-probs, before this update
    tis_weight_mean: float | None = None
    tis_truncated_fraction: float | None = None
    # off-policy tokens' raw pi_proximal / pi_behaviour (before the cap); None: none trained
    is_weight_mean: float | None = None
    is_weight_max: float | None = None
    is_truncated_fraction: float | None = None

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and all(
            math.isfinite(v) for row in self.logprobs for v in row
        )


def pack_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices in order, packed greedily so that no micro-batch exceeds `max_tokens`."""
    batches: list[list[int]] = []
    used = max_tokens + 1
    for index, length in enumerate(lengths):
        if length > max_tokens:
            raise ValueError(
                f"sample {index} has {length} tokens, over max_tokens_per_micro_batch={max_tokens}"
            )
        if used + length > max_tokens:
            batches.append([])
            used = 0
        batches[-1].append(index)
        used += length
    return batches


@contextlib.contextmanager
def training_mode(model: torch.nn.Module) -> Iterator[None]:
    """`model` in training mode for the duration (e.g. LoRA dropout on): the colocated engine
    serves the same modules, in eval mode."""
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was_training)


def accumulate_gradients(
    model: CausalLM,
    samples: Sequence[TrainSample],
    settings: UpdateSettings,
    reference: CausalLM | None = None,
) -> UpdateResult:
    """Backward of the step's GRPO loss into `model`'s .grad, one micro-batch at a time."""
    normaliser = float(sum(len(s.response) for s in samples)) or 1.0
    totals = dict(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_outside_fraction=0.0)
    ratio_max = 1.0
    weights = ImportanceStats()
    logprobs: list[list[float]] = [[] for _ in samples]
    micro_batches = pack_micro_batches([s.num_tokens for s in samples], settings.max_tokens)
    for indices in micro_batches:
        part = [samples[i] for i in indices]
        logp = _score(model, part, settings)
        for i, row in zip(indices, logp, strict=True):
            logprobs[i] = row.detach().tolist()
        ref = None
        if reference is not None and settings.kl_coef:
            with torch.no_grad(), adapters_disabled(reference):  # LoRA: the policy's own base
                ref = _padded(_score(reference, part, settings))
        behaviour = _padded([_tensor(s.behaviour, logp[0]) for s in part])
        old = _padded(
            [
                row.detach() if s.old is None else _tensor(s.old, row)
                for s, row in zip(part, logp, strict=True)
            ]
        )
        mask = _padded([torch.ones_like(row, dtype=torch.bool) for row in logp])
        off_policy = torch.tensor([s.off_policy for s in part], device=behaviour.device)
        denominator, tis = importance_terms(old, behaviour, mask, off_policy, settings, weights)
        advantages = torch.tensor([s.advantage for s in part], device=behaviour.device)
        out = grpo_loss(
            _padded(logp),
            denominator,
            advantages,
            mask,
            settings.clip_eps,
            settings.kl_coef,
            ref,
            normaliser,
            tis,
        )
        out.loss.backward()
        totals["loss"] += float(out.loss.detach())
        totals["kl"] += out.kl
        totals["clip_fraction"] += out.clip_fraction
        totals["ratio_outside_fraction"] += out.ratio_outside_fraction
        ratio_max = max(ratio_max, out.ratio_max)
    result = UpdateResult(
        **totals, ratio_max=ratio_max, micro_batches=len(micro_batches), logprobs=logprobs
    )
    if settings.tis_cap:
        result.tis_weight_mean = weights.tis_sum / normaliser
        result.tis_truncated_fraction = weights.tis_truncated / normaliser
    if weights.off_tokens:
        result.is_weight_mean = weights.off_sum / weights.off_tokens
        result.is_weight_max = weights.off_max
        result.is_truncated_fraction = weights.off_truncated / weights.off_tokens
    return result


@dataclass
class ImportanceStats:
    """Sums over a step's tokens: the on-policy truncated IS weights (`tis_cap`) and the
    off-policy tokens' raw pi_proximal / pi_behaviour."""

    tis_sum: float = 0.0
    tis_truncated: float = 0.0
    off_tokens: int = 0
    off_sum: float = 0.0
    off_max: float = 0.0
    off_truncated: float = 0.0


def importance_terms(
    old: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    off_policy: torch.Tensor,
    settings: UpdateSettings,
    stats: ImportanceStats,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ratio's denominator and the per-token weights of a micro-batch ([N, T]; rows of
    `off_policy` [N] were sampled by an older version).

    Off-policy rows get AReaL's decoupled PPO: the ratio to the proximal policy (`old`: the
    trainer's own log-probs before this update) weighted by min(pi_proximal / pi_behaviour,
    `decoupled_cap`). On-policy rows are as before: that same form with `tis_cap` (truncated
    IS), else the ratio to the behaviour log-probs, unweighted. No weighted row: no weights.
    """
    on_tis = bool(settings.tis_cap)
    if not on_tis and not bool(off_policy.any()):
        return behaviour, None
    rows = off_policy[:, None].expand_as(mask)
    raw = torch.exp(torch.where(mask, old - behaviour, torch.zeros_like(old)))
    cap = torch.where(rows, settings.decoupled_cap, settings.tis_cap or 1.0)
    weighted = rows | on_tis
    tis = torch.where(weighted, torch.minimum(raw, cap), torch.ones_like(raw))
    on, off = mask & ~rows & weighted, mask & rows
    stats.tis_sum += float(tis[on].sum())
    stats.tis_truncated += float((raw[on] > cap[on]).sum())
    if bool(off.any()):
        stats.off_tokens += int(off.sum())
        stats.off_sum += float(raw[off].sum())
        stats.off_max = max(stats.off_max, float(raw[off].max()))
        stats.off_truncated += float((raw[off] > settings.decoupled_cap).sum())
    return torch.where(weighted, old, behaviour), tis


def _score(model: CausalLM, part: Sequence[TrainSample], settings: UpdateSettings):
    device_type = model.lm_head.weight.device.type
    autocast = (
        torch.autocast(device_type, dtype=settings.autocast)
        if settings.autocast is not None
        else contextlib.nullcontext()
    )
    with autocast:
        return packed_response_logprobs(
            model,
            [s.prompt for s in part],
            [s.response for s in part],
            settings.temperature,
            settings.chunk_rows,
            settings.checkpointing and model.training,
        )


def _tensor(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=like.device)


def _padded(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    return pad_sequence(list(rows), batch_first=True)
