"""GRPO: group-normalised advantages and the clipped, token-averaged policy loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [B, G] -> advantages (r - mean) / (population std + eps), and a [B] mask of
    groups whose rewards all agree (zero variance: no learning signal, advantage exactly 0)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    zero_variance = std.squeeze(1) < eps
    advantages = torch.where(std < eps, torch.zeros_like(rewards), (rewards - mean) / (std + eps))
    return advantages, zero_variance


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor
    kl: float
    clip_fraction: float
    ratio_max: float


def grpo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> LossOutput:
    """Token-level PPO-clip objective with importance ratio pi_theta / pi_behaviour.

    All tensors are [N, T] over response positions (`mask` selects real tokens), except
    `advantages` [N]. The optional KL to a frozen reference uses the k3 estimator
    exp(ref - logp) - (ref - logp) - 1. Averaged over all response tokens of the batch.
    """
    mask = mask.float()
    tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logp - behaviour_logp)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    loss = -(surrogate * mask).sum() / tokens
    kl = torch.zeros(())
    if ref_logp is not None and kl_coef:
        delta = ref_logp - logp
        kl = ((torch.exp(delta) - delta - 1) * mask).sum() / tokens
        loss = loss + kl_coef * kl
    clipped = ((ratio - 1).abs() > clip_eps).float()
    return LossOutput(
        loss=loss,
        kl=float(kl.detach()),
        clip_fraction=float((clipped * mask).sum() / tokens),
        ratio_max=float((ratio.detach() * mask).max()) if mask.any() else 1.0,
    )


def response_logprobs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    temperature: float,
    pad_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log-softmax(logits / T) of each response token under `model` (teacher forcing).
    Returns ([N, T_resp] log-probs, [N, T_resp] mask), right-padded."""
    sequences = [p + r for p, r in zip(prompt_ids, response_ids, strict=True)]
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
    ids = ids.to(next(model.parameters()).device)
    logp = (model(ids)[:, :-1] / (temperature or 1.0)).log_softmax(-1)  # greedy: T = 1
    token_logp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    resp_width = max(len(r) for r in response_ids) or 1
    mask = torch.zeros(len(sequences), resp_width, dtype=torch.bool, device=ids.device)
    rows = []
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        row = token_logp[i, len(p) - 1 : len(p) - 1 + len(r)]
        rows.append(torch.nn.functional.pad(row, (0, resp_width - len(r))))
        mask[i, : len(r)] = True
    return torch.stack(rows), mask
