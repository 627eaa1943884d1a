"""What an episode's record may hold: the one contract between the episode runner, the
environment sandbox and the store.

The runner (`core_engine.rl.episodes.runner`) keeps every episode within it, ending one that
would break it with an error finish, never a failed job; the sandbox child refuses an
environment's messages that break it (`env_error`); the store refuses a record that breaks it
(`db.repository.batch_rows`, which cannot import this module: it holds the same two numbers,
and tests/db/test_episode_store_contract.py checks that they agree).

- text (messages, a segment's text) has no NUL character (PostgreSQL's text cannot hold one)
  and no lone surrogate (not UTF-8);
- a segment's text (an assistant turn's, or an observation's messages joined by newlines) is
  at most `MAX_SEGMENT_TEXT` characters, an episode at most `MAX_SEGMENTS` segments;
- a segment is plain JSON: no NaN or infinity (a tool call's ``1e999``), which PostgreSQL's
  JSON refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

MAX_SEGMENTS = 1024
MAX_SEGMENT_TEXT = 65_536


def text_problem(text: str, what: str) -> str | None:
    """Why `text` cannot be stored (a NUL character, a lone surrogate), or None."""
    if "\x00" in text:
        return f"{what} contains a NUL character (at {text.index(chr(0))})"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{what} contains a lone surrogate (at {exc.start}), which is not UTF-8"
    return None


def observation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of an observation's segment: its messages' contents joined by newlines."""
    return "\n".join(str(m.get("content", "")) for m in messages)


def messages_problem(messages: Sequence[Mapping[str, Any]], what: str) -> str | None:
    """Why these messages cannot be stored (their texts), or None."""
    for i, message in enumerate(messages):
        content = message.get("content")
        problem = text_problem(content, f"{what} message {i}") if isinstance(content, str) else None
        if problem is not None:
            return problem
    return None


def observation_problem(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """Why an observation cannot be stored (its texts, its segment's length), or None."""
    problem = messages_problem(messages, "the observation's")
    if problem is None and len(text := observation_text(messages)) > MAX_SEGMENT_TEXT:
        problem = (
            f"the observation is {len(text)} characters, more than the {MAX_SEGMENT_TEXT} "
            "an episode's segment holds"
        )
    return problem


def segment_problem(segment: Mapping[str, Any], index: int) -> str | None:
    """Why segment `index` of an episode cannot be stored, or None."""
    if index >= MAX_SEGMENTS:
        return f"the episode has more than {MAX_SEGMENTS} segments"
    what = f"segment {index} ({segment.get('role')})"
    text = str(segment.get("text", ""))
    if len(text) > MAX_SEGMENT_TEXT:
        return f"{what} text is {len(text)} characters, more than {MAX_SEGMENT_TEXT}"
    problem = text_problem(text, f"{what} text")
    if problem is not None:
        return problem
    try:
        json.dumps(segment, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        return f"{what} is not plain JSON: {exc}"
    return None
