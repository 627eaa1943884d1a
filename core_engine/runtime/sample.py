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

from core_engine.runtime.uniforms import Uniforms, take_each
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
    uniforms: Sequence[Uniforms | None],
    return_logprobs: bool = True,
) -> SampleOutput:
    """Sample one token per row of fp32 `logits` [B, vocab] under each row's parameters.

    A row that would poison the step (NaN/inf logits, tempered logits that overflow, a token
    outside the vocabulary) is computed on neutral values and flagged in `finite`; the other
    rows are unaffected. `uniforms[i]` is row i's random stream (None or unused when greedy)."""
    device, vocab = logits.device, logits.shape[-1]
    drawn = [i for i, p in enumerate(params) if not p.greedy]
    temps = [1.0 if p.greedy else p.temperature for p in params]
    scaled = logits  # T = 1 on every row (greedy counts as 1): no division, the very same values
    finite = finite_rows(logits)
    if any(t != 1.0 for t in temps):
        scaled = logits / torch.tensor(temps, device=device, dtype=logits.dtype)[:, None]
        finite &= finite_rows(scaled)
    if not bool(finite.all()):
        logits = torch.where(finite[:, None], logits, torch.zeros_like(logits))
        scaled = torch.where(finite[:, None], scaled, torch.zeros_like(scaled))
    if len(drawn) < len(params):
        tokens = logits.argmax(dim=-1)
    else:
        tokens = torch.empty(len(params), dtype=torch.int64, device=device)
    if not drawn and not return_logprobs:
        return SampleOutput(tokens.tolist(), [], [], finite.tolist())
    temp_logp = scaled.log_softmax(dim=-1)
    processed_logp = temp_logp
    if any(params[i].top_k > 0 or params[i].top_p < 1 for i in drawn):
        top_k = torch.tensor([min(p.top_k, vocab) for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=logits.dtype)
        mask = truncation_mask(scaled, top_k, top_p)
        processed_logp = scaled.masked_fill(mask, float("-inf")).log_softmax(dim=-1)
    if drawn:
        rows = torch.tensor(drawn, device=device)
        rows_logp = processed_logp if len(drawn) == len(params) else processed_logp[rows]
        tokens[rows] = draw(rows_logp, [uniforms[i] for i in drawn])
    in_vocab = (tokens >= 0) & (tokens < vocab)
    if not bool(in_vocab.all()):
        finite &= in_vocab
        tokens = torch.where(in_vocab, tokens, torch.zeros_like(tokens))
    token_list = tokens.tolist()
    if not return_logprobs:
        return SampleOutput(token_list, [], [], finite.tolist())
    chosen_temp = temp_logp.gather(1, tokens[:, None]).squeeze(1)
    chosen = torch.zeros_like(chosen_temp)  # greedy: a point mass
    if drawn:
        chosen[rows] = processed_logp.gather(1, tokens[:, None]).squeeze(1)[rows]
    return SampleOutput(token_list, chosen.tolist(), chosen_temp.tolist(), finite.tolist())


def finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """Rows free of NaN and +-inf: exactly those whose max and min are finite (NaN propagates
    through both). Two reductions instead of elementwise masks over the whole vocabulary."""
    return logits.amax(dim=-1).isfinite() & logits.amin(dim=-1).isfinite()


def draw(logp: torch.Tensor, uniforms: Sequence[Uniforms]) -> torch.Tensor:
    """One token per row of normalised log-probs: the row's CDF (accumulated in fp64) inverted
    at the next number of the row's own uniform stream. `torch.multinomial` spends a random
    number per vocabulary entry instead. Tokens of zero probability are never drawn."""
    cdf = logp.exp().cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1]
    u = take_each(uniforms, logp.device)
    below_total = torch.minimum(u * total, total.nextafter(torch.zeros_like(total)))
    return torch.searchsorted(cdf, below_total[:, None], right=True).squeeze(1)
