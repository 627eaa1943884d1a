"""OpenAI-style error bodies `{"error": {"message", "type", "code", "param"}}` for failures."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import Send

from core_engine.task import ErrorCode, GenerationResult

log = logging.getLogger(__name__)

# Engine outcome codes that are not the client's fault; every other code is a 400.
_ENGINE_STATUS = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NON_FINITE_LOGITS: 500,
    ErrorCode.POLICY_UPDATED: 503,
    ErrorCode.CANCELLED: 503,
}


class APIError(Exception):
    """A failed request, rendered as an OpenAI error body with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": _error_type(self.status), "code": self.code}
        return {"error": {**error, "param": self.param}, **self.extra}


async def send_error(send: Send, error: APIError) -> None:
    """Answer with `error` straight from ASGI middleware, before the app sees the request."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error_type(status: int) -> str:
    if status < 500:
        return "invalid_request_error"
    return "service_unavailable_error" if status == 503 else "server_error"


_PROMPT_ERRORS = {ErrorCode.EMPTY_PROMPT, ErrorCode.PROMPT_TOO_LONG, ErrorCode.INVALID_TOKEN_ID}


def engine_error(result: GenerationResult, prompt_param: str) -> APIError:
    """The API error for a request the engine ended with `error` or `abort`; prompt problems
    name `prompt_param`, the request parameter that holds the prompt."""
    assert result.error is not None, "engine results that are not ok carry an error"
    code = result.error.code
    return APIError(
        _ENGINE_STATUS.get(code, 400),
        result.error.message,
        code.value,
        param=prompt_param if code in _PROMPT_ERRORS else None,
        extra={"policy_version": result.policy_version},
    )


def _validation_error(exc: RequestValidationError) -> APIError:
    """The first schema problem of a request body, named by its parameter."""
    first = exc.errors()[0]
    loc = list(first.get("loc", ()))
    param = _param_path(loc[1:] if loc[:1] == ["body"] else loc, exc.body) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first['msg']}", "invalid_json")
    if kind == "extra_forbidden":
        return APIError(
            400, f"unsupported parameter {param!r}", "unsupported_parameter", param=param
        )
    if kind == "invalid_text":  # names its parameter itself (a check of the whole body)
        param = first["ctx"]["param"]
        return APIError(400, f"request body: {first['msg']}", "invalid_text", param)
    if kind == "unsupported_parameter":
        return APIError(400, first["msg"], "unsupported_parameter", param=param)
    if kind == "missing":
        return APIError(
            400, f"missing required parameter {param!r}", "missing_required_parameter", param
        )
    where = f"{param}: " if param else "request body: "
    return APIError(400, where + first.get("msg", "invalid value"), "invalid_value", param)


def _param_path(loc: list[Any], body: Any) -> str:
    """The dotted path of the offending parameter inside the request body. Pydantic adds
    union-member tags (`str`, `list[...]`) to locations; they index nothing and are dropped."""
    parts, node = [], body
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]
        elif not (isinstance(node, dict) and i == len(loc) - 1):  # not a missing key
            break
        parts.append(str(part))
    return ".".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    """Render validation failures, HTTP errors and crashes as OpenAI error bodies."""

    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await api_error(request, _validation_error(exc))

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else f"http_{exc.status_code}"
        return await api_error(request, APIError(exc.status_code, str(exc.detail), code))

    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return await api_error(request, APIError(500, f"{type(exc).__name__}: {exc}", "internal"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, crash)
