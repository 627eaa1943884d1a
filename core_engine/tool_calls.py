"""Tool calls in the format Hermes, Qwen2.5 and Qwen3 checkpoints write: a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`, possibly several
per turn, possibly with text around them.

The parser is strict and bounded, and never raises on model output: whatever is wrong (an
unclosed or nested tag, a body over the size bound, JSON that is not a call object, nesting
deeper than `MAX_JSON_DEPTH`, an unknown tool) comes back as `ParsedTurn.error`. No torch: the
RL rollouts and the HTTP server both import it.

Reasoning is not acting: text between `<think>` and `</think>` (Qwen3's and DeepSeek-R1's
reasoning block; to the end of the turn when it is never closed) is reasoning, where a
`<tool_call>` is text the model thought about, never a call, as vLLM's reasoning parsers
separate reasoning from the content its tool parsers read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MAX_JSON_DEPTH = 32  # nesting of arrays and objects in a call, the call object included

# The JSON name of each type `json.loads` returns, for error messages.
_JSON_TYPES = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_json(self, call_id: str) -> dict[str, Any]:
        """OpenAI's shape of the call, its arguments as a JSON string."""
        arguments = json.dumps(self.arguments, ensure_ascii=False)
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }


@dataclass(frozen=True)
class ParsedTurn:
    content: str  # the text outside the tool-call blocks, stripped (all the text on an error)
    calls: list[ToolCall]
    error: str | None  # why the calls could not be parsed (then `calls` is empty)


class _Refused(ValueError):
    """A call (or its arguments) that is not what the format allows; the message says why."""


def parse_tool_calls(
    text: str,
    *,
    max_calls: int = 8,
    max_call_chars: int = 16_384,
    names: Collection[str] | None = None,
) -> ParsedTurn:
    """The tool calls of an assistant turn and the text around them; `names`: the tools that
    may be called (any name when None). Every call must be well formed, or none is taken."""
    try:
        content, calls = _split(text, max_calls, max_call_chars, names)
    except _Refused as exc:
        return ParsedTurn(content=text.strip(), calls=[], error=str(exc))
    return ParsedTurn(content=content.strip(), calls=calls, error=None)


def parse_arguments(text: str) -> dict[str, Any]:
    """A call's arguments given as a JSON string (as OpenAI clients send them): the object it
    holds. Raises ValueError saying what is wrong."""
    arguments = _decode(text)
    if not isinstance(arguments, dict):
        raise _Refused(f"arguments must be a JSON object, got {_json_type(arguments)}")
    return arguments


def _split(
    text: str, max_calls: int, max_call_chars: int, names: Collection[str] | None
) -> tuple[str, list[ToolCall]]:
    outside: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        think = text.find(THINK_OPEN, pos, len(text) if start < 0 else start)
        if think >= 0:  # reasoning up to its end (module docstring): text, never a call
            stray = text.find(TOOL_CALL_CLOSE, pos, think)
            close = text.find(THINK_CLOSE, think)
            end = len(text) if close < 0 else close + len(THINK_CLOSE)
        else:
            stray = text.find(TOOL_CALL_CLOSE, pos, len(text) if start < 0 else start)
        if stray >= 0:
            raise _Refused(f"{TOOL_CALL_CLOSE} without a {TOOL_CALL_OPEN} before it")
        if think >= 0:
            outside.append(text[pos:end])
            pos = end
            continue
        if start < 0:
            outside.append(text[pos:])
            return "".join(outside), calls
        outside.append(text[pos:start])
        number = len(calls) + 1
        if number > max_calls:
            raise _Refused(f"more than {max_calls} tool calls")
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:
            raise _Refused(f"tool call {number}: {TOOL_CALL_OPEN} is not closed")
        body = text[body_start:end]
        if len(body) > max_call_chars:
            raise _Refused(f"tool call {number}: over {max_call_chars} characters")
        if TOOL_CALL_OPEN in body:
            raise _Refused(f"tool call {number}: {TOOL_CALL_OPEN} inside a tool call")
        try:
            calls.append(_call(body, names))
        except _Refused as exc:
            raise _Refused(f"tool call {number}: {exc}") from None
        pos = end + len(TOOL_CALL_CLOSE)


def _call(body: str, names: Collection[str] | None) -> ToolCall:
    call = _decode(body)
    if not isinstance(call, dict):
        raise _Refused(f"expected a JSON object, got {_json_type(call)}")
    extra = sorted(call.keys() - {"name", "arguments"})
    if extra:
        raise _Refused(f"unexpected key {extra[0]!r} (a call has only name and arguments)")
    for key in ("name", "arguments"):
        if key not in call:
            raise _Refused(f"missing {key!r}")
    name, arguments = call["name"], call["arguments"]
    if not isinstance(name, str):
        raise _Refused(f"name must be a string, got {_json_type(name)}")
    if not name:
        raise _Refused("name is empty")
    if names is not None and name not in names:
        raise _Refused(f"unknown tool {name!r} (tools: {', '.join(sorted(names)) or 'none'})")
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = parse_arguments(arguments)
    if not isinstance(arguments, dict):
        raise _Refused(f"arguments must be a JSON object, got {_json_type(arguments)}")
    return ToolCall(name=name, arguments=arguments)


def _decode(text: str) -> Any:
    """The JSON value of `text`: strict JSON (no NaN or Infinity, written or as a number out of
    a float's range such as ``1e999``), at most `MAX_JSON_DEPTH` deep, its strings valid
    Unicode (no lone surrogate escapes)."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:  # the decoder's own guard, far deeper than the bound
        raise _Refused(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise _Refused(f"not valid JSON: {exc.msg} at character {exc.pos}") from None
    except ValueError as exc:  # NaN, Infinity, 1e999; an integer of over 4300 digits
        raise _Refused(f"not valid JSON: {str(exc).partition(':')[0]}") from None
    if _depth_over(value, MAX_JSON_DEPTH):
        raise _Refused(f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise _Refused("a string holds a lone surrogate, which is not valid Unicode") from None
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a float's range")
    return value


def _depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests arrays and objects more than `limit` deep (walked level by
    level, without recursion)."""
    level, depth = [value], 0
    while level := [v for v in level if isinstance(v, dict | list)]:
        depth += 1
        if depth > limit:
            return True
        level = [item for v in level for item in (v.values() if isinstance(v, dict) else v)]
    return False


def _json_type(value: Any) -> str:
    return _JSON_TYPES[type(value)]
