"""Tool calls as Hermes / Qwen checkpoints write them (`core_engine.tool_calls`): hand-written
turns and what they hold; malformed, oversized or hostile ones refused with a reason, never
an exception."""

import json
import re

import pytest

from core_engine.tool_calls import (
    MAX_JSON_DEPTH,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedTurn,
    ToolCall,
    parse_arguments,
    parse_tool_calls,
)

CALC = '{"name": "calculate", "arguments": {"expression": "2+3"}}'
NOW = '{"name": "now", "arguments": {}}'


def call(body: str) -> str:
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def test_the_tags_are_the_hermes_ones():
    assert (TOOL_CALL_OPEN, TOOL_CALL_CLOSE) == ("<tool_call>", "</tool_call>")


def test_text_without_a_tag_is_content():
    assert parse_tool_calls("  The answer is 5.\n") == ParsedTurn("The answer is 5.", [], None)


def test_one_call():
    parsed = parse_tool_calls(f"Let me compute.\n<tool_call>\n{CALC}\n</tool_call>")
    assert parsed == ParsedTurn(
        content="Let me compute.",
        calls=[ToolCall("calculate", {"expression": "2+3"})],
        error=None,
    )


def test_two_calls_with_text_between_and_after():
    text = f"First {call(CALC)} then {call(NOW)} done."
    parsed = parse_tool_calls(text, names={"calculate", "now"})
    assert parsed.error is None
    assert parsed.calls == [ToolCall("calculate", {"expression": "2+3"}), ToolCall("now", {})]
    assert parsed.content == "First  then  done."


def test_arguments_as_a_json_string_holding_an_object():
    body = json.dumps({"name": "calculate", "arguments": json.dumps({"expression": "2+3"})})
    assert parse_tool_calls(call(body)).calls == [ToolCall("calculate", {"expression": "2+3"})]


def test_unicode_in_arguments_and_around_the_call():
    body = '{"name": "translate", "arguments": {"text": "h\\u00e9llo 日本語 \\ud83d\\ude00"}}'
    parsed = parse_tool_calls(f"答え: {call(body)}")
    assert parsed.calls == [ToolCall("translate", {"text": "héllo 日本語 😀"})]
    assert parsed.content == "答え:"
    assert json.loads(parsed.calls[0].to_json("call_0")["function"]["arguments"]) == {
        "text": "héllo 日本語 😀"
    }


def test_to_json_is_openais_shape():
    assert ToolCall("calculate", {"expression": "2+3"}).to_json("call_7") == {
        "id": "call_7",
        "type": "function",
        "function": {"name": "calculate", "arguments": '{"expression": "2+3"}'},
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (f"{TOOL_CALL_OPEN}{CALC}", "tool call 1: <tool_call> is not closed"),
        (call("{name: calculate}"), "tool call 1: not valid JSON: Expecting property name"),
        (call(CALC + " and more"), "tool call 1: not valid JSON: Extra data at character"),
        (call("[1, 2]"), "tool call 1: expected a JSON object, got array"),
        (call("42"), "tool call 1: expected a JSON object, got number"),
        (call('{"arguments": {}}'), "tool call 1: missing 'name'"),
        (call('{"name": "calculate"}'), "tool call 1: missing 'arguments'"),
        (call('{"name": 7, "arguments": {}}'), "tool call 1: name must be a string, got number"),
        (call('{"name": "", "arguments": {}}'), "tool call 1: name is empty"),
        (
            call('{"name": "calculate", "parameters": {}}'),
            "tool call 1: unexpected key 'parameters'",
        ),
        (
            call('{"name": "calculate", "arguments": [1]}'),
            "tool call 1: arguments must be a JSON object, got array",
        ),
        (
            call('{"name": "calculate", "arguments": "[1]"}'),
            "tool call 1: arguments must be a JSON object, got array",
        ),
        (
            call('{"name": "calculate", "arguments": "2+3"}'),
            "tool call 1: not valid JSON: Extra data",
        ),
        (
            call('{"name": "calculate", "arguments": {"x": NaN}}'),
            "tool call 1: not valid JSON: NaN is not JSON",
        ),
        (  # issue 45: a number too large for a float is no JSON number either
            call('{"name": "calculate", "arguments": {"x": 1e999}}'),
            "tool call 1: not valid JSON: 1e999 is out of a float's range",
        ),
        (
            call('{"name": "calculate", "arguments": "{\\"x\\": -2E+400}"}'),
            "tool call 1: not valid JSON: -2E+400 is out of a float's range",
        ),
        (
            call('{"name": "calculate", "arguments": {"x": "\\udc00"}}'),
            "tool call 1: a string holds a lone surrogate",
        ),
        (
            call(f'{{"name": "calculate", "arguments": {{"x": {"9" * 5000}}}}}'),
            "tool call 1: not valid JSON: Exceeds the limit (4300 digits)",
        ),
        (f"{call(CALC)}{call(CALC)}{TOOL_CALL_OPEN}", "tool call 3: <tool_call> is not closed"),
        (call(f"{TOOL_CALL_OPEN}{CALC}") + TOOL_CALL_CLOSE, "tool call 1: <tool_call> inside"),
        (f"done {TOOL_CALL_CLOSE}", "</tool_call> without a <tool_call> before it"),
        (f"{call(CALC)} {TOOL_CALL_CLOSE}", "</tool_call> without a <tool_call> before it"),
    ],
)
def test_a_malformed_turn_is_refused_with_its_reason_and_kept_as_text(text, error):
    parsed = parse_tool_calls(f" {text} ")
    assert parsed.error is not None and parsed.error.startswith(error), parsed.error
    assert parsed.calls == []
    assert parsed.content == text


def test_names_restrict_the_tools_that_may_be_called():
    assert parse_tool_calls(call(CALC), names={"calculate"}).calls
    parsed = parse_tool_calls(call(CALC), names={"search", "now"})
    assert parsed.error == "tool call 1: unknown tool 'calculate' (tools: now, search)"
    assert parse_tool_calls(call(CALC), names=set()).error is not None


def test_more_calls_than_max_calls_are_refused():
    assert len(parse_tool_calls(call(CALC) * 3, max_calls=3).calls) == 3
    parsed = parse_tool_calls(call(CALC) * 4, max_calls=3)
    assert (parsed.calls, parsed.error) == ([], "more than 3 tool calls")


def test_an_oversized_call_is_refused_by_its_size_without_parsing_it(monkeypatch):
    fits = call(json.dumps({"name": "c", "arguments": {"x": "y" * 16_300}}))
    assert len(fits) - len(TOOL_CALL_OPEN + TOOL_CALL_CLOSE) <= 16_384
    assert parse_tool_calls(fits).calls == [ToolCall("c", {"x": "y" * 16_300})]
    assert parse_tool_calls(fits, max_call_chars=100).error == "tool call 1: over 100 characters"

    def no_parsing(*args, **kwargs):
        raise AssertionError("the oversized call reached the JSON decoder")

    monkeypatch.setattr(json, "loads", no_parsing)
    huge = call('{"name": "calculate", "arguments": {"x": "' + "y" * 10_000_000 + '"}}')
    assert parse_tool_calls(huge).error == "tool call 1: over 16384 characters"


@pytest.mark.parametrize(
    "deep",
    ["[" * 10_000 + "]" * 10_000, '{"a":' * 10_000 + "1" + "}" * 10_000],
    ids=["arrays", "objects"],
)
def test_deep_nesting_is_refused_without_a_recursion_error(deep):
    limit = 10**6
    assert parse_tool_calls(call(deep), max_call_chars=limit).error == (
        f"tool call 1: nested deeper than {MAX_JSON_DEPTH} levels"
    )
    as_arguments = call('{"name": "f", "arguments": {"a": ' + deep + "}}")
    as_string = call(json.dumps({"name": "f", "arguments": deep}))
    for text in (as_arguments, as_string):
        parsed = parse_tool_calls(text, max_call_chars=limit)
        assert parsed.error == f"tool call 1: nested deeper than {MAX_JSON_DEPTH} levels"


def test_nesting_up_to_the_bound_is_accepted():
    # the call object is level 1, its arguments level 2
    inner = "[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2)
    body = f'{{"name": "f", "arguments": {{"a": {inner}}}}}'
    assert parse_tool_calls(call(body)).error is None
    deeper = f'{{"name": "f", "arguments": {{"a": [{inner}]}}}}'
    assert parse_tool_calls(call(deeper)).error is not None


def test_parse_arguments_reads_an_object_or_says_why_not():
    assert parse_arguments('{"expression": "2+3"}') == {"expression": "2+3"}
    for text, reason in [
        ("[1]", "arguments must be a JSON object, got array"),
        ("null", "arguments must be a JSON object, got null"),
        ("{", "not valid JSON"),
        ("[" * 5000, f"nested deeper than {MAX_JSON_DEPTH} levels"),
    ]:
        with pytest.raises(ValueError, match=re.escape(reason)):
            parse_arguments(text)


@pytest.mark.parametrize(
    "text",
    [
        f"<think>maybe {call(CALC)} first?</think> {call(CALC)}",
        f"<think>I could call {call(CALC)}</think>{call(CALC)} then",
    ],
)
def test_a_call_inside_think_is_reasoning_not_a_call(text):
    """Only the call after the reasoning block is taken; the one inside it stays text."""
    parsed = parse_tool_calls(text)
    assert parsed.error is None and len(parsed.calls) == 1
    assert TOOL_CALL_OPEN in parsed.content and parsed.content.startswith("<think>")


def test_an_unclosed_think_makes_the_rest_of_the_turn_reasoning():
    parsed = parse_tool_calls(f"<think>let me {call(CALC)} and {TOOL_CALL_CLOSE} hmm")
    assert parsed.error is None and parsed.calls == []


def test_a_bad_call_after_a_good_one_takes_neither():
    """Every call well formed, or none is taken: the good first call is not run alone."""
    parsed = parse_tool_calls(f"{call(CALC)} {call('{bad')}")
    assert parsed.calls == [] and parsed.error.startswith("tool call 2: not valid JSON")
