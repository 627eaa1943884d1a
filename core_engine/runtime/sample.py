"""Token sampling with the log-probs a trainer needs.

Order of transforms: temperature, then top-k, then top-p (on the tempered distribution).
For every token two log-probs are returned:
- `logprobs`: the distribution the token was actually drawn from (after truncation; 0.0 for
  greedy, a point mass);
- `temp_logprobs`: log-softmax(logits / T) over the full vocabulary (T = 1 for greedy), which a
  trainer's full-vocabulary forward can reproduce exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core_engine.task import SamplingParams


@dataclass(frozen=True)
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float]
    temp_logprobs: list[float]
    finite: list[bool]  # False where the row's logits held NaN/inf (its token is meaningless)


def truncation_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where a token is removed by top-k (k > 0) or top-p (p < 1); never the best token."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(scaled.shape[-1], device=scaled.device)[None, :]
    remove = (top_k[:, None] > 0) & (ranks >= top_k[:, None])
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove |= mass_before >= top_p[:, None]
    remove[:, 0] = False
    return remove.scatter(-1, order, remove)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    return_logprobs: bool = True,
) -> SampleOutput:
    """Sample one token per row of fp32 `logits` [B, vocab] under each row's parameters."""
    finite = torch.isfinite(logits).all(dim=-1)
    if not bool(finite.all()):
        logits = torch.where(finite[:, None], logits, torch.zeros_like(logits))
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device, dtype=logits.dtype)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    temp_logp = scaled.log_softmax(dim=-1)
    processed_logp = temp_logp
    if any(p.top_k > 0 or p.top_p < 1 for p in params if not p.greedy):
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=logits.dtype)
        mask = truncation_mask(scaled, top_k, top_p)
        processed_logp = scaled.masked_fill(mask, float("-inf")).log_softmax(dim=-1)

    tokens = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        probs = processed_logp.exp()
        for i, (p, gen) in enumerate(zip(params, generators, strict=True)):
            if not p.greedy:
                tokens[i] = torch.multinomial(probs[i], 1, generator=gen)[0]
    token_list = tokens.tolist()
    if not return_logprobs:
        return SampleOutput(token_list, [], [], finite.tolist())
    rows = torch.arange(len(token_list), device=device)
    chosen_temp = temp_logp[rows, tokens]
    chosen = torch.where(greedy, torch.zeros_like(chosen_temp), processed_logp[rows, tokens])
    return SampleOutput(token_list, chosen.tolist(), chosen_temp.tolist(), finite.tolist())
