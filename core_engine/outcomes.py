"""Rules that decide a request's outcome: admission checks and stop conditions."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from core_engine.detokenize import StopScan
from core_engine.task import ErrorCode, FinishReason, Task, TaskError

log = logging.getLogger(__name__)


def admission_error(
    task: Task,
    vocab_size: int,
    max_seq_len: int,
    can_ever_fit: Callable[[int], bool],
    has_tokenizer: bool,
) -> TaskError | None:
    """Why a request can never run, or None. Checked before it takes any resource."""
    prompt, p = task.prompt_ids, task.params
    if not prompt:
        return TaskError(ErrorCode.EMPTY_PROMPT, "the prompt has no tokens")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        return TaskError(
            ErrorCode.INVALID_TOKEN_ID,
            f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})",
        )
    problem = p.validation_error()
    if problem is None and p.stop and not has_tokenizer:
        problem = "stop strings need a tokenizer; this engine has none"
    if problem is not None:
        return TaskError(ErrorCode.INVALID_SAMPLING_PARAMS, problem)
    if len(prompt) >= max_seq_len:
        return TaskError(
            ErrorCode.PROMPT_TOO_LONG,
            f"prompt of {len(prompt)} tokens leaves no room in the {max_seq_len}-token context",
        )
    if not can_ever_fit(len(prompt) + 1):
        return TaskError(
            ErrorCode.KV_EXHAUSTED, f"a {len(prompt)}-token prompt can never fit the KV pool"
        )
    return None


def stop_reason(
    task: Task, eos_token_ids: Collection[int], max_seq_len: int, tokenizer=None
) -> FinishReason | None:
    """`stop` (EOS, stop token id, stop string; wins on the same token) or `length`, or None.
    Records `task.stop_reason`, and trims `task.text` at a matched stop string. Called once
    per generated token: the stop-string search costs the same at every token."""
    token, p = task.output_ids[-1], task.params
    if (token in eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
        task.stop_reason = token
        return FinishReason.STOP
    if p.stop:
        if task.stop_scan is None:
            task.stop_scan = StopScan(tokenizer, p.stop)
        hit = task.stop_scan.push(token)
        if hit is not None:
            task.text, task.stop_reason = hit
            return FinishReason.STOP
    if len(task.output_ids) >= p.max_tokens or task.num_tokens >= max_seq_len:
        return FinishReason.LENGTH
    return None


def decode_text(tokenizer: Any, token_ids: Sequence[int]) -> str | None:
    """The text of a finished request's tokens, or None (logged) when the tokenizer cannot
    decode them: a request's text never fails its finish."""
    try:
        return tokenizer.decode(token_ids, skip_special_tokens=True)
    except Exception:
        log.exception("cannot decode the output of a finished request")
        return None
