"""Server limits: body size, request shape, prompt length, and sequences in flight.

Refusals are OpenAI-style errors: 413 for a body over the size limit, 400 for a request shape
over a limit or a prompt too long for the context, 429 when the admission queue is full, 503
when a queued request waited too long. Each check runs before the work it bounds. No request
ever spawns a thread per sequence (see `bridge.py`), so the in-flight bound is the server's
whole generation concurrency. A stream whose client takes none of a write for
`stream_write_timeout_s` is cancelled (`stream.py`), so a client that stops reading holds its
share of that bound no longer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core_engine.network.errors import APIError, send_error


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 2 << 20  # 2 MiB
    max_prompts: int = 64  # prompts in one completions request
    max_n: int = 64  # samples per prompt
    max_stop: int = 8  # stop strings per request
    max_stop_chars: int = 256  # characters of one stop string
    max_sequences_in_flight: int = 256  # prompts x n over every request being generated
    max_queued_requests: int = 64  # requests waiting for room; one more is a 429
    queue_timeout_s: float = 60.0  # a queued request waiting longer is a 503
    stream_write_timeout_s: float = 30.0  # a stream write not taken by then cancels the stream
    # A prompt of more characters than context x this is refused before it is tokenized.
    # Prose averages about 4 characters per token and code 3 to 6, so only a prompt made
    # mostly of long runs of whitespace or punctuation can be refused although it would fit.
    max_chars_per_token: int = 16
    max_tools: int = 64  # tools offered in one chat request
    max_tool_bytes: int = 64 << 10  # one tool's definition as compact JSON

    def check_request(self, num_prompts: int, n: int, stop: tuple[str, ...]) -> None:
        """Refuse (400) a request whose shape is over a limit."""
        if num_prompts > self.max_prompts:
            _too_many("prompt", f"{num_prompts} prompts; at most {self.max_prompts}")
        if n > self.max_n:
            _too_many("n", f"n={n}; at most {self.max_n}")
        if num_prompts * n > self.max_sequences_in_flight:
            _too_many("n", f"{num_prompts} prompts x n={n} is over {self.max_sequences_in_flight}")
        if len(stop) > self.max_stop:
            _too_many("stop", f"{len(stop)} stop strings; at most {self.max_stop}")
        if any(len(s) > self.max_stop_chars for s in stop):
            _too_many("stop", f"a stop string is over {self.max_stop_chars} characters")

    def check_tools(self, tools: Sequence[Mapping[str, Any]]) -> None:
        """Refuse (400) more tools, or a larger tool definition, than the limits allow."""
        if len(tools) > self.max_tools:
            _too_many("tools", f"{len(tools)} tools; at most {self.max_tools}")
        for i, tool in enumerate(tools):
            size = len(json.dumps(tool, ensure_ascii=False, separators=(",", ":")).encode())
            if size > self.max_tool_bytes:
                _too_many(f"tools.{i}", f"a {size}-byte tool; at most {self.max_tool_bytes}")

    def check_prompt_chars(self, chars: int, context: int, param: str) -> None:
        """Refuse (400) a prompt too long for `context` tokens by its characters alone."""
        if chars > context * self.max_chars_per_token:
            message = (
                f"the prompt has {chars} characters, over {self.max_chars_per_token} per token "
                f"of this model's {context}-token context"
            )
            raise APIError(400, message, "prompt_too_long", param)


def check_context(prompt_tokens: int, max_tokens: int, context: int, prompt_param: str) -> None:
    """Refuse (400) a tokenized prompt that, with `max_tokens`, does not fit the context."""
    if prompt_tokens >= context:
        message = f"a {prompt_tokens}-token prompt leaves no room in the {context}-token context"
        raise APIError(400, message, "prompt_too_long", prompt_param)
    if prompt_tokens + max_tokens > context:
        raise APIError(
            400,
            f"this model's context is {context} tokens; the prompt has {prompt_tokens} and "
            f"max_tokens is {max_tokens}",
            "context_length_exceeded",
            "max_tokens",
        )


def _too_many(param: str, message: str) -> None:
    raise APIError(400, f"{message} (server limit)", "limit_exceeded", param)


class SequenceBudget:
    """Admission of requests by the sequences they generate, on the event loop: a request
    waits for room, up to `queue_timeout_s`; a full queue refuses at once."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.in_flight = 0
        self.queued = 0
        self._room = asyncio.Condition()

    async def acquire(self, sequences: int) -> None:
        """Room for `sequences` (the caller checked the per-request cap)."""
        limit = self.limits.max_sequences_in_flight
        async with self._room:
            if self.in_flight + sequences > limit:
                if self.queued >= self.limits.max_queued_requests:
                    raise APIError(429, "too many requests are waiting; retry later", "rate_limit")
                self.queued += 1
                try:
                    await asyncio.wait_for(
                        self._room.wait_for(lambda: self.in_flight + sequences <= limit),
                        self.limits.queue_timeout_s,
                    )
                except TimeoutError:
                    raise APIError(503, "the server is busy; retry later", "server_busy") from None
                finally:
                    self.queued -= 1
            self.in_flight += sequences

    async def release(self, sequences: int) -> None:
        async with self._room:
            self.in_flight -= sequences
            self._room.notify_all()


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413 before anything parses it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, self._too_large())
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise self._too_large()
            return message

        await self.app(scope, counted, send)

    def _too_large(self) -> APIError:
        return APIError(
            413, f"the request body is over {self.max_bytes} bytes", "request_too_large"
        )
