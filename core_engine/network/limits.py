"""Server limits: body size, request shape, sequences in flight, and the optional API key.

Refusals are OpenAI-style errors: 413 for a body over the size limit, 400 for a request shape
over a limit, 429 when the admission queue is full, 503 when a queued request waited too long,
401 for a missing or wrong Bearer key. No request ever spawns a thread per sequence (see
`bridge.py`), so the in-flight bound is the server's whole concurrency.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core_engine.network.errors import APIError


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
            await _send_error(send, self._too_large())
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


class BearerAuth:
    """ASGI middleware: `/v1/*` needs `Authorization: Bearer <api_key>` (as vLLM does)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(401, "missing or invalid API key", "invalid_api_key")
                await _send_error(send, error)
                return
        await self.app(scope, receive, send)


async def _send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
