"""Chat prompts as the engine sees them: the chat template with the generation prompt, then
token ids without special tokens added again (the template already holds them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_prompt(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """The chat template with the generation prompt: the text the engine is given."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
    )


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """`messages` -> the token ids the engine generates after."""
    return encode_prompt(tokenizer, render_prompt(tokenizer, messages))
