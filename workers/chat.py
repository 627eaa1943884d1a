"""One Playground turn, run by a worker on the ``interactive`` queue (the UI process never
loads a model): the chosen saved version of a job answers a chat, after its weights were
checked against the checksum recorded for that version. Every input is re-checked here.

Returns plain JSON: the reply, or ``{"problem": ...}`` for anything the user can fix or must
know (e.g. "weights not kept" when a version's checkpoint was not retained).

The Playground's bounds live here too, torch-free, for the UI to offer settings that fit the
chosen model (`max_tokens_bounds`).
"""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core_engine.task import SamplingParams
from db import Repository, VersionNotFound
from workers.settings import Settings

MAX_TOKENS_LIMIT = 1024
DEFAULT_MAX_TOKENS = 64
MAX_TEMPERATURE = 10.0
MAX_CHAT_CHARS = 32_000
MAX_CHAT_MESSAGES = 400  # 200 exchanges: what one request renders and tokenizes


class ChatProblem(ValueError):
    """Why a turn cannot be answered (shown to the user)."""


def settings_problems(temperature: Any, max_tokens: Any, seed: Any, messages: int = 1) -> list[str]:
    """What is wrong with a turn's sampling settings and its number of ``messages`` (the
    system prompt, the history sent and the new one): the Playground's bounds, which the UI
    checks as it reads the form and the worker checks again."""
    problems = []
    if messages > MAX_CHAT_MESSAGES:
        problems.append(
            f"the chat has {messages} messages, more than {MAX_CHAT_MESSAGES}: clear it, or "
            "turn chat history off"
        )
    number = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    if not number or not 0 <= temperature <= MAX_TEMPERATURE:
        problems.append(f"temperature must be between 0 and {MAX_TEMPERATURE:g}")
    whole = isinstance(max_tokens, int) and not isinstance(max_tokens, bool)
    if not whole or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        problems.append(f"max tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        problems.append("seed must be a whole number >= 0")
    return problems


def checkpoint_context(checkpoint: str | Path | None) -> int | None:
    """The context length (tokens) a checkpoint's ``config.json`` states, read without
    loading the model; None when there is no readable checkpoint there. The engine may serve
    less (a sliding window): the worker fits every turn to the engine's own context."""
    if checkpoint is None:
        return None
    try:
        config = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    context = config.get("max_position_embeddings") if isinstance(config, dict) else None
    whole = isinstance(context, int) and not isinstance(context, bool)
    return context if whole and context > 1 else None


def max_tokens_bounds(context: int | None) -> tuple[int, int]:
    """The default and the largest max tokens for a model of ``context`` tokens (None:
    unknown): `DEFAULT_MAX_TOKENS`, or half the context where that is less (the other half
    is the prompt's), and at most the context less one prompt token."""
    if context is None:
        return DEFAULT_MAX_TOKENS, MAX_TOKENS_LIMIT
    largest = max(1, min(MAX_TOKENS_LIMIT, context - 1))
    return max(1, min(DEFAULT_MAX_TOKENS, context // 2)), largest


def check_request(messages: Any, temperature: Any, max_tokens: Any, seed: Any) -> SamplingParams:
    """The bounds the UI checks, checked again where the model runs; the turn's sampling."""
    if not isinstance(messages, list) or not messages:
        raise ChatProblem("messages: a non-empty list is required")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ChatProblem("messages: each needs a role of system, user or assistant")
        if not isinstance(m.get("content"), str):
            raise ChatProblem("messages: each needs a text content")
    if messages[-1]["role"] != "user":
        raise ChatProblem("messages: the last one must be the user's")
    if sum(len(m["content"]) for m in messages) > MAX_CHAT_CHARS:
        raise ChatProblem(f"the chat is longer than {MAX_CHAT_CHARS} characters: clear it")
    problems = settings_problems(temperature, max_tokens, seed, len(messages))
    if problems:
        raise ChatProblem("; ".join(problems))
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    problem = params.validation_error()
    if problem:
        raise ChatProblem(problem)
    return params


def fit_to_context(
    tokenizer: Any, messages: list[dict[str, str]], max_seq_len: int, max_tokens: int
) -> tuple[list[int], int, int]:
    """The prompt ids of ``messages`` with the oldest turns (after any system prompt) left
    out until the prompt and ``max_tokens`` fit in ``max_seq_len``; how many messages were
    left out; and the new tokens there is room for: ``max_tokens``, or fewer where even the
    newest message alone leaves less room. `ChatProblem` if it leaves no room at all.

    A kept chat restarts at a user turn, and keeping fewer turns never makes the prompt
    longer: the fewest turns to leave out are found by bisection, the whole chat first. The
    chat is rendered and tokenized at most log2(its user turns) + 2 times, each in time
    linear in its length (at most `MAX_CHAT_MESSAGES` messages: a factor of at most 10)."""
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = messages[len(system) :]
    starts = [0, *(i for i, m in enumerate(turns) if i and m["role"] == "user")]
    prompts: dict[int, list[int]] = {}  # index in starts -> prompt ids when kept from there

    def prompt(index: int) -> list[int]:
        if index not in prompts:
            prompts[index] = _prompt_ids(tokenizer, system + turns[starts[index] :])
        return prompts[index]

    # the first start whose prompt fits is in [first, last]; the last: the newest turn alone
    first, last = 0, len(starts) - 1
    while first < last:
        middle = (first + last) // 2 if prompts else first
        if len(prompt(middle)) + max_tokens <= max_seq_len:
            last = middle
        else:
            first = middle + 1
    ids, dropped = prompt(first), starts[first]
    if len(ids) + max_tokens <= max_seq_len:
        return ids, dropped, max_tokens
    if len(ids) >= max_seq_len:
        raise ChatProblem(
            f"the message takes {len(ids)} tokens and leaves no room for a reply in the "
            f"model's {max_seq_len}-token context: shorten it"
        )
    return ids, dropped, max_seq_len - len(ids)


def _prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    from core_engine.prompts import chat_prompt_ids

    try:
        return chat_prompt_ids(tokenizer, messages)
    except Exception as exc:  # no template, or it rejects these messages
        raise ChatProblem(f"cannot apply the chat template: {exc}") from exc


def chat_reply(
    repo: Repository,
    settings: Settings,
    job_id: int,
    version: int,
    messages: list[dict[str, str]],
    temperature: float,
    max_tokens: int,
    seed: int | None,
    cancelled: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """The version's reply to ``messages`` (rendered with the checkpoint's chat template;
    the oldest turns left out, and counted in ``trimmed``, where the chat outgrew the
    model's context; ``max_tokens`` lowered, and said in ``max_tokens``, where the newest
    message leaves less room), with the log-probs of the sampled distribution and at
    temperature 1 (``output_temp_logprobs``: what greedy decoding can be coloured by).
    Generation stops at the first decode step after ``cancelled()`` says so (the reply then
    ends ``abort``, error ``cancelled``)."""
    from workers.engines import (
        ChecksumMismatch,
        EngineMemoryError,
        WeightsNotKept,
        engine_cache,
        saved_version,
    )

    try:
        params = check_request(messages, temperature, max_tokens, seed)
        info = saved_version(repo, job_id, version)
        engine, _ = engine_cache(settings).verified(
            info.checkpoint_path, info.version, info.weights_checksum
        )
        ids, trimmed, room = fit_to_context(
            engine.tokenizer, messages, engine.max_seq_len, max_tokens
        )
        params = dataclasses.replace(params, max_tokens=room)
        result = engine.run_batch([ids], params, cancelled=cancelled)[0]
    except VersionNotFound:
        return {"problem": f"job {job_id} has no saved version {version}"}
    except (ChatProblem, WeightsNotKept, ChecksumMismatch, EngineMemoryError) as exc:
        return {"problem": str(exc)}
    error = result.error
    return {
        "text": result.text or "",
        "output_ids": list(result.output_ids),
        "output_logprobs": list(result.output_logprobs),
        "output_temp_logprobs": list(result.output_temp_logprobs),
        "finish_reason": result.finish_reason.value,
        "error": None if error is None else {"code": error.code.value, "message": error.message},
        "policy_version": result.policy_version,
        "prompt_tokens": len(ids),
        "trimmed": trimmed,
        "max_tokens": room,
        "context": engine.max_seq_len,
        "checkpoint": info.checkpoint_path,
    }
