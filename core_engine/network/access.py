"""Who may call the server: the Bearer API key, and the Host guard of a keyless loopback server.

With an API key, every path but `/health` needs `Authorization: Bearer <key>` (as with vLLM),
`/metrics`, `/docs` and `/openapi.json` included; `/health` stays open for liveness probes.
Without a key, a server bound to loopback answers only requests whose Host header names
loopback (`localhost`, `127.0.0.1`, `[::1]`, any port): a web page that rebinds its own DNS
name to 127.0.0.1 (DNS rebinding) sends its own name as Host and is refused with a 421.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from core_engine.network.errors import APIError, send_error

OPEN_PATHS = frozenset({"/health"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


class BearerAuth:
    """ASGI middleware: every path but `OPEN_PATHS` needs `Authorization: Bearer <api_key>`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(401, "missing or invalid API key", "invalid_api_key")
                await send_error(send, error)
                return
        await self.app(scope, receive, send)


class LoopbackHostGuard:
    """ASGI middleware: a request whose Host header does not name loopback is a 421."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(host) not in LOOPBACK_HOSTS:
                message = (
                    f"Host {host!r} is not a loopback name: this server without an API key "
                    f"answers only {', '.join(sorted(LOOPBACK_HOSTS))} (any port)"
                )
                await send_error(send, APIError(421, message, "invalid_host"))
                return
        await self.app(scope, receive, send)


def host_name(host: str) -> str:
    """The name part of a Host header value, lower-cased: `[::1]:8000` -> `[::1]`."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, _ = host.partition("]")
        return name + bracket
    return host.partition(":")[0]
