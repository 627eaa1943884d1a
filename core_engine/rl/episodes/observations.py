"""The tokens an episode appends after an assistant turn: the chat template's turn end, the
observation and the next generation prompt, with the observation's text encoded as plain text.

The template's own text is encoded as the template means it (its special tokens are special);
what the environment wrote is never parsed for special tokens, so an observation holding
``<|im_start|>`` is those characters' ordinary tokens, never a turn it injects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from core_engine.prompts import encode_prompt, turn_bridge

_MARK = "\u2063observation-{}\u2063"
_MARKS = re.compile("\u2063observation-(\\d+)\u2063")


def observation_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    observation: Sequence[Mapping[str, Any]],
    tools: Sequence[dict] | None,
    stop: int | str | None,
) -> list[int]:
    """Token ids after an assistant turn ending on `stop` (a sampled end token already stands
    for its text) in a conversation opened by `messages`: the template's text around each
    observation message, and each message's content as plain text. ValueError for a template
    that does not show each observation message's content exactly once, in order."""
    marked = [{**message, "content": _MARK.format(i)} for i, message in enumerate(observation)]
    end, bridge = turn_bridge(tokenizer, messages, marked, tools)
    if isinstance(stop, int):
        sampled = tokenizer.decode([stop], skip_special_tokens=False)
        end = end[len(sampled) :] if end.startswith(sampled) else end
    pieces = _MARKS.split(end + bridge)  # template, index, template, index, ..., template
    if [int(i) for i in pieces[1::2]] != list(range(len(observation))):
        raise ValueError(
            "the chat template does not show each observation message's content once, in order"
        )
    ids = encode_prompt(tokenizer, pieces[0])
    for message, template in zip(observation, pieces[2::2], strict=True):
        ids += _plain_ids(tokenizer, message["content"]) + encode_prompt(tokenizer, template)
    return ids


def _plain_ids(tokenizer: Any, text: str) -> list[int]:
    """`text`'s token ids with no special token recognised in it."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
