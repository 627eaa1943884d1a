"""Samples tab and multi-turn episodes: an episode is shown as a conversation (its assistant
turns' tokens coloured by log-prob or version, tool calls inline, observations greyed as the
template's untrained tokens, rewards and tool errors per turn, its finish in the facts), all
stored text escaped; and the episode filters (finish, min turns, with tool errors) page."""

import re
from pathlib import Path
from typing import Any

import pytest

from db import BatchRecord, PolicyVersionRecord, SampleFilter, SampleRecord
from tests.ui.helpers import _sample, encode
from tests.ui.test_samples import search, turn_page
from ui.handlers import samples as samples_module
from ui.handlers.samples import sample_detail
from ui.token_versions import VERSION

ARGUMENTS = {"expression": "<img src=x onerror=alert(1)>2+3"}  # stored text: comes out escaped
OBSERVATION = "5 <script>alert(1)</script> [link](http://x)"
TOOL_ERROR = "no JSON object <b>"
# (role, the text its tokens encode, what its segment carries besides)
CONVERSATION: list[tuple[str, str, dict[str, Any]]] = [
    (
        "assistant",
        "call 2+3",
        {"cached": 5, "tool_calls": [{"name": "calculate", "arguments": ARGUMENTS}]},
    ),
    ("tool", "<tool>5<", {"text": OBSERVATION}),
    ("assistant", "oops", {"cached": 20, "tool_calls": [], "tool_error": TOOL_ERROR}),
    ("tool", "<err>", {"text": "error: no JSON object", "tool_error": TOOL_ERROR}),
    ("assistant", "answer 5", {"cached": 30, "tool_calls": [], "reward": 1.0}),
]


def episode_record(
    model: Path, conversation: list[tuple[str, str, dict]], finish: str, **fields: Any
) -> SampleRecord:
    """A stored episode of policy version 0 whose segments after the first two version 1
    sampled (a weight update landed in flight): assistant tokens with log-probs, observations
    with 0.0."""
    ids, logprobs, segments = [], [], []
    for role, tokens_text, extra in conversation:
        part = encode(model, tokens_text)
        start = len(ids)
        ids += part
        logprobs += (
            [-0.1 - i for i in range(len(part))] if role == "assistant" else [0.0] * len(part)
        )
        segments.append(
            {"role": role, "start": start, "end": len(ids), "text": tokens_text, **extra}
        )
    first = segments[1]["end"] if len(segments) > 1 else len(ids)
    runs = [[0, first], [1, len(ids) - first]] if first < len(ids) else [[0, len(ids)]]
    values: dict[str, Any] = {
        "prompt_messages": [
            {"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": "What is 2+3?"},
        ],
        "response_text": "".join(text for _, text, _ in conversation),
        "response_token_ids": ids,
        "behaviour_logprobs": logprobs,
        "temperature_logprobs": logprobs,
        "token_versions": runs,
        "segments": segments,
        "episode_finish": finish,
        "reward": 1.0,
    }
    return _sample(model, 0, 0, fields.pop("group_index", 0), **{**values, **fields})


@pytest.fixture(scope="module")
def episodes(world) -> dict[str, int]:
    """A job with an environment: three episodes and a single turn; what each is -> its id."""
    repo, model = world["repo"], world["model"]
    job = repo.create_job("train", {"model": str(model), "environment": "calculator"})
    repo.mark_running(job.id)
    for version in range(2):
        repo.record_policy_version(
            PolicyVersionRecord(job.id, version, version - 1 if version else None)
        )
    samples = [
        episode_record(model, CONVERSATION, "done"),
        episode_record(model, CONVERSATION[:1], "max_turns", group_index=1),
        episode_record(model, CONVERSATION[:3], "context_exceeded", group_index=2),
        _sample(model, 1, 0, 3),
    ]
    batch = repo.record_batch(BatchRecord(job.id, 1, 0, "accepted", samples))
    items = repo.list_samples(SampleFilter(job.id, batch_id=batch.id)).items
    ids = [item.id for item in sorted(items, key=lambda item: item.group_index)]
    return {"job": job.id, **dict(zip(("three", "one", "two", "single"), ids, strict=True))}


def _tokens(model: Path, role: str) -> int:
    return sum(len(encode(model, text)) for r, text, _ in CONVERSATION if r == role)


def test_an_episode_is_shown_as_a_conversation(services, world, episodes):
    html = sample_detail(services, episodes["three"])
    for fact, value in (("episode finish", "done"), ("turns", "3"), ("tool errors", "1")):
        assert f'data-fact="{fact}">{value}</td>' in html
    order = [
        "<b>system</b>",
        "<b>user</b>",
        'data-turn="1"',
        'class="observation" data-role="tool"',
        'data-turn="2"',
        "after a tool call that could not be parsed",
        'data-turn="3"',
    ]
    positions = [html.index(mark) for mark in order]
    assert positions == sorted(positions)
    episode = html.split('class="episode"')[1]
    # the assistant turns' tokens, coloured by log-prob; the observations' greyed, untrained
    assert episode.count("data-logprob=") == _tokens(world["model"], "assistant")
    assert episode.count('data-trained="false"') == _tokens(world["model"], "tool")
    assert "background:hsl(" in episode and "background:#e2e2e2" in episode
    assert episode.count("tool result (not trained)") == 2
    assert "calculate(" in episode and "5 prompt tokens cached" in episode
    assert 'class="turn-reward">reward 1</span>' in episode
    assert "tool call not parsed: no JSON object &lt;b&gt;" in episode


def test_every_stored_string_of_an_episode_comes_out_escaped(services, episodes):
    html = sample_detail(services, episodes["three"])
    assert "<img" not in html and "<script" not in html and "<b>assistant" in html
    assert "&lt;img src=x onerror=alert(1)&gt;2+3" in html  # the call's arguments
    assert "5 &lt;script&gt;alert(1)&lt;/script&gt; [link](http://x)" in html  # the result
    assert "<a " not in html


def test_coloured_by_version_each_assistant_token_shows_its_version(services, world, episodes):
    html = sample_detail(services, episodes["three"], VERSION)
    episode = html.split('class="episode"')[1]
    first = len(encode(world["model"], CONVERSATION[0][1]))
    versions = re.findall(r'data-version="(\d+)"', episode)
    assert versions == ["0"] * first + ["1"] * (len(versions) - first)
    assert len(versions) == _tokens(world["model"], "assistant")
    assert "data-logprob=" not in episode  # recoloured, not doubled
    assert episode.count('data-trained="false"') == _tokens(world["model"], "tool")
    assert "policy version per assistant token" in html


def test_a_single_turn_sample_shows_no_conversation(services, episodes):
    html = sample_detail(services, episodes["single"])
    assert 'class="episode"' not in html and 'data-fact="turns"' not in html
    assert "Response (behaviour log-prob per token)" in html


def _ids(table) -> list[int]:
    return table["sample"].tolist()


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, ["three", "one", "two", "single"]),
        ({"episode_finish": "done"}, ["three"]),
        ({"episode_finish": "context_exceeded"}, ["two"]),
        ({"min_turns": "2"}, ["three", "two"]),
        ({"min_turns": 0}, ["three", "one", "two"]),
        ({"with_tool_errors": True}, ["three", "two"]),
        ({"with_tool_errors": True, "min_turns": "3"}, ["three"]),
    ],
)
def test_the_episode_filters(services, episodes, filters, expected):
    table, _, _ = search(services, episodes["job"], **filters)
    assert _ids(table) == [episodes[name] for name in expected]


def test_the_next_pages_keep_the_episode_filters(services, episodes, monkeypatch):
    monkeypatch.setattr(samples_module, "PAGE_SIZE", 1)
    table, state, info = search(services, episodes["job"], min_turns="2")
    seen = _ids(table)
    while "more on the next page" in info:
        table, state, info = turn_page(services, state, 1)
        seen += _ids(table)
    assert seen == [episodes["three"], episodes["two"]]  # not the one-turn episode between


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"min_turns": "many"}, "min turns: 'many' is not a number"),
        ({"min_turns": "-1"}, "min turns: '-1' is not a whole number >= 0"),
        ({"episode_finish": "won"}, "episode_finish: 'won' is not one of done"),
    ],
)
def test_unreadable_episode_filters_are_explained(services, episodes, filters, message):
    table, state, info = search(services, episodes["job"], **filters)
    assert table.empty and state == {} and message in info
