"""The OpenAI-compatible HTTP server, driven by the official `openai` client over real HTTP."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import transformers
from starlette.testclient import TestClient

from core_engine.engine import load_engine
from core_engine.network import create_app
from core_engine.network.__main__ import parse_args
from core_engine.network.detok import IncrementalText
from core_engine.scheduler import EngineConfig, InferenceScheduler
from core_engine.task import SamplingParams
from core_engine.toy import save_tiny_checkpoint

from .http_server import running_server
from .reference import hf_logprobs

MODEL = "tiny"
CONTEXT = 4096
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
HANG_GUARD_S = 120  # a wait for a state of the engine or a request (quiet: well under 1 s)
LONG = 4000  # max_tokens of a request the client leaves: it must end cut short, cancelled


@dataclass
class Served:
    engine: InferenceScheduler
    url: str
    client: openai.OpenAI
    path: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), max_position_embeddings=CONTEXT)
    engine = load_engine(path, EngineConfig(max_batch_size=8))
    app = create_app(engine, MODEL)
    with running_server(app) as url:
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=HANG_GUARD_S
        )
        yield Served(engine, url, client, path)
        client.close()
    assert not app.state.serving_loop.running, "shutdown must stop the serving loop"
    assert engine.is_idle()


def wait_idle(engine: InferenceScheduler, timeout: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not engine.is_idle():
        assert time.monotonic() < deadline, "the engine did not return to idle"
        time.sleep(0.01)


def extra(model, name: str):
    return (model.model_extra or {})[name]


# --------------------------------------------------------------------------- completions
def test_completion_length_usage_and_version(served):
    r = served.client.completions.create(model=MODEL, prompt="hello", max_tokens=7, **GREEDY)
    (choice,) = r.choices
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == 5
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == 12
    assert extra(r, "policy_version") == served.engine.version
    assert extra(choice, "policy_version") == served.engine.version


def test_completion_logprobs_are_the_models_at_temperature_zero(served):
    r = served.client.completions.create(
        model=MODEL, prompt="abc", max_tokens=6, logprobs=1, **GREEDY
    )
    tok = served.engine.tokenizer
    (ref,) = served.engine.run_batch(
        [tok.encode("abc")], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    )
    lp = r.choices[0].logprobs
    assert lp.tokens == [tok.decode([t]) for t in ref.output_ids]
    hf = transformers.AutoModelForCausalLM.from_pretrained(served.path).float().eval()
    truth = hf_logprobs(hf, tok.encode("abc"), ref.output_ids).tolist()
    assert lp.token_logprobs == pytest.approx(truth, abs=1e-4)
    assert all(v < 0 for v in lp.token_logprobs), "not the greedy point mass's 0.0"
    assert [next(iter(d.values())) for d in lp.top_logprobs] == pytest.approx(lp.token_logprobs)
    assert r.choices[0].text == ref.text


def test_token_id_prompts_and_batches(served):
    ids = served.engine.tokenizer.encode("hello")
    by_ids = served.client.completions.create(model=MODEL, prompt=ids, max_tokens=4, **GREEDY)
    by_text = served.client.completions.create(
        model=MODEL, prompt=["hello", "abc"], n=2, max_tokens=4, **GREEDY
    )
    assert [c.index for c in by_text.choices] == [0, 1, 2, 3]
    assert by_text.choices[0].text == by_text.choices[1].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == 5 + 3
    assert by_text.usage.completion_tokens == 16


def test_n_samples_and_seed_reproducibility(served):
    def sample():
        r = served.client.completions.create(
            model=MODEL, prompt="hi", n=3, seed=7, temperature=1.0, max_tokens=12
        )
        assert [c.index for c in r.choices] == [0, 1, 2]
        return [c.text for c in r.choices]

    first = sample()
    assert first == sample()
    assert len(set(first)) > 1, "the n samples use different seeds"


def test_stop_string_finishes_with_stop_and_trims(served):
    full = served.client.completions.create(model=MODEL, prompt="hey", max_tokens=24, **GREEDY)
    text = full.choices[0].text
    stop = text[8:10]
    expected = text[: text.find(stop)]
    r = served.client.completions.create(
        model=MODEL, prompt="hey", max_tokens=24, stop=[stop, "@@never"], **GREEDY
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == expected
    assert extra(r.choices[0], "stop_reason") == stop
    assert r.usage.completion_tokens < 24
    chunks = list(
        served.client.completions.create(
            model=MODEL, prompt="hey", max_tokens=24, stop=stop, stream=True, **GREEDY
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    wait_idle(served.engine)


def test_streaming_completion_matches_non_streaming(served):
    ref = served.client.completions.create(
        model=MODEL, prompt="stream", max_tokens=10, logprobs=0, **GREEDY
    )
    stream = served.client.completions.create(
        model=MODEL,
        prompt="stream",
        max_tokens=10,
        n=2,
        logprobs=0,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    texts, logprobs, finish = ["", ""], [[], []], [None, None]
    chunks = list(stream)
    for chunk in chunks[:-1]:
        assert extra(chunk, "policy_version") == served.engine.version
        (c,) = chunk.choices
        texts[c.index] += c.text
        if c.logprobs:
            logprobs[c.index] += c.logprobs.token_logprobs
        finish[c.index] = finish[c.index] or c.finish_reason
    assert texts == [ref.choices[0].text] * 2
    assert finish == ["length", "length"]
    for lps in logprobs:
        assert lps == pytest.approx(ref.choices[0].logprobs.token_logprobs, abs=1e-4)
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 20


# --------------------------------------------------------------------------- chat
def test_chat_completion_with_logprobs(served):
    r = served.client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, logprobs=True, **GREEDY
    )
    tok = served.engine.tokenizer
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(tok.encode(prompt, add_special_tokens=False))
    assert r.usage.completion_tokens == len(choice.logprobs.content) == 6
    entry = choice.logprobs.content[0]
    assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
    assert extra(r, "policy_version") == served.engine.version


def test_chat_streaming_matches_non_streaming(served):
    ref = served.client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, **GREEDY
    )
    chunks = list(
        served.client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == ref.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8
    assert all(extra(c, "policy_version") == served.engine.version for c in chunks)


def test_default_chat_length_is_bounded_by_the_context(served):
    r = served.client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, **GREEDY
    )
    assert r.usage.completion_tokens == 3


# --------------------------------------------------------------------------- other endpoints
def test_models_and_health(served):
    (card,) = served.client.models.list().data
    assert card.id == MODEL
    assert extra(card, "policy_version") == served.engine.version
    health = httpx.get(f"{served.url}/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "policy_version": served.engine.version}


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost:8000", 200),
        ("LOCALHOST", 200),
        ("127.0.0.1", 200),
        ("[::1]:9", 200),
        ("rebound.example", 421),
        ("rebound.example:8000", 421),
        ("127.0.0.1.rebound.example", 421),
        ("[::1", 421),
    ],
)
def test_a_keyless_loopback_server_answers_only_loopback_host_names(served, host, status):
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 still sends its own Host."""
    for path in ("/v1/models", "/health"):
        r = httpx.get(f"{served.url}{path}", headers={"Host": host})
        assert r.status_code == status
        if status == 421:
            assert r.json()["error"]["code"] == "invalid_host"


def test_a_server_bound_beyond_loopback_checks_no_host(served):
    app = create_app(served.engine, MODEL, loopback=False)  # --allow-unauthenticated-public
    client = TestClient(app, base_url="http://engine.example.com")  # no lifespan: no 2nd loop
    assert client.get("/v1/models").status_code == 200


def test_metrics_are_prometheus_text(served):
    served.client.completions.create(model=MODEL, prompt="m", max_tokens=2)
    r = httpx.get(f"{served.url}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in r.text.splitlines():
        if line.startswith("#"):
            assert re.fullmatch(r"# TYPE \w+ (counter|gauge)", line)
            continue
        name, value = line.rsplit(" ", 1)
        assert re.fullmatch(r'\w+(\{\w+="[^"]*"\})?', name)
        samples[name] = float(value)
    assert samples["rlw_engine_running"] == 0
    assert samples["rlw_engine_policy_version"] == served.engine.version
    assert samples["rlw_engine_tokens_generated_total"] > 0
    assert sum(v for k, v in samples.items() if k.startswith("rlw_engine_finished_total")) > 0


def test_policy_version_follows_the_engine(served):
    with served.engine.lock:
        served.engine.version += 1
    r = served.client.completions.create(model=MODEL, prompt="v", max_tokens=2)
    chunks = list(
        served.client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, stream=True
        )
    )
    assert extra(r, "policy_version") == served.engine.version
    assert {extra(c, "policy_version") for c in chunks} == {served.engine.version}


def test_stream_chunks_carry_the_version_the_task_ran_under(served):
    """A weight update between submission and admission: chunks name the new version."""
    engine = served.engine
    wait_idle(engine)
    chunks = []
    with engine.lock:  # the serving loop cannot admit the request yet
        before = engine.version
        thread = threading.Thread(
            target=lambda: chunks.extend(
                served.client.completions.create(
                    model=MODEL, prompt="v", max_tokens=4, stream=True, **GREEDY
                )
            )
        )
        thread.start()
        deadline = time.monotonic() + HANG_GUARD_S
        while engine.metrics.in_flight == 0:
            assert time.monotonic() < deadline, "the request was not submitted"
            time.sleep(0.005)
        engine.version = before + 1
    thread.join(timeout=HANG_GUARD_S)
    assert chunks and {extra(c, "policy_version") for c in chunks} == {before + 1}


# --------------------------------------------------------------------------- bad requests
BAD_REQUESTS = [
    ("completions", {"model": "nope", "prompt": "x"}, 404, "model_not_found", "model"),
    ("completions", {"model": MODEL}, 400, "missing_required_parameter", "prompt"),
    ("completions", {"model": MODEL, "prompt": ""}, 400, "empty_prompt", "prompt"),
    ("completions", {"model": MODEL, "prompt": "", "stream": True}, 400, "empty_prompt", "prompt"),
    ("completions", {"model": MODEL, "prompt": "x" * CONTEXT}, 400, "prompt_too_long", None),
    ("completions", {"model": MODEL, "prompt": [1, 99999]}, 400, "invalid_token_id", None),
    ("completions", {"model": MODEL, "prompt": [[1], "x", 3]}, 400, "invalid_value", None),
    ("completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, None, "temperature"),
    ("completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, None, "top_p"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, None, None),
    ("completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "invalid_value", "n"),
    ("completions", {"model": MODEL, "prompt": "x", "logprobs": 5}, 400, None, "logprobs"),
    ("completions", {"model": MODEL, "prompt": "x", "stop": ""}, 400, None, "stop"),
    ("completions", {"model": MODEL, "prompt": "x", "seed": "1"}, 400, None, "seed"),
    (
        "completions",
        {"model": MODEL, "prompt": "x", "logit_bias": {"5": 1}},
        400,
        "unsupported_parameter",
        "logit_bias",
    ),
    (
        "completions",
        {"model": MODEL, "prompt": "x", "presence_penalty": 1},
        400,
        "unsupported_parameter",
        None,
    ),
    (
        "completions",
        {"model": MODEL, "prompt": "x", "frobnicate": 1},
        400,
        "unsupported_parameter",
        "frobnicate",
    ),
    ("completions", {"model": MODEL, "prompt": "x", "stream_options": {}}, 400, None, None),
    ("chat/completions", {"model": MODEL}, 400, "missing_required_parameter", "messages"),
    ("chat/completions", {"model": MODEL, "messages": []}, 400, "invalid_value", "messages"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "tool"}]}, 400, None, None),
    ("chat/completions", {"model": MODEL, "messages": MESSAGES, "tools": [{}]}, 400, None, None),
    (
        "chat/completions",
        {"model": MODEL, "messages": MESSAGES, "top_logprobs": 3},
        400,
        None,
        None,
    ),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "code", "param"), BAD_REQUESTS)
def test_bad_requests_get_openai_errors_and_serving_continues(
    served, endpoint, body, status, code, param
):
    r = httpx.post(f"{served.url}/v1/{endpoint}", json=body, timeout=HANG_GUARD_S)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["message"] and error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    ok = served.client.completions.create(model=MODEL, prompt="ok", max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_unsupported_parameter_names_the_parameter(served):
    with pytest.raises(openai.BadRequestError) as info:
        served.client.completions.create(model=MODEL, prompt="x", logit_bias={"5": 1})
    assert info.value.code == "unsupported_parameter"
    assert info.value.param == "logit_bias"
    assert "logit_bias" in info.value.message


def test_malformed_json_is_a_400(served):
    r = httpx.post(
        f"{served.url}/v1/completions",
        content=b'{"model": "tiny", "prompt": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"


def test_engine_failures_are_errors_and_serving_continues(served, monkeypatch):
    real = served.engine.executor.execute_decode

    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(served.engine.executor, "execute_decode", fail)
    with pytest.raises(openai.InternalServerError) as info:
        served.client.completions.create(model=MODEL, prompt="x", max_tokens=5)
    assert info.value.code == "internal" and "boom" in info.value.message
    stream = served.client.completions.create(model=MODEL, prompt="x", max_tokens=5, stream=True)
    with pytest.raises(openai.APIError, match="boom"):
        list(stream)
    monkeypatch.setattr(served.engine.executor, "execute_decode", real)
    wait_idle(served.engine)
    ok = served.client.completions.create(model=MODEL, prompt="x", max_tokens=5, **GREEDY)
    assert ok.choices[0].finish_reason == "length"


# --------------------------------------------------------------------------- disconnects
def _cancelled_count(engine: InferenceScheduler) -> tuple[int, int]:
    snap = engine.metrics.snapshot()
    return snap["errors"].get("cancelled", 0), snap["tokens_generated"]


def test_stream_disconnect_cancels_the_engine_task(served):
    wait_idle(served.engine)
    cancelled, tokens = _cancelled_count(served.engine)
    body = {"model": MODEL, "prompt": "long", "max_tokens": LONG, "stream": True}
    body["ignore_eos"] = True
    with (
        httpx.Client(timeout=HANG_GUARD_S) as http,
        http.stream("POST", f"{served.url}/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert "policy_version" in json.loads(first.removeprefix("data: "))
    wait_idle(served.engine)
    cancelled_after, tokens_after = _cancelled_count(served.engine)
    assert cancelled_after == cancelled + 1
    # cut short (a few tokens here), never decoded to its end: how soon is a speed, not asserted
    assert tokens_after - tokens < LONG, "decoding went on after the client left"


def test_non_streaming_disconnect_cancels_the_engine_task(served):
    wait_idle(served.engine)
    cancelled, tokens = _cancelled_count(served.engine)
    body = {"model": MODEL, "prompt": "long", "max_tokens": LONG, "ignore_eos": True, "n": 2}
    with pytest.raises(httpx.ReadTimeout):  # the client leaves after waiting 0.2 s for a reply
        timeout = httpx.Timeout(HANG_GUARD_S, read=0.2)
        httpx.post(f"{served.url}/v1/completions", json=body, timeout=timeout)
    wait_idle(served.engine)
    cancelled_after, tokens_after = _cancelled_count(served.engine)
    assert cancelled_after == cancelled + 2
    assert tokens_after - tokens < 2 * LONG  # cut short (a few hundred here), not run to the end


# --------------------------------------------------------------------------- streaming text
def test_incremental_text_never_releases_a_stop_string(served):
    tok = served.engine.tokenizer
    text = IncrementalText(tok, ["XYZ", "XQ"])
    released = [text.push(t) for t in tok.encode("abXYcdXY")]
    assert "".join(released) == "abXYcd"
    assert released[2:4] == ["", ""], "a possible stop-string start is held back"
    assert text.finish("abXYcdXYmore") == "XYmore"


def test_command_line_binds_localhost_by_default():
    args = parse_args(["--model", "/ckpt", "--max-batch-size", "4"])
    assert (args.host, args.port, args.kv_strategy, args.max_batch_size) == (
        "127.0.0.1",
        8000,
        "paged",
        4,
    )


@pytest.mark.parametrize(
    ("odd", "status"),
    [({"extra_body": {"top_k": 2**63}}, 200), ({"temperature": 1e-38}, 400)],
    ids=["top_k=2**63 runs", "temperature=1e-38 refused"],
)
def test_an_odd_request_prefilled_with_a_good_one_leaves_it_intact(served, odd, status):
    wait_idle(served.engine)
    expected = served.client.completions.create(model=MODEL, prompt="good", max_tokens=6, **GREEDY)
    outcome: dict[str, object] = {}

    def call(name: str, **kwargs) -> None:
        try:
            outcome[name] = served.client.completions.create(model=MODEL, max_tokens=6, **kwargs)
        except openai.APIStatusError as exc:
            outcome[name] = exc

    with served.engine.lock:  # both requests are admitted in the same step
        threads = [
            threading.Thread(target=call, args=("odd",), kwargs={"prompt": "odd", **odd}),
            threading.Thread(target=call, args=("good",), kwargs={"prompt": "good", **GREEDY}),
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + HANG_GUARD_S
        while served.engine.metrics.in_flight < 2:
            assert time.monotonic() < deadline, "the requests were not submitted"
            time.sleep(0.005)
    for thread in threads:
        thread.join(timeout=HANG_GUARD_S)
    assert outcome["good"].choices[0].text == expected.choices[0].text
    if status == 200:
        assert outcome["odd"].choices[0].finish_reason in ("stop", "length")
    else:
        assert outcome["odd"].status_code == 400
        assert outcome["odd"].code == "invalid_sampling_params"
    wait_idle(served.engine)
