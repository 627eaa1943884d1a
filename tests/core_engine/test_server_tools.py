"""Tools on `/v1/chat/completions`, driven by the official `openai` client over real HTTP: the
tools reach the checkpoint's chat template, earlier calls and their results are accepted, and
a reply written in the Hermes format comes back as `tool_calls`.

The tiny model says what a test scripts: its logits are forced to the script's tokens (then
EOS) before greedy sampling, so the reply's text is known exactly."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx
import openai
import pytest
import torch
import transformers

from core_engine.engine import load_engine
from core_engine.network import create_app
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.toy import DEFAULT_ALPHABET, char_tokenizer, save_tiny_checkpoint

from .http_server import running_server

MODEL = "tiny"
CONTEXT = 1024
HANG_GUARD_S = 120  # a wait for a reply (quiet: well under 1 s); only a hang fails
ALPHABET = DEFAULT_ALPHABET + "<>{}[]_"
# A Hermes-style template, as Qwen2.5's in miniature: the tools' names in a system turn, earlier
# calls as <tool_call> JSON (arguments an object), results in <tool_response>.
TEMPLATE = (
    "{%- if tools %}<|system|>Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "<|end|>{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|user|><tool_response>{{ m.tool_call_id }}={{ m.content }}"
    "</tool_response><|end|>"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{%- endfor %}<|end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}
QUESTION = [{"role": "user", "content": "2+3?"}]
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "2+3"}}</tool_call>'


@dataclass
class Served:
    engine: InferenceScheduler
    url: str
    client: openai.OpenAI
    tokenizer: transformers.PreTrainedTokenizerBase
    script: list[int] = field(default_factory=list)  # what the model says next
    prompts: list[list[int]] = field(default_factory=list)  # the prompts it was given

    def says(self, text: str) -> None:
        self.script[:] = self.ids(text)
        self.prompts.clear()

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def chat(self, **kwargs):
        return self.client.chat.completions.create(model=MODEL, temperature=0, **kwargs)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = save_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny"), alphabet=ALPHABET, max_position_embeddings=CONTEXT
    )
    tokenizer = char_tokenizer(ALPHABET)  # the checkpoint's, spaces kept
    tokenizer.chat_template = TEMPLATE
    engine = load_engine(path, EngineConfig(max_batch_size=8), tokenizer=tokenizer)
    with running_server(create_app(engine, MODEL)) as url:
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=HANG_GUARD_S
        )
        served = Served(engine, url, client, tokenizer)
        _force_the_script(served)
        yield served
        client.close()


def _force_the_script(served: Served) -> None:
    """Every sampled token is the script's next one, then EOS."""
    sample = served.engine.executor.sample
    eos = served.tokenizer.eos_token_id

    def forced(tasks, logits, return_logprobs):
        target = torch.full_like(logits, -1e4)
        for row, task in enumerate(tasks):
            done = len(task.output_ids)
            if done == 0:
                served.prompts.append(list(task.prompt_ids))
            target[row, served.script[done] if done < len(served.script) else eos] = 0.0
        return sample(tasks, target, return_logprobs)

    served.engine.executor.sample = forced


def test_a_tool_call_comes_back_as_tool_calls(served):
    served.says(f"Let me compute.{CALL}")
    r = served.chat(messages=QUESTION, tools=[CALCULATE, NOW])
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me compute."
    (tool_call,) = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.id.startswith("call_")
    assert tool_call.function.name == "calculate"
    assert json.loads(tool_call.function.arguments) == {"expression": "2+3"}
    assert r.usage.completion_tokens == len(served.script) + 1  # and EOS


def test_the_tools_reach_the_chat_template(served):
    served.says("5")
    served.chat(messages=QUESTION, tools=[CALCULATE, NOW])
    served.chat(messages=QUESTION)
    served.chat(messages=QUESTION, tools=[CALCULATE], tool_choice="none")
    with_tools = "<|system|>Tools: calculate now<|end|><|user|>2+3?<|end|><|assistant|>"
    without = "<|user|>2+3?<|end|><|assistant|>"
    assert served.prompts == [served.ids(with_tools), served.ids(without), served.ids(without)]


def test_several_calls_without_text_have_null_content_and_distinct_ids(served):
    served.says(f'{CALL}\n<tool_call>{{"name": "now", "arguments": "{{}}"}}</tool_call>')
    r = served.chat(messages=QUESTION, tools=[CALCULATE, NOW], n=2)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        calls = [
            (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls
        ]
        assert calls == [("calculate", {"expression": "2+3"}), ("now", {})]
    ids = [c.id for choice in r.choices for c in choice.message.tool_calls]
    assert len(set(ids)) == 4


@pytest.mark.parametrize(
    ("text", "tools"),
    [
        ('<tool_call>{"name": "calculate"}</tool_call>', [CALCULATE]),  # no arguments
        (CALL, [NOW]),  # a tool that was not offered
        ("<tool_call>2+3", [CALCULATE]),  # unclosed
        (CALL, None),  # no tools offered: nothing is parsed
    ],
    ids=["malformed", "unknown tool", "unclosed", "no tools"],
)
def test_a_reply_that_is_no_valid_call_stays_text(served, text, tools):
    served.says(text)
    r = served.chat(messages=QUESTION, **({"tools": tools} if tools else {}))
    (choice,) = r.choices
    assert choice.finish_reason == "stop"
    assert choice.message.content == text
    assert choice.message.tool_calls is None


def test_a_stream_holds_the_call_back_and_sends_it_whole_at_the_end(served):
    served.says(f"Let me compute.{CALL}")
    chunks = list(served.chat(messages=QUESTION, tools=[CALCULATE], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas)
    assert content == "Let me compute."
    (last,) = chunks[-1].choices
    assert last.finish_reason == "tool_calls"
    (tool_call,) = last.delta.tool_calls
    assert (tool_call.index, tool_call.type) == (0, "function")
    assert tool_call.id.startswith("call_")
    assert tool_call.function.name == "calculate"
    assert json.loads(tool_call.function.arguments) == {"expression": "2+3"}
    assert all(d.tool_calls is None for d in deltas[:-1])


def test_a_stream_whose_call_is_malformed_ends_with_the_text(served):
    text = 'Let me compute.<tool_call>{"name": "calculate"}</tool_call> ok'
    served.says(text)
    chunks = list(served.chat(messages=QUESTION, tools=[CALCULATE], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(d.tool_calls is None for d in deltas)


def test_earlier_calls_and_tool_results_are_given_to_the_template(served):
    served.says("It is 5.")
    conversation = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression": "2+3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    r = served.chat(messages=conversation, tools=[CALCULATE])
    assert r.choices[0].message.content == "It is 5."
    assert r.choices[0].finish_reason == "stop"
    expected = (
        "<|system|>Tools: calculate<|end|><|user|>2+3?<|end|>"
        f"<|assistant|>{CALL}<|end|>"
        "<|user|><tool_response>call_1=5</tool_response><|end|><|assistant|>"
    )
    assert served.prompts == [served.ids(expected)]


def _tools(*tools):
    return {"messages": QUESTION, "tools": list(tools)}


def _history(message):
    return {"messages": [*QUESTION, message]}


ASSISTANT_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
BAD_REQUESTS = [
    (_tools({"type": "function"}), "tools.0.function"),
    (_tools({"type": "code_interpreter", "function": {"name": "f"}}), "tools.0.type"),
    (_tools({"type": "function", "function": {"name": "two words"}}), "tools.0.function.name"),
    (_tools({"type": "function", "function": {"name": "f", "parameters": []}}), None),
    (_tools({"type": "function", "function": {"name": "f", "strict": True}}), None),
    (_tools(NOW, NOW), "tools"),
    (_history({"role": "tool", "content": "5"}), "messages.1"),
    (_history({"role": "user", "content": "5", "tool_call_id": "c"}), "messages.1"),
    (_history({"role": "user", "content": None}), "messages.1"),
    (_history({"role": "user", "content": "x", "tool_calls": [ASSISTANT_CALL]}), "messages.1"),
    (_history({"role": "assistant", "content": None, "tool_calls": []}), None),
]


def _arguments(arguments):
    call = {**ASSISTANT_CALL, "function": {"name": "f", "arguments": arguments}}
    return _history({"role": "assistant", "content": None, "tool_calls": [call]})


ARGUMENTS_PARAM = "messages.1.tool_calls.0.function.arguments"
BAD_REQUESTS += [
    (_arguments("{"), ARGUMENTS_PARAM),
    (_arguments("[1]"), ARGUMENTS_PARAM),
    (_arguments({"x": 1}), ARGUMENTS_PARAM),  # an object, not the JSON string OpenAI sends
    (_arguments("[" * 100_000), ARGUMENTS_PARAM),
]


@pytest.mark.parametrize(("body", "param"), BAD_REQUESTS)
def test_malformed_tools_and_tool_messages_are_400s(served, body, param):
    r = httpx.post(
        f"{served.url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=HANG_GUARD_S
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param, error


def test_tools_over_the_limits_are_refused(served):
    many = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(65)]
    with pytest.raises(openai.BadRequestError) as info:
        served.chat(messages=QUESTION, tools=many)
    assert (info.value.code, info.value.param) == ("limit_exceeded", "tools")
    served.says("5")
    assert served.chat(messages=QUESTION, tools=many[:64]).choices[0].message.content == "5"
    big = {"type": "function", "function": {"name": "f", "description": "x" * (64 << 10)}}
    with pytest.raises(openai.BadRequestError) as info:
        served.chat(messages=QUESTION, tools=[NOW, big])
    assert (info.value.code, info.value.param) == ("limit_exceeded", "tools.1")


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "calculate"}}]
)
def test_a_forced_tool_choice_is_refused(served, tool_choice):
    with pytest.raises(openai.BadRequestError) as info:
        served.chat(messages=QUESTION, tools=[CALCULATE], tool_choice=tool_choice)
    assert (info.value.code, info.value.param) == ("unsupported_parameter", "tool_choice")
    assert '"auto" or "none"' in info.value.message
