"""One policy-gradient update over a step's samples, in token-budgeted micro-batches.

Samples are packed (no padding) into micro-batches of at most `max_tokens` prompt + response
tokens; every micro-batch's loss is divided by the whole step's totals (`StepTotals`: tokens,
sequences, micro-batches), so accumulating their gradients gives exactly the gradient of the
step's loss whatever the aggregation. Advantages come in computed for the whole step. The
objective itself is `objective.policy_loss`; nothing here steps the optimizer: the caller
checks the result is finite first.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch.nn.utils.rnn import pad_sequence

from core_engine.model import CausalLM
from core_engine.rl.objective.aggregation import StepTotals
from core_engine.rl.objective.logprobs import packed_response_scores
from core_engine.rl.objective.loss import (
    Importance,
    SampleLossRecord,
    entropy_threshold,
    policy_loss,
)
from core_engine.rl.objective.settings import Objective


@dataclass(frozen=True)
class TrainSample:
    prompt: list[int]
    response: list[int]
    behaviour: list[float]  # the engine's temperature-only log-probs of `response`
    advantage: float
    old: list[float] | None = None  # the trainer's log-probs at the rollout's version, if known
    # per token, pi_prox's version minus the oldest version its behaviour log-prob depends on
    # (`trainer.metrics.behaviour_lags`; None: all 0): the objective corrects where > 0
    lags: list[int] | None = None
    # per token, 1 where the policy sampled it (an episode's observations: 0; None: all 1)
    loss_mask: list[int] | None = None

    @property
    def trained_tokens(self) -> int:
        return len(self.response) if self.loss_mask is None else sum(self.loss_mask)

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
    importance: Importance = field(default_factory=Importance)
    autocast: torch.dtype | None = None
    objective: Objective = field(default_factory=Objective)


@dataclass
class UpdateResult:
    loss: float
    kl: float
    clip_fraction: float
    ratio_outside_fraction: float
    ratio_max: float
    micro_batches: int
    logprobs: list[list[float]]  # the trainer's log-probs, before this update
    # summed over the step's corrected tokens (`objective.importance_sums`)
    importance: dict[str, float] = field(default_factory=dict)
    entropy: float | None = None  # the trained tokens' mean entropy, before this update
    trained_tokens: int = 0
    # the policy loss's named token shares over the step (`LossOutput.fractions`)
    fractions: dict[str, float] = field(default_factory=dict)
    # what the loss did to each sample's tokens, in the order of `logprobs`
    token_records: list[SampleLossRecord] = field(default_factory=list)

    def importance_metrics(self) -> dict[str, float]:
        """On-policy corrected tokens' mean weight and over-cap share (`tis_*`); lagged
        tokens' raw pi_prox / mu mean and max and over-cap share (`is_*`)."""
        sums, metrics = self.importance, {}
        if sums.get("on_tokens"):
            metrics["tis_weight_mean"] = sums["on_weight_sum"] / sums["on_tokens"]
            metrics["tis_truncated_fraction"] = sums["on_over_cap"] / sums["on_tokens"]
        if sums.get("off_tokens"):
            metrics["is_weight_mean"] = sums["off_raw_sum"] / sums["off_tokens"]
            metrics["is_weight_max"] = sums["off_raw_max"]
            metrics["is_truncated_fraction"] = sums["off_over_cap"] / sums["off_tokens"]
        return metrics

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and all(
            math.isfinite(v) for row in self.logprobs for v in row
        )


def combine_updates(parts: Sequence[UpdateResult]) -> UpdateResult:
    """The statistics of one step computed in `parts` (each normalised by the whole step's
    trained tokens, e.g. the ranks' shares, in the batch's order): sums, maxima, log-probs
    joined, the entropy weighted by trained tokens."""
    importance: dict[str, float] = {}
    fractions: dict[str, float] = {}
    for part in parts:
        merge_importance(importance, part.importance)
        add_fractions(fractions, part.fractions)
    trained = sum(part.trained_tokens for part in parts)
    entropy = sum((p.entropy or 0.0) * p.trained_tokens for p in parts)
    return UpdateResult(
        loss=sum(part.loss for part in parts),
        kl=sum(part.kl for part in parts),
        clip_fraction=sum(part.clip_fraction for part in parts),
        ratio_outside_fraction=sum(part.ratio_outside_fraction for part in parts),
        ratio_max=max((part.ratio_max for part in parts), default=1.0),
        micro_batches=sum(part.micro_batches for part in parts),
        logprobs=[row for part in parts for row in part.logprobs],
        importance=importance,
        entropy=entropy / trained if trained else None,
        trained_tokens=trained,
        fractions=fractions,
        token_records=[record for part in parts for record in part.token_records],
    )


def add_fractions(into: dict[str, float], other: Mapping[str, float]) -> None:
    for key, value in other.items():
        into[key] = into.get(key, 0.0) + value


def step_totals(
    samples: Sequence[TrainSample], micro_batches: int, objective: Objective
) -> StepTotals:
    """The totals of a step made of `samples` alone, in `micro_batches` micro-batches."""
    tokens = float(sum(s.trained_tokens for s in samples)) or 1.0
    return StepTotals(tokens, len(samples) or 1, micro_batches or 1, objective.completion_length)


def merge_importance(into: dict[str, float], other: Mapping[str, float]) -> None:
    """`objective.importance_sums` of another micro-batch added to `into`: sums, and maxima
    for the ``_max`` keys."""
    for key, value in other.items():
        before = into.get(key, value if key.endswith("_max") else 0.0)
        into[key] = max(before, value) if key.endswith("_max") else before + value


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
    """`model` in training mode for the duration (e.g. LoRA dropout on); only for a policy no
    engine serves meanwhile."""
    model.train()
    try:
        yield
    finally:
        model.eval()


def accumulate_gradients(
    model: CausalLM,
    samples: Sequence[TrainSample],
    settings: UpdateSettings,
    reference: CausalLM | None = None,
    totals: StepTotals | None = None,
) -> UpdateResult:
    """Backward of the step's loss into `model`'s .grad, one micro-batch at a time.
    `reference`, the KL anchor, is a module tree of its own: nothing here changes what an
    engine serving `model` computes. `totals`: the whole step's when `samples` are a part of
    it (a rank's share); default, theirs. With `top_entropy_quantile` < 1 the step's entropy
    threshold comes from a scoring pass without gradient first."""
    micro_batches = pack_micro_batches([s.num_tokens for s in samples], settings.max_tokens)
    objective = settings.objective
    if totals is None:
        totals = step_totals(samples, len(micro_batches), objective)
    threshold = None
    if objective.top_entropy:
        threshold, acting = _entropy_threshold(model, samples, micro_batches, settings)
        totals = replace(totals, bonus_tokens=acting)
    sums = dict(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_outside_fraction=0.0)
    ratio_max = 1.0
    importance: dict[str, float] = {}
    fractions: dict[str, float] = {}
    logprobs: list[list[float]] = [[] for _ in samples]
    records: list[SampleLossRecord | None] = [None] * len(samples)
    entropy_sum, trained = 0.0, 0
    for indices in micro_batches:
        part = [samples[i] for i in indices]
        logp, entropies = _score(model, part, settings)
        current = _padded(logp)
        device, width = current.device, current.shape[1]
        for i, s, row in zip(indices, part, current.detach().tolist(), strict=True):
            logprobs[i] = row[: len(s.response)]
        # per sample, one Python row each, made into [n, T] tensors by one call apiece
        mask = _mask(part, width, device)
        entropy = _padded(entropies)
        entropy_sum += float((entropy.detach() * mask).sum())
        trained += sum(s.trained_tokens for s in part)
        ref = None
        if reference is not None and settings.kl_coef:
            with torch.no_grad():
                ref = _padded(_score(reference, part, settings)[0])
        proximal = current.detach()
        if any(s.old is not None for s in part):
            known = torch.tensor([s.old is not None for s in part], device=device)[:, None]
            old = _rows([s.old or [] for s in part], width, device)
            proximal = torch.where(known, old, proximal)
        lags = None
        if any(s.lags for s in part):
            lags = _rows([s.lags or [] for s in part], width, device, torch.long)
        out = policy_loss(
            current,
            proximal,
            _rows([s.behaviour for s in part], width, device),
            torch.tensor([s.advantage for s in part], device=device),
            mask,
            lags,
            settings.importance,
            settings.clip_eps,
            settings.kl_coef,
            ref,
            totals,
            objective,
            entropy,
            threshold,
        )
        out.loss.backward()
        sums["loss"] += float(out.loss.detach())
        sums["kl"] += out.kl
        sums["clip_fraction"] += out.clip_fraction
        sums["ratio_outside_fraction"] += out.ratio_outside_fraction
        ratio_max = max(ratio_max, out.ratio_max)
        merge_importance(importance, out.importance)
        add_fractions(fractions, out.fractions)
        lengths = [len(s.response) for s in part]
        for i, record in zip(indices, out.tokens.samples(lengths), strict=True):
            records[i] = record
    return UpdateResult(
        **sums,
        ratio_max=ratio_max,
        micro_batches=len(micro_batches),
        logprobs=logprobs,
        importance=importance,
        entropy=entropy_sum / trained if trained else None,
        trained_tokens=trained,
        fractions=fractions,
        token_records=[record for record in records if record is not None],
    )


def _entropy_threshold(
    model: CausalLM,
    samples: Sequence[TrainSample],
    micro_batches: Sequence[Sequence[int]],
    settings: UpdateSettings,
) -> tuple[torch.Tensor, float]:
    """The 80/20 rule's threshold over the whole step's trained tokens (`loss.entropy_threshold`)
    and how many trained tokens reach it (the entropy bonus's tokens)."""
    trained = []
    with torch.no_grad():
        for indices in micro_batches:
            part = [samples[i] for i in indices]
            entropy = _padded(_score(model, part, settings)[1])
            trained.append(entropy[_mask(part, entropy.shape[1], entropy.device)])
    entropies = torch.cat(trained)
    if not entropies.numel():
        return torch.tensor(0.0), 1.0
    threshold = entropy_threshold(entropies, settings.objective.top_entropy_quantile)
    return threshold, float((entropies >= threshold).sum()) or 1.0


def _mask(part: Sequence[TrainSample], width: int, device: torch.device) -> torch.Tensor:
    """[n, width]: the trained tokens of a micro-batch's samples."""
    loss_masks = [s.loss_mask or [1] * len(s.response) for s in part]
    return _rows(loss_masks, width, device, torch.bool)


def _score(model: CausalLM, part: Sequence[TrainSample], settings: UpdateSettings):
    device_type = model.lm_head.weight.device.type
    autocast = (
        torch.autocast(device_type, dtype=settings.autocast)
        if settings.autocast is not None
        else contextlib.nullcontext()
    )
    with autocast:
        return packed_response_scores(
            model,
            [s.prompt for s in part],
            [s.response for s in part],
            settings.temperature,
            settings.chunk_rows,
            settings.checkpointing and torch.is_grad_enabled(),
        )


def _rows(
    rows: Sequence[Sequence[float]],
    width: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """[len(rows), width] from rows of up to `width` values, zero-padded on the right."""
    return torch.tensor([[*row, *[0] * (width - len(row))] for row in rows], dtype=dtype).to(device)


def _padded(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    return pad_sequence(list(rows), batch_first=True)
