"""Request bodies of the OpenAI endpoints, validated strictly.

Unknown parameters are rejected (`unsupported_parameter`); a few well-known OpenAI parameters
the engine cannot honour are accepted only at their no-op value (e.g. `presence_penalty: 0`).
Extensions (as in vLLM): `top_k` and `ignore_eos`. Log-probs are the sampled token's only:
completions accept `logprobs` 0 or 1, chat accepts `top_logprobs` 0 or 1, and in both cases
the single "top" entry is the sampled token (the engine computes no alternatives). The value is
the model's log-softmax(logits / T) over the full vocabulary, before top-k/top-p truncation
(T = 1 at temperature 0: the model's own log-prob, never the greedy point mass's 0.0).
Chat requests may offer `tools` (function tools, `tool_choice` "auto" or "none") and carry
earlier tool calls (assistant `tool_calls`, their arguments a JSON string holding an object)
and their results (role "tool" with `tool_call_id`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from core_engine.task import SamplingParams
from core_engine.tool_calls import parse_arguments

Prompt = str | list[int]
StopString = Annotated[str, Field(min_length=1)]
# Messages of one chat request: checked before the messages are validated one by one, so an
# endless list of tiny messages costs no more than this many.
MAX_MESSAGES = 2048

# Parameter -> the values that make it a no-op.
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
}

_LOGPROBS_HELP = "only the sampled token's log-prob is available, so it must be 0 or 1"


def _unsupported(value: Any, info: ValidationInfo) -> Any:
    allowed = _NO_OP_VALUES[info.field_name]
    if value is not None and value not in allowed:
        raise PydanticCustomError(
            "unsupported_parameter",
            "{param} is not supported by this server (accepted only as {allowed})",
            {"param": info.field_name, "allowed": " or ".join(repr(a) for a in allowed[1:])},
        )
    return value


def _lone_surrogate(body: Any) -> str | None:
    """The dotted path of the first string (value or key) in ``body`` holding a lone surrogate
    (JSON's ``\\ud800`` escapes decode to one; it is no Unicode text), or None. Iterative:
    the body's nesting is bounded only by its size."""
    pending: list[tuple[str, Any]] = [("", body)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            if not value.isascii() and _not_utf8(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                inner = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and _not_utf8(key):
                    return path or "a key"
                pending.append((inner, item))
        elif isinstance(value, list):
            pending.extend((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(value))
    return None


def _not_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """Parameters shared by completions and chat completions."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**62)
    stop: StopString | list[StopString] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # client metadata; does not affect generation
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None

    _no_ops = field_validator("presence_penalty", "frequency_penalty", "logit_bias")(_unsupported)

    @model_validator(mode="before")
    @classmethod
    def _unicode_text(cls, body: Any) -> Any:
        if (path := _lone_surrogate(body)) is not None:
            raise PydanticCustomError(
                "invalid_text",
                "{param} holds a lone surrogate (a \\ud800-\\udfff escape that is not half "
                "of a pair), which is not Unicode text",
                {"param": path},
            )
        return body

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise PydanticCustomError("invalid_value", "stream_options needs stream: true")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """Engine sampling parameters (OpenAI defaults where the request leaves one unset)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            stop=self.stop_strings,
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(GenerationRequest):
    prompt: Any
    logprobs: int | None = None
    best_of: Any = None
    echo: Any = None
    suffix: Any = None

    _completion_no_ops = field_validator("best_of", "echo", "suffix")(_unsupported)

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        if _is_prompt(value) or (
            isinstance(value, list) and value and all(_is_prompt(p) for p in value)
        ):
            return value
        raise PydanticCustomError(
            "invalid_value",
            "prompt must be a string, a list of token ids, or a non-empty list of either",
        )

    @field_validator("logprobs")
    @classmethod
    def _logprobs_range(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= 1:
            raise PydanticCustomError("invalid_value", f"logprobs={value}: {_LOGPROBS_HELP}")
        return value

    def prompts(self) -> list[Prompt]:
        """The prompt as a batch: one entry per string or token-id list."""
        if _is_prompt(self.prompt):
            return [self.prompt]
        return list(self.prompt)


def _is_prompt(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and all(type(t) is int for t in value)
    )


def _arguments_object(value: Any) -> dict[str, Any]:
    """A tool call's `arguments`, a JSON string holding an object, decoded."""
    if not isinstance(value, str):
        raise PydanticCustomError("invalid_value", "arguments must be a JSON string")
    try:
        return parse_arguments(value)
    except ValueError as exc:
        raise PydanticCustomError("invalid_value", "{reason}", {"reason": str(exc)}) from None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    arguments: Annotated[dict[str, Any], BeforeValidator(_arguments_object)]


class AssistantToolCall(BaseModel):
    """A tool call of an earlier assistant turn, as the client sends it back."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    type: Literal["function"]
    function: FunctionCall

    def for_template(self) -> dict[str, Any]:
        """As Hermes-style templates read it: the arguments as an object."""
        function = {"name": self.function.name, "arguments": self.function.arguments}
        return {"id": self.id, "type": "function", "function": function}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[AssistantToolCall] | None = Field(None, min_length=1)
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _fields_of_the_role(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise PydanticCustomError("invalid_value", "only assistant messages have tool_calls")
        if (self.tool_call_id is None) != (self.role != "tool"):
            raise PydanticCustomError(
                "invalid_value", "a tool message needs tool_call_id, and only a tool message"
            )
        if self.content is None and self.tool_calls is None:
            raise PydanticCustomError(
                "invalid_value", "content is needed (it may be null only beside tool_calls)"
            )
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template sees it (`developer` is the system role; no
        content is an empty one)."""
        text = self.content or ""
        if not isinstance(text, str):
            text = "".join(part.text for part in text)
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": text,
        }
        if self.tool_calls is not None:
            message["tool_calls"] = [call.for_template() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema; calls are not checked against it
    strict: Literal[False] | None = None  # sampling is not constrained to the schema


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    function: FunctionTool


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None

    _chat_no_ops = field_validator("functions", "function_call", "response_format")(_unsupported)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_supported(cls, value: Any) -> Any:
        if value not in (None, "auto", "none"):
            raise PydanticCustomError(
                "unsupported_parameter",
                'tool_choice must be "auto" or "none" here: this server cannot force a call',
            )
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tool_names(cls, value: list[Tool] | None) -> list[Tool] | None:
        names = [tool.function.name for tool in value or ()]
        if len(set(names)) < len(names):
            raise PydanticCustomError("invalid_value", "tool names must be unique")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_range(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not 0 <= value <= 1:
            raise PydanticCustomError("invalid_value", f"top_logprobs={value}: {_LOGPROBS_HELP}")
        if value and not info.data.get("logprobs"):
            raise PydanticCustomError("invalid_value", "top_logprobs needs logprobs: true")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_token_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("max_tokens") is not None:
            raise PydanticCustomError(
                "invalid_value", "give max_tokens or max_completion_tokens, not both"
            )
        return value

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
