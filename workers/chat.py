"""One Playground turn, run by a worker on the ``interactive`` queue (the UI process never
loads a model): the chosen saved version of a job answers a chat, after its weights were
checked against the checksum recorded for that version. Every input is re-checked here.

Returns plain JSON: the reply, or ``{"problem": ...}`` for anything the user can fix or must
know (e.g. "weights not kept" when a version's checkpoint was not retained).
"""

from typing import Any

from core_engine.task import SamplingParams
from db import Repository, VersionNotFound
from workers.settings import Settings

MAX_TOKENS_LIMIT = 1024
MAX_TEMPERATURE = 10.0
MAX_CHAT_CHARS = 32_000


class ChatProblem(ValueError):
    """Why a turn cannot be answered (shown to the user)."""


def settings_problems(temperature: Any, max_tokens: Any, seed: Any) -> list[str]:
    """What is wrong with a turn's sampling settings: the Playground's bounds, which the UI
    checks as it reads the form and the worker checks again."""
    problems = []
    number = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    if not number or not 0 <= temperature <= MAX_TEMPERATURE:
        problems.append(f"temperature must be between 0 and {MAX_TEMPERATURE:g}")
    whole = isinstance(max_tokens, int) and not isinstance(max_tokens, bool)
    if not whole or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        problems.append(f"max tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        problems.append("seed must be a whole number >= 0")
    return problems


def check_request(messages: Any, temperature: Any, max_tokens: Any, seed: Any) -> SamplingParams:
    """The bounds the UI checks, checked again where the model runs; the turn's sampling."""
    if not isinstance(messages, list) or not messages:
        raise ChatProblem("messages: a non-empty list is required")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ChatProblem("messages: each needs a role of system, user or assistant")
        if not isinstance(m.get("content"), str):
            raise ChatProblem("messages: each needs a text content")
    if sum(len(m["content"]) for m in messages) > MAX_CHAT_CHARS:
        raise ChatProblem(f"the chat is longer than {MAX_CHAT_CHARS} characters: clear it")
    problems = settings_problems(temperature, max_tokens, seed)
    if problems:
        raise ChatProblem("; ".join(problems))
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    problem = params.validation_error()
    if problem:
        raise ChatProblem(problem)
    return params


def fit_to_context(
    tokenizer: Any, messages: list[dict[str, str]], max_seq_len: int, max_tokens: int
) -> tuple[list[int], int]:
    """The prompt ids of ``messages`` with the oldest turns (after any system prompt) left
    out until the prompt and ``max_tokens`` fit in ``max_seq_len``; and how many messages
    were left out. `ChatProblem` if even the newest message alone does not fit."""
    from core_engine.prompts import encode_prompt, render_prompt

    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = messages[len(system) :]
    for dropped in range(len(turns)):
        kept = system + turns[dropped:]
        if dropped and kept[len(system)]["role"] != "user":
            continue  # a conversation restarts at a user turn
        try:
            ids = encode_prompt(tokenizer, render_prompt(tokenizer, kept))
        except Exception as exc:  # no template, or it rejects these messages
            raise ChatProblem(f"cannot apply the chat template: {exc}") from exc
        if len(ids) + max_tokens <= max_seq_len:
            return ids, dropped
    raise ChatProblem(
        f"the message and {max_tokens} new tokens do not fit the model's {max_seq_len}-token "
        "context: shorten it or lower max tokens"
    )


def chat_reply(
    repo: Repository,
    settings: Settings,
    job_id: int,
    version: int,
    messages: list[dict[str, str]],
    temperature: float,
    max_tokens: int,
    seed: int | None,
) -> dict[str, Any]:
    """The version's reply to ``messages`` (rendered with the checkpoint's chat template;
    the oldest turns left out, and counted in ``trimmed``, where the chat outgrew the
    model's context)."""
    from workers.engines import ChecksumMismatch, WeightsNotKept, engine_cache, saved_version

    try:
        params = check_request(messages, temperature, max_tokens, seed)
        info = saved_version(repo, job_id, version)
        engine, _ = engine_cache(settings).verified(
            info.checkpoint_path, info.version, info.weights_checksum
        )
        ids, trimmed = fit_to_context(engine.tokenizer, messages, engine.max_seq_len, max_tokens)
        result = engine.run_batch([ids], params)[0]
    except VersionNotFound:
        return {"problem": f"job {job_id} has no saved version {version}"}
    except (ChatProblem, WeightsNotKept, ChecksumMismatch) as exc:
        return {"problem": str(exc)}
    error = result.error
    return {
        "text": result.text or "",
        "output_ids": list(result.output_ids),
        "output_logprobs": list(result.output_logprobs),
        "finish_reason": result.finish_reason.value,
        "error": None if error is None else {"code": error.code.value, "message": error.message},
        "policy_version": result.policy_version,
        "prompt_tokens": len(ids),
        "trimmed": trimmed,
        "context": engine.max_seq_len,
        "checkpoint": info.checkpoint_path,
    }
