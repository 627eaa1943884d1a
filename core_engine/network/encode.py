"""Request prompts as token ids: refused by their characters before any tokenizing, then
tokenized in a worker thread, never on the event loop (2 MiB of text takes seconds)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from core_engine.network.errors import APIError
from core_engine.network.limits import ServerLimits
from core_engine.prompts import encode_prompt, render_prompt


async def completion_prompt_ids(
    tokenizer: Any, prompts: Sequence[str | list[int]], limits: ServerLimits, context: int
) -> list[list[int]]:
    """Token ids of each prompt (token-id prompts as they are)."""
    for prompt in prompts:
        if isinstance(prompt, str):
            limits.check_prompt_chars(len(prompt), context, "prompt")

    def encode_all() -> list[list[int]]:
        return [p if isinstance(p, list) else tokenizer.encode(p) for p in prompts]

    return await asyncio.to_thread(encode_all)


async def chat_prompt_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[dict[str, Any]],
    limits: ServerLimits,
    context: int,
) -> list[int]:
    """Token ids of the chat template applied to `messages`, offering `tools` (if any)."""
    limits.check_prompt_chars(_template_chars(messages, tools), context, "messages")
    return await asyncio.to_thread(_render_and_encode, tokenizer, messages, tools)


def _template_chars(messages: Sequence[Mapping[str, Any]], tools: Sequence[dict]) -> int:
    """Characters of what the template renders from the request: message texts, and tool
    calls and tool definitions as JSON."""
    structured = [tools, *(m["tool_calls"] for m in messages if "tool_calls" in m)]
    as_json = len(json.dumps(structured, ensure_ascii=False)) if any(structured) else 0
    return sum(len(m["content"]) for m in messages) + as_json


def _render_and_encode(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict[str, Any]]
) -> list[int]:
    try:
        text = render_prompt(tokenizer, messages, tools)
    except Exception as exc:  # no template, or the template rejects these messages
        raise APIError(
            400, f"cannot apply the chat template: {exc}", "invalid_messages", "messages"
        ) from exc
    return encode_prompt(tokenizer, text)
