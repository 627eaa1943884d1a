"""Token log-probs for training: samples packed as token trees (a prompt computed once for all
its responses), the LM head only where a response token is predicted, and a log-softmax that
never holds more than `chunk_rows` x vocabulary at once, in the forward and in the backward."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core_engine.model import CausalLM
from core_engine.model.attention import PackedLayout


class _SelectiveLogSoftmax(torch.autograd.Function):
    """log_softmax(hidden @ weight.T / temperature)[row, target] by chunks of rows, and each
    row's entropy H = -sum(p log p), from the chunk's log-probs, which replace its logits in
    place: one pass more over what the forward holds anyway. The entropy has a gradient (an
    entropy bonus): dH / dlogit_k = -p_k (log p_k + H), computed only when a loss uses it.

    The backward recomputes each chunk's logits instead of keeping them: the vocabulary-wide
    tensors alive at any time are [chunk_rows, vocab] (fp32), and the one temporary
    `torch.logsumexp` takes too."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_rows):
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(out)
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            logits = _chunk_logits(hidden[rows], weight, temperature)
            logp = logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))  # in place
            out[rows] = logp.gather(1, targets[rows, None]).squeeze(1)
            entropy[rows] = -logp.exp().mul_(logp).sum(-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, grad_entropy):
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        if grad_out is None:
            grad_out = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            h = hidden[rows]
            logits = _chunk_logits(h, weight, ctx.temperature)
            if grad_entropy is not None:
                logp = logits.log_softmax(-1)
                p = logp.exp()
                entropy = -(p * logp).sum(-1, keepdim=True)
                scale = -grad_entropy[rows, None] / ctx.temperature
                entropy_term = p.mul_(logp.add_(entropy)).mul_(scale)  # -p (log p + H) / T
            # d logp[target] / d logits = onehot(target) - softmax, scaled by 1 / T.
            grad_logits = logits.softmax(-1)
            grad_logits.neg_().scatter_add_(
                1, targets[rows, None], torch.ones_like(grad_logits[:, :1])
            )
            grad_logits.mul_(grad_out[rows, None] / ctx.temperature)
            if grad_entropy is not None:
                grad_logits.add_(entropy_term)
            if grad_hidden is not None:
                grad_hidden[rows] = (grad_logits @ weight.float()).to(hidden.dtype)
            if grad_weight is not None:  # accumulated in place: no second [vocab, hidden]
                grad_weight.addmm_(grad_logits.T.to(weight.dtype), h.to(weight.dtype))
        return grad_hidden, grad_weight, None, None, None


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits of a chunk of rows, also under autocast."""
    with torch.autocast(hidden.device.type, enabled=False):
        return (hidden.float() @ weight.float().T) / temperature


def selective_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] log-probs of `targets` [N] under logits `hidden` [N, H] @ `weight` [V, H]^T / T,
    and [N] entropies of those distributions."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return _SelectiveLogSoftmax.apply(hidden, weight, targets, temperature or 1.0, chunk_rows)


def packed_response_logprobs(
    model: CausalLM,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    temperature: float,
    chunk_rows: int = 256,
    checkpointing: bool = False,
) -> list[torch.Tensor]:
    """log-softmax(logits / T) of every response token (teacher forcing), one [len(response)]
    tensor per sample. The samples are packed into one padding-free sequence; greedy
    (T = 0) scores at T = 1."""
    args = (model, prompt_ids, response_ids, temperature, chunk_rows, checkpointing)
    return packed_response_scores(*args)[0]


def packed_response_scores(
    model: CausalLM,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    temperature: float,
    chunk_rows: int = 256,
    checkpointing: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`packed_response_logprobs`, and the entropy of the distribution (at T) each response
    token was predicted from, per sample."""
    if not all(prompt_ids):
        raise ValueError("every sample needs a non-empty prompt to be scored")
    device = model.lm_head.weight.device
    ids, layout, index, targets = _pack_trees(prompt_ids, response_ids, device)
    hidden = model.hidden_states_packed(ids, layout, checkpointing)
    logp, entropy = selective_logprobs(
        hidden[index], model.lm_head.weight, targets, temperature, chunk_rows
    )
    lengths = [len(r) for r in response_ids]
    return list(logp.split(lengths)), list(entropy.split(lengths))


def _pack_trees(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    device: torch.device,
) -> tuple[torch.Tensor, PackedLayout, torch.Tensor, torch.Tensor]:
    """The samples packed as token trees: each distinct prompt once, followed by the inputs
    of every response to it (a response's last token is a target only, never an input).
    Returns the packed ids, their layout, the packed row that predicts each response token
    (sample after sample; a prompt's last row predicts every first response token) and the
    response tokens themselves."""
    trees: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompt_ids):
        trees.setdefault(tuple(prompt), []).append(i)
    tokens: list[int] = []
    rows: list[list[int]] = [[] for _ in response_ids]
    shapes: list[tuple[int, list[int]]] = []  # (prompt length, its responses' input lengths)
    for prompt, members in trees.items():
        tokens.extend(prompt)
        last_prompt_row = len(tokens) - 1
        shapes.append((len(prompt), []))
        for i in members:
            inputs = list(response_ids[i][:-1])
            predictors = [last_prompt_row, *range(len(tokens), len(tokens) + len(inputs))]
            rows[i] = predictors[: len(response_ids[i])]
            tokens.extend(inputs)
            shapes[-1][1].append(len(inputs))
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    index = torch.tensor([r for sample in rows for r in sample], dtype=torch.long, device=device)
    targets = [t for response in response_ids for t in response]
    targets = torch.tensor(targets, dtype=torch.long, device=device)
    return ids, PackedLayout.from_trees(shapes, device), index, targets
