"""Response bodies and stream chunks of the two endpoints, with their log-prob layouts.

Every body and chunk carries a top-level `policy_version`; choices carry their own too. When
the choices of one response were generated under different versions (a weight update between
waves), the top-level field is the sorted list of those versions.
"""

from __future__ import annotations

import abc
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from core_engine.task import GenerationResult
from core_engine.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_tool_calls


def usage(results: Sequence[GenerationResult], prompt_tokens: int, n: int) -> dict[str, Any]:
    """Token counts: each prompt once (its first sample's cache hits), every generated token
    of every choice (`n` choices per prompt)."""
    completion = sum(len(r.output_ids) for r in results)
    cached = sum(r.num_cached_prompt_tokens for r in results[::n])
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def json_bytes(body: dict[str, Any]) -> bytes:
    """`body` as JSON, each list item (a choice) serialized on its own: the encoder, which
    holds the GIL while it runs, lets other threads in between items whatever the body's size."""
    parts = []
    for key, value in body.items():
        if isinstance(value, list):
            value_json = "[" + ",".join(_json(item) for item in value) + "]"
        else:
            value_json = _json(value)
        parts.append(f"{_json(key)}:{value_json}")
    return ("{" + ",".join(parts) + "}").encode()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def policy_version(results: Sequence[GenerationResult]) -> int | list[int]:
    versions = sorted({r.policy_version for r in results})
    return versions[0] if len(versions) == 1 else versions


class OutputFormat(abc.ABC):
    """How one endpoint renders a response: shared envelope (id, creation time, model),
    choice layout and log-prob layout."""

    object_name = ""
    chunk_object = ""
    id_prefix = ""
    prompt_param = ""  # the request parameter holding the prompt
    held_from: tuple[str, ...] = ()  # a stream holds its text back from any of these on

    def __init__(self, tokenizer: Any, model: str, n: int, logprobs: bool) -> None:
        self.tokenizer = tokenizer
        self.n = n
        self.model = model
        self.logprobs = logprobs
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._token_texts: dict[int, str] = {}  # at most the vocabulary

    def envelope(self, obj: str, choices: list[dict[str, Any]], version: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "policy_version": version,
        }

    def response(self, results: Sequence[GenerationResult], prompt_tokens: int) -> dict[str, Any]:
        """The non-streaming body."""
        choices = [self.choice(i, r) for i, r in enumerate(results)]
        body = self.envelope(self.object_name, choices, policy_version(results))
        return {**body, "usage": usage(results, prompt_tokens, self.n)}

    def chunk(self, choice: dict[str, Any], version: int) -> dict[str, Any]:
        return self.envelope(self.chunk_object, [choice], version)

    def usage_chunk(self, results: Sequence[GenerationResult], prompt_tokens: int) -> dict:
        """The last chunk when `stream_options.include_usage` is set: no choices, the usage."""
        body = self.envelope(self.chunk_object, [], policy_version(results))
        return {**body, "usage": usage(results, prompt_tokens, self.n)}

    def token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def pairs(self, result: GenerationResult) -> list[tuple[int, float]]:
        """(token id, log-prob) of every generated token, when log-probs were asked for: the
        model's log-softmax(logits / T) before top-k/top-p (T = 1 at temperature 0)."""
        if not self.logprobs:
            return []
        return list(zip(result.output_ids, result.output_temp_logprobs, strict=True))

    @abc.abstractmethod
    def choice(self, index: int, result: GenerationResult) -> dict[str, Any]:
        """One choice of the non-streaming body."""

    def role_delta(self, index: int) -> dict[str, Any] | None:
        """The chunk choice opening a streamed choice, if the format has one."""
        return None

    @abc.abstractmethod
    def delta(
        self, index: int, text: str, tokens: Sequence[tuple[int, float]], offset: int
    ) -> dict[str, Any]:
        """A streamed piece of text with the log-probs of `tokens` (from text `offset`)."""

    @abc.abstractmethod
    def final_delta(self, index: int, text: str, result: GenerationResult) -> dict[str, Any]:
        """The last chunk choice of a streamed choice: remaining text and the outcome."""


def _outcome(result: GenerationResult) -> dict[str, Any]:
    return {
        "finish_reason": result.finish_reason.value,
        "stop_reason": result.stop_reason,
        "policy_version": result.policy_version,
    }


class CompletionFormat(OutputFormat):
    """`/v1/completions`: `text`, and `logprobs` as tokens / token_logprobs / top_logprobs."""

    object_name = chunk_object = "text_completion"
    id_prefix = "cmpl"
    prompt_param = "prompt"

    def choice(self, index: int, result: GenerationResult) -> dict[str, Any]:
        return {
            "index": index,
            "text": result.text or "",
            "logprobs": self._logprobs(self.pairs(result), 0),
            **_outcome(result),
        }

    def delta(
        self, index: int, text: str, tokens: Sequence[tuple[int, float]], offset: int
    ) -> dict[str, Any]:
        logprobs = self._logprobs(tokens, offset)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}

    def final_delta(self, index: int, text: str, result: GenerationResult) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": None, **_outcome(result)}

    def _logprobs(self, tokens: Sequence[tuple[int, float]], offset: int) -> dict | None:
        if not self.logprobs:
            return None
        texts = [self.token_text(t) for t, _ in tokens]
        offsets = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": texts,
            "token_logprobs": [lp for _, lp in tokens],
            "top_logprobs": [{text: lp} for text, (_, lp) in zip(texts, tokens, strict=True)],
            "text_offset": offsets,
        }


class ChatFormat(OutputFormat):
    """`/v1/chat/completions`: an assistant `message`, and `logprobs.content` entries.

    With tools offered, the text is parsed for tool calls (`core_engine.tool_calls`): when
    every call is well formed and names an offered tool, the message carries them as
    `tool_calls`, the text around them as `content`, and the choice finishes with
    "tool_calls"; otherwise the whole text is the content. A stream holds its text back from
    the first tool-call tag on and sends the calls, or that text, with its last chunk.
    """

    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"
    prompt_param = "messages"

    def __init__(
        self,
        tokenizer: Any,
        model: str,
        n: int,
        logprobs: bool,
        top_logprobs: bool,
        tool_names: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(tokenizer, model, n, logprobs)
        self.top_logprobs = top_logprobs
        self.tool_names = tool_names
        if tool_names:
            self.held_from = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

    def choice(self, index: int, result: GenerationResult) -> dict[str, Any]:
        message, outcome = self._turn(result.text or "", result)
        return {
            "index": index,
            "message": {"role": "assistant", **message},
            "logprobs": self._logprobs(self.pairs(result)),
            **outcome,
        }

    def role_delta(self, index: int) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}

    def delta(
        self, index: int, text: str, tokens: Sequence[tuple[int, float]], offset: int
    ) -> dict[str, Any]:
        logprobs = self._logprobs(tokens)
        return {
            "index": index,
            "delta": {"content": text},
            "logprobs": logprobs,
            "finish_reason": None,
        }

    def final_delta(self, index: int, text: str, result: GenerationResult) -> dict[str, Any]:
        delta, outcome = self._turn(text, result)
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
        return {"index": index, "delta": delta, "logprobs": None, **outcome}

    def _turn(self, text: str, result: GenerationResult) -> tuple[dict[str, Any], dict]:
        """The message fields of `text` (content, and tool calls if any) and the outcome."""
        outcome = _outcome(result)
        if not self.tool_names:
            return {"content": text}, outcome
        parsed = parse_tool_calls(text, names=self.tool_names)
        if not parsed.calls:
            return {"content": text}, outcome
        calls = [call.to_json(f"call_{uuid.uuid4().hex[:24]}") for call in parsed.calls]
        message = {"content": parsed.content or None, "tool_calls": calls}
        return message, {**outcome, "finish_reason": "tool_calls"}

    def _logprobs(self, tokens: Sequence[tuple[int, float]]) -> dict | None:
        if not self.logprobs:
            return None
        content = []
        for token_id, logprob in tokens:
            text = self.token_text(token_id)
            entry = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
            top = [dict(entry)] if self.top_logprobs else []
            content.append({**entry, "top_logprobs": top})
        return {"content": content}
