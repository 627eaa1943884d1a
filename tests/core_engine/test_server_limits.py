"""Server limits and the API key, driven by the official `openai` client over real HTTP."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from core_engine.engine import load_engine
from core_engine.network import create_app
from core_engine.network.__main__ import parse_args
from core_engine.network.limits import ServerLimits
from core_engine.scheduler import EngineConfig
from core_engine.toy import save_tiny_checkpoint

from .http_server import running_server

MODEL = "tiny"
KEY = "sk-test"
CONTEXT = 256
LIMITS = ServerLimits(
    max_body_bytes=4096,
    max_prompts=2,
    max_n=3,
    max_stop=2,
    max_stop_chars=5,
    max_sequences_in_flight=2,
    max_queued_requests=1,
    queue_timeout_s=0.5,  # how long a queued request waits, where nothing races it
)
HANG_GUARD_S = 120  # a wait for a state of the server (quiet: milliseconds); only a hang fails
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), max_position_embeddings=CONTEXT)
    engine = load_engine(path, EngineConfig(max_batch_size=8))
    app = create_app(engine, MODEL, limits=LIMITS, api_key=KEY)
    with running_server(app) as url:
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=HANG_GUARD_S
        )
        yield engine, app, url, client
        client.close()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def refused(call: Callable[[], object], error: type[openai.APIStatusError]) -> openai.APIError:
    with pytest.raises(error) as info:
        call()
    return info.value


def test_body_over_the_size_limit_is_413(server):
    _, _, _, client = server
    e = refused(
        lambda: client.completions.create(model=MODEL, prompt="x" * 5000, max_tokens=1),
        openai.APIStatusError,
    )
    assert e.status_code == 413 and e.code == "request_too_large"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"prompt": ["a", "b", "c"]}, "prompt"),
        ({"prompt": "a", "n": 4}, "n"),
        ({"prompt": ["a", "b"], "n": 2}, "n"),  # 4 sequences: over the in-flight bound
        ({"prompt": "a", "stop": ["x", "y", "z"]}, "stop"),
        ({"prompt": "a", "stop": "toolong"}, "stop"),
    ],
    ids=["prompts", "n", "sequences", "stop count", "stop length"],
)
def test_request_shape_over_a_limit_is_400(server, kwargs, param):
    _, _, _, client = server
    e = refused(
        lambda: client.completions.create(model=MODEL, max_tokens=1, **kwargs),
        openai.BadRequestError,
    )
    assert (e.code, e.param) == ("limit_exceeded", param)


def test_max_tokens_is_capped_by_the_context(server):
    _, _, _, client = server
    e = refused(
        lambda: client.completions.create(model=MODEL, prompt="abc", max_tokens=CONTEXT),
        openai.BadRequestError,
    )
    assert (e.code, e.param) == ("context_length_exceeded", "max_tokens")
    ok = client.completions.create(model=MODEL, prompt="abc", max_tokens=CONTEXT - 3, **GREEDY)
    assert ok.usage.completion_tokens == CONTEXT - 3


def test_in_flight_bound_queues_then_refuses_without_a_thread_per_sequence(server, monkeypatch):
    """A request over the in-flight bound waits in the queue, one more is a 429, and a queued
    request that waits `queue_timeout_s` is a 503. The 429 is checked while the queue holds
    a request for as long as the test needs (its timeout raised to a hang guard), so a slow
    machine cannot let it time out first; the 503 then, with nothing racing the timeout."""
    engine, app, _, client = server
    budget = app.state.sequence_budget
    results: dict[str, object] = {}

    def call(name: str, **kwargs) -> None:
        try:
            results[name] = client.completions.create(model=MODEL, max_tokens=2, **kwargs)
        except openai.APIError as exc:
            results[name] = exc

    def start(name: str, prompt: str, n: int = 1) -> threading.Thread:
        thread = threading.Thread(target=call, args=(name,), kwargs={"prompt": prompt, "n": n})
        thread.start()
        return thread

    client.completions.create(model=MODEL, prompt="w", max_tokens=1)  # the server's threads
    threads_before = threading.active_count()
    patient = dataclasses.replace(LIMITS, queue_timeout_s=HANG_GUARD_S)
    with engine.lock:  # nothing generates: the first request holds the whole budget
        first = start("first", "a", n=2)
        wait_for(lambda: budget.in_flight == 2, "the first request was not admitted")
        assert threading.active_count() == threads_before + 1, "a thread per sequence"
        with monkeypatch.context() as patience:
            patience.setattr(budget, "limits", patient)
            waiting = start("waiting", "b")
            wait_for(lambda: budget.queued == 1, "the second request did not queue")
            full = refused(
                lambda: client.completions.create(model=MODEL, prompt="c", max_tokens=2),
                openai.RateLimitError,
            )
            assert full.status_code == 429
            assert budget.queued == 1 and "waiting" not in results  # still waiting for room
    for thread in (first, waiting):
        thread.join(timeout=HANG_GUARD_S)
    assert len(results["first"].choices) == 2
    assert len(results["waiting"].choices) == 1  # admitted once the first one ended

    with engine.lock:  # again, with the limits' queue timeout
        first = start("first", "d", n=2)
        wait_for(lambda: budget.in_flight == 2, "the first request was not admitted")
        queued = start("queued", "e")
        queued.join(timeout=HANG_GUARD_S)  # waits queue_timeout_s, then gives up
        assert isinstance(results["queued"], openai.APIStatusError)
        assert results["queued"].status_code == 503
    first.join(timeout=HANG_GUARD_S)
    assert len(results["first"].choices) == 2
    assert budget.in_flight == 0 and budget.queued == 0
    after = client.completions.create(model=MODEL, prompt="f", max_tokens=2)
    assert after.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/docs", "/openapi.json", "/nowhere"])
def test_api_key_is_required_everywhere_but_on_health(server, path):
    _, _, url, _ = server
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    e = refused(wrong.models.list, openai.AuthenticationError)
    assert e.code == "invalid_api_key"
    no_key = httpx.get(f"{url}{path}")
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    keyed = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {KEY}"})
    assert keyed.status_code == (404 if path == "/nowhere" else 200)
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_keyed_server_answers_any_host(server):
    _, _, url, _ = server
    headers = {"Host": "engine.example.com", "Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 200


def test_non_loopback_bind_needs_an_api_key_or_an_explicit_flag(monkeypatch):
    monkeypatch.delenv("RLWB_API_KEY", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--model", "/ckpt", "--host", "0.0.0.0"])
    assert parse_args(["--model", "/ckpt", "--host", "0.0.0.0", "--api-key", "k"]).api_key == "k"
    public = ["--model", "/ckpt", "--host", "0.0.0.0", "--allow-unauthenticated-public"]
    assert parse_args(public).api_key is None
    assert parse_args(["--model", "/ckpt", "--host", "::1"]).host == "::1"


# Issue 45, a Low: a lone surrogate (valid JSON, not Unicode text) is the client's error.
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", '{"model": "tiny", "prompt": "a\\ud800", "max_tokens": 1}', "prompt"),
        (
            "/v1/chat/completions",
            '{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"},'
            ' {"role": "user", "content": "\\udfff"}]}',
            "messages.1.content",
        ),
        (
            "/v1/completions",
            '{"model": "tiny", "prompt": "a", "max_tokens": 1, "stop": ["\\ud83d"]}',
            "stop.0",
        ),
    ],
)
def test_a_lone_surrogate_in_a_request_is_a_400_naming_where(server, path, body, param):
    _, _, url, _ = server
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    answer = httpx.post(f"{url}{path}", content=body.encode(), headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "message": f"request body: {param} holds a lone surrogate (a \\ud800-\\udfff escape "
        "that is not half of a pair), which is not Unicode text",
        "type": "invalid_request_error",
        "code": "invalid_text",
        "param": param,
    }
