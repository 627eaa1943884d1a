"""Chat prompts as the engine sees them: the chat template with the generation prompt, then
token ids without special tokens added again (the template already holds them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_prompt(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict] | None = None
) -> str:
    """The chat template with the generation prompt: the text the engine is given (with
    `tools`, their JSON schemas as the checkpoint's own template presents them)."""
    extra = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=True, **extra
    )


def turn_bridge(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    observation: Sequence[Mapping[str, Any]],
    tools: Sequence[dict] | None = None,
) -> tuple[str, str]:
    """What the chat template puts after an assistant turn's content and before the next
    one's, as (turn end, observation + next generation prompt): the text an episode appends
    to its sampled tokens, so earlier turns are never rendered again. Refuses a template that
    renders earlier turns differently once more follow."""
    extra = {"tools": list(tools)} if tools else {}
    turn = [*map(dict, messages), {"role": "assistant", "content": _PLACEHOLDER}]
    before = tokenizer.apply_chat_template(turn, tokenize=False, **extra)
    after = tokenizer.apply_chat_template(
        [*turn, *map(dict, observation)], tokenize=False, add_generation_prompt=True, **extra
    )
    if not after.startswith(before) or _PLACEHOLDER not in before:
        raise ValueError("the chat template renders an assistant turn differently once more follow")
    return before[before.rindex(_PLACEHOLDER) + len(_PLACEHOLDER) :], after[len(before) :]


_PLACEHOLDER = "\u2063assistant-turn\u2063"


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """`messages` -> the token ids the engine generates after."""
    return encode_prompt(tokenizer, render_prompt(tokenizer, messages))
