"""Server-sent events for a streamed request, and the response that cancels on close."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from core_engine.network.bridge import HandleEvents
from core_engine.network.detok import IncrementalText
from core_engine.network.errors import engine_error
from core_engine.network.formats import OutputFormat
from core_engine.serving import TokenEvent
from core_engine.task import GenerationResult

log = logging.getLogger(__name__)


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


@dataclass
class _Choice:
    text: IncrementalText
    version: int | None = None  # known once it is certain which version produced the tokens
    pending: list[TokenEvent] = field(default_factory=list)
    opened: bool = False
    offset: int = 0  # characters of token text streamed so far (completions' text_offset)


@dataclass
class StreamContext:
    """What a stream needs beyond the events: formatting and the version at submission."""

    fmt: OutputFormat
    stop: Sequence[str]
    submitted_version: int
    current_version: Callable[[], int]  # the engine's policy version now
    prompt_tokens: int
    include_usage: bool


async def sse_stream(events: HandleEvents, ctx: StreamContext) -> AsyncIterator[str]:
    """Chunks of every choice as tokens arrive, a final chunk per choice, then `[DONE]`.

    The events that arrived together are rendered together in a worker thread (decoding,
    stop strings, JSON), so the event loop only moves them: its work per token is constant.
    """
    renderer = _Renderer(ctx)
    while batch := await events.next_batch():
        text = await asyncio.to_thread(renderer.render, batch)
        if text:
            yield text
        if renderer.failed:
            events.cancel()
            return
    yield await asyncio.to_thread(renderer.close)


class _Renderer:
    """The SSE text of a stream's events, batch by batch (one batch at a time).

    Token events carry no version, so a choice's chunks are released once its version is
    certain: the engine still serves the version it had at submission (then no update can
    have intervened), or the choice's result has arrived. An engine error ends the stream with
    an error event (the caller cancels the other choices).
    """

    def __init__(self, ctx: StreamContext) -> None:
        self.ctx = ctx
        self.choices: dict[int, _Choice] = {}
        self.results: dict[int, GenerationResult] = {}
        self.failed = False

    def render(self, batch: Sequence[tuple[int, TokenEvent | GenerationResult]]) -> str:
        """The events of `batch` as SSE text (empty while no version is certain)."""
        fmt, ctx = self.ctx.fmt, self.ctx
        out: list[str] = []
        for index, event in batch:
            choice = self.choices.get(index)
            if choice is None:
                text = IncrementalText(fmt.tokenizer, (*ctx.stop, *fmt.held_from))
                choice = self.choices[index] = _Choice(text)
            if isinstance(event, TokenEvent):
                choice.pending.append(event)
                if choice.version is None and ctx.current_version() == ctx.submitted_version:
                    choice.version = ctx.submitted_version
            elif not event.ok:
                self.failed = True
                out += [sse(engine_error(event, fmt.prompt_param).body()), sse("[DONE]")]
                break
            else:
                choice.version = event.policy_version
                self.results[index] = event
            if choice.version is not None:
                chunks = _flush(fmt, index, choice, event)
                out += [sse(fmt.chunk(chunk, choice.version)) for chunk in chunks]
        return "".join(out)

    def close(self) -> str:
        """The usage chunk (if asked for) and `[DONE]`."""
        out = []
        if self.ctx.include_usage:
            results = [self.results[i] for i in sorted(self.results)]
            out.append(sse(self.ctx.fmt.usage_chunk(results, self.ctx.prompt_tokens)))
        return "".join([*out, sse("[DONE]")])


def _flush(
    fmt: OutputFormat, index: int, choice: _Choice, event: TokenEvent | GenerationResult
) -> list[dict[str, Any]]:
    """Chunk choices for the pending tokens of one choice (and its end, on a result)."""
    chunks = []
    if not choice.opened:
        choice.opened = True
        opening = fmt.role_delta(index)
        if opening is not None:
            chunks.append(opening)
    for token in choice.pending:
        text = choice.text.push(token.token_id)
        logprobs = [(token.token_id, token.temp_logprob)] if fmt.logprobs else []
        if text or logprobs:
            chunks.append(fmt.delta(index, text, logprobs, choice.offset))
            choice.offset += sum(len(fmt.token_text(t)) for t, _ in logprobs)
    choice.pending.clear()
    if isinstance(event, GenerationResult):
        chunks.append(fmt.final_delta(index, choice.text.finish(event.text or ""), event))
    return chunks


class _ClientStalled(Exception):
    """A stream write the client did not take in time."""


class EventStreamResponse(StreamingResponse):
    """An SSE response that cancels the request's unfinished engine tasks when it ends,
    however it ends: completed, client disconnected, server shutting down, or a write the
    client did not take within `write_timeout_s` (it stopped reading: the server's buffers
    for it are full). The connection is then closed once what is buffered is sent."""

    def __init__(
        self, content: AsyncIterator[str], events: HandleEvents, write_timeout_s: float
    ) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.headers["Cache-Control"] = "no-cache"
        self._events = events
        self._write_timeout_s = write_timeout_s
        self.on_close: Callable[[], Awaitable[None]] | None = None  # after the stream ends

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_in_time(message: Message) -> None:
            try:
                with anyio.fail_after(self._write_timeout_s):
                    await send(message)
            except TimeoutError:
                raise _ClientStalled from None

        try:
            await super().__call__(scope, receive, send_in_time)
        except _ClientStalled:
            log.warning(
                "%s: the client took no data for %g s; the stream is cancelled",
                scope.get("client"),
                self._write_timeout_s,
            )
        finally:
            self._events.cancel()
            if self.on_close is not None:
                await self.on_close()
