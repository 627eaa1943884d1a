"""OpenAI-compatible HTTP server over the scheduler's serving loop.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (JSON or SSE with
`stream: true`), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
The app starts a serving loop over the engine on startup and stops it on shutdown. Requests
are bounded by `ServerLimits`; with `api_key` every path but `/health` needs it as a Bearer
token, and without one a loopback server checks the Host header (`access.py`). The event
loop only moves requests and events: tokenizing, detokenizing and rendering bodies run in
worker threads, so `/health` answers at once whatever else is being served.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from core_engine.network import prometheus
from core_engine.network.access import BearerAuth, LoopbackHostGuard
from core_engine.network.bridge import HandleEvents
from core_engine.network.encode import chat_prompt_ids, completion_prompt_ids
from core_engine.network.errors import APIError, engine_error, install_error_handlers
from core_engine.network.formats import ChatFormat, CompletionFormat, OutputFormat, json_bytes
from core_engine.network.limits import BodyLimit, SequenceBudget, ServerLimits, check_context
from core_engine.network.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
)
from core_engine.network.stream import EventStreamResponse, StreamContext, sse_stream
from core_engine.scheduler import InferenceScheduler
from core_engine.serving import ServingLoop
from core_engine.task import GenerationResult, SamplingParams

DISCONNECT_POLL_S = 0.05
T = TypeVar("T")


def create_app(
    engine: InferenceScheduler,
    model_name: str = "rl-workbench",
    limits: ServerLimits | None = None,
    api_key: str | None = None,
    loopback: bool = True,
) -> FastAPI:
    """The FastAPI app serving `engine` under the model name `model_name`; `loopback`: it is
    bound to a loopback address (then, without `api_key`, requests must name loopback)."""
    if engine.tokenizer is None:
        raise ValueError("the HTTP server needs an engine with a tokenizer")
    tokenizer = engine.tokenizer
    limits = limits or ServerLimits()
    loop = ServingLoop(engine)
    budget: SequenceBudget | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal budget
        budget = app.state.sequence_budget = SequenceBudget(limits)  # on the server's loop
        # The heap so far (model, tokenizer, libraries) is left out of garbage collections,
        # as vLLM does: a request that allocates much then sets off a collection of its own
        # objects, not a pause of 250 ms that scans the whole heap.
        gc.collect()
        gc.freeze()
        loop.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(loop.stop)
            gc.unfreeze()

    app = FastAPI(title="RL Workbench engine", lifespan=lifespan)
    app.state.serving_loop = loop
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    elif loopback:
        app.add_middleware(LoopbackHostGuard)

    def check_model(body: GenerationRequest) -> None:
        if body.model != model_name:
            raise APIError(
                404,
                f"the model {body.model!r} does not exist; this server serves {model_name!r}",
                "model_not_found",
                "model",
            )

    async def generate(
        request: Request,
        body: GenerationRequest,
        prompts: Sequence[list[int]],
        params: SamplingParams,
        fmt: OutputFormat,
    ) -> Response:
        for ids in prompts:
            check_context(len(ids), params.max_tokens, engine.max_seq_len, fmt.prompt_param)
        assert budget is not None, "the app's lifespan has not started"
        sequences = len(prompts) * body.n
        await budget.acquire(sequences)
        try:
            response = await submit(request, body, prompts, params, fmt)
        except BaseException:
            await budget.release(sequences)
            raise
        if isinstance(response, EventStreamResponse):
            response.on_close = functools.partial(budget.release, sequences)
        else:
            await budget.release(sequences)
        return response

    async def submit(
        request: Request,
        body: GenerationRequest,
        prompts: Sequence[list[int]],
        params: SamplingParams,
        fmt: OutputFormat,
    ) -> Response:
        submitted_version = engine.version  # read before submitting: see sse_stream
        handles = [h for ids in prompts for h in loop.submit(ids, params, body.n)]
        prompt_tokens = sum(len(ids) for ids in prompts)
        events = HandleEvents(handles)
        if not body.stream:
            results = await _cancel_on_failure(events, _results_or_cancel(request, events))
            failed = next((r for r in results if not r.ok), None)
            if failed is not None:
                raise engine_error(failed, fmt.prompt_param)
            content = await asyncio.to_thread(
                lambda: json_bytes(fmt.response(results, prompt_tokens))
            )
            return Response(content, media_type="application/json")
        leaders = range(0, len(handles), body.n)
        await _cancel_on_failure(events, _raise_admission_error(events, leaders, fmt))
        ctx = StreamContext(
            fmt=fmt,
            stop=params.stop,
            submitted_version=submitted_version,
            current_version=lambda: engine.version,
            prompt_tokens=prompt_tokens,
            include_usage=body.include_usage,
        )
        return EventStreamResponse(sse_stream(events, ctx), events, limits.stream_write_timeout_s)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        check_model(body)
        limits.check_request(len(body.prompts()), body.n, body.stop_strings)
        prompts = await completion_prompt_ids(tokenizer, body.prompts(), limits, engine.max_seq_len)
        fmt = CompletionFormat(tokenizer, model_name, body.n, body.logprobs is not None)
        params = body.sampling_params(body.max_tokens or 16)
        return await generate(request, body, prompts, params, fmt)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        check_model(body)
        limits.check_request(1, body.n, body.stop_strings)
        tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
        limits.check_tools(tools)
        if body.tool_choice == "none":  # the model is told of no tool and calls none
            tools = []
        messages = [m.for_template() for m in body.messages]
        prompt = await chat_prompt_ids(tokenizer, messages, tools, limits, engine.max_seq_len)
        max_tokens = body.token_limit or max(1, engine.max_seq_len - len(prompt))
        fmt = ChatFormat(
            tokenizer,
            model_name,
            body.n,
            bool(body.logprobs),
            bool(body.top_logprobs),
            tool_names=frozenset(t["function"]["name"] for t in tools),
        )
        params = body.sampling_params(max_tokens)
        return await generate(request, body, [prompt], params, fmt)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "rl-workbench",
            "max_model_len": engine.max_seq_len,
            "policy_version": engine.version,
        }
        return {"object": "list", "data": [card], "policy_version": engine.version}

    @app.get("/health")
    async def health() -> JSONResponse:
        serving = loop.running
        body = {"status": "ok" if serving else "stopped", "policy_version": engine.version}
        return JSONResponse(body, status_code=200 if serving else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        stats = await anyio.to_thread.run_sync(engine.stats)  # waits for the engine lock
        return PlainTextResponse(prometheus.render(stats), media_type=prometheus.CONTENT_TYPE)

    return app


async def _cancel_on_failure(events: HandleEvents, wait: Awaitable[T]) -> T:
    """Await `wait`; if it raises (or is cancelled), cancel the request's engine tasks."""
    try:
        return await wait
    except BaseException:
        events.cancel()
        raise


async def _raise_admission_error(
    events: HandleEvents, leaders: Sequence[int], fmt: OutputFormat
) -> None:
    """Before a stream starts: a request the engine refuses at admission is an HTTP error.
    Samples of one prompt share its admission outcome, so each prompt's first sample decides."""
    for event in (await events.first_events(leaders)).values():
        if isinstance(event, GenerationResult) and not event.ok and not event.output_ids:
            raise engine_error(event, fmt.prompt_param)


async def _results_or_cancel(request: Request, events: HandleEvents) -> list[GenerationResult]:
    """Every result, or a cancellation of the engine tasks if the client goes away first."""

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        events.cancel()

    watcher = asyncio.create_task(watch())
    try:
        return await events.results()
    finally:
        watcher.cancel()
