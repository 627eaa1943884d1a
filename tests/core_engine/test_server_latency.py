"""`/health` answers at once while the heaviest requests the limits let in are served
(issue 24, item 2).

Each heavy request below is an input that once held the server's event loop: a 2 MiB prompt
(tokenized on the loop before any limit: three delayed `/health` by 18.5 s), 64 prompts at the
character limit (tokenized), 65,000 empty chat messages (validated one by one, then a garbage
collection of the whole heap: 250 ms), streams with the most and the longest stop strings
(every token decoded the whole output and scanned every stop string: four such requests
delayed `/health` by 40.7 s), and a response with the log-probs of 64 samples (decoded and
serialized on the loop). This mix delayed `/health` by up to 3.8 s before the fix.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import pytest

from core_engine.engine import load_engine
from core_engine.network import create_app
from core_engine.network.limits import ServerLimits
from core_engine.scheduler import EngineConfig
from core_engine.toy import save_tiny_checkpoint

from .http_server import running_server

MODEL = "tiny"
CONTEXT = 256
LIMITS = ServerLimits()  # the defaults
PROMPT = "hey"
MAX_TOKENS = CONTEXT - 8  # room for the prompt's tokens
# The goal is 100 ms. On a 2-core machine that also runs the engine, the clients and
# the tokenizing threads, /health is one short loop callback, but each of its GIL hand-overs
# may wait a 5 ms switch interval per busy thread, and a 2 MiB JSON body is parsed on the loop
# in one C call (10-25 ms). Measured here: p95 7-13 ms, max 23-71 ms (before: max 3.8 s).
# So the goal bounds the 95th percentile, and a single poll may take 2.5 times as long.
P95_BOUND_S = 0.100
MAX_BOUND_S = 0.250


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), max_position_embeddings=CONTEXT)
    engine = load_engine(path, EngineConfig(max_batch_size=256, kv_cache_bytes=64 << 20))
    with running_server(create_app(engine, MODEL, limits=LIMITS)) as base:
        yield base


def send(url: str, path: str, body: bytes) -> tuple[int, bytes]:
    """POST a JSON body; the status and the raw response (a stream read to its end)."""
    headers = {"content-type": "application/json"}
    with httpx.stream("POST", url + path, content=body, headers=headers, timeout=120) as r:
        return r.status_code, b"".join(r.iter_raw())


def stop_strings(url: str) -> list[str]:
    """The most and the longest stop strings: each a long stretch of what the model writes
    greedily, so a stop string is always partly matched and text is held back, and none ever
    completes (`~` is outside the vocabulary)."""
    greedy = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    _, raw = send(url, "/v1/completions", json.dumps({**greedy, "ignore_eos": True}).encode())
    text = json.loads(raw)["choices"][0]["text"]
    size = LIMITS.max_stop_chars - 1
    return [((text * 2)[i * 16 :] + text)[:size] + "~" for i in range(LIMITS.max_stop)]


def heavy_requests(stops: list[str]) -> dict[str, tuple[str, bytes]]:
    """Name -> (path, JSON body) of each heavy request, serialized before the measurement."""
    completions, chat = "/v1/completions", "/v1/chat/completions"
    at_char_limit = "ab" * (CONTEXT * LIMITS.max_chars_per_token // 2)
    samples = {"n": 4, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    stream = {"prompt": [PROMPT] * 12, **samples, "stop": stops, "stream": True}
    requests = {
        **{
            f"2 MiB prompt {i}": (completions, {"prompt": "a" * (LIMITS.max_body_bytes - 100)})
            for i in range(3)
        },
        "prompts at the char limit": (completions, {"prompt": [at_char_limit] * 64}),
        "65,000 messages": (chat, {"messages": [{"role": "user", "content": ""}] * 65_000}),
        # temperature 0: every stream's text is held back to the end; 1: released as it comes
        **{f"stop stream {i}": (completions, {**stream, "temperature": i % 2}) for i in range(4)},
        "log-prob samples": (completions, {"prompt": [PROMPT] * 16, **samples, "logprobs": 1}),
    }
    return {
        name: (path, json.dumps({"model": MODEL, **body}, separators=(",", ":")).encode())
        for name, (path, body) in requests.items()
    }


def error_of(raw: bytes) -> tuple[str, str]:
    error = json.loads(raw)["error"]
    return error["code"], error["param"]


def finish_reasons(stream: bytes) -> list[str]:
    """The finish reasons of a completions event stream, which must end with `[DONE]`."""
    events = [line[6:] for line in stream.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    return [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]


def test_health_answers_at_once_under_the_heaviest_legal_requests(url):
    requests = heavy_requests(stop_strings(url))
    outcomes: dict[str, tuple[int, bytes]] = {}
    threads = [
        threading.Thread(
            target=lambda name=name, path=path, body=body: outcomes.__setitem__(
                name, send(url, path, body)
            )
        )
        for name, (path, body) in requests.items()
    ]
    latencies = []
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/health").status_code == 200
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    for thread in threads:
        thread.join()

    for name in [f"2 MiB prompt {i}" for i in range(3)] + ["prompts at the char limit"]:
        status, raw = outcomes[name]
        assert (status, *error_of(raw)) == (400, "prompt_too_long", "prompt"), name
    status, raw = outcomes["65,000 messages"]
    assert (status, *error_of(raw)) == (400, "invalid_value", "messages")
    for i in range(4):
        status, raw = outcomes[f"stop stream {i}"]
        assert status == 200 and finish_reasons(raw) == ["length"] * 48
    status, raw = outcomes["log-prob samples"]
    choices = json.loads(raw)["choices"]
    assert status == 200 and len(choices) == 64
    assert {len(c["logprobs"]["tokens"]) for c in choices} == {MAX_TOKENS}
    latencies.sort()
    p95 = latencies[int(0.95 * len(latencies))]
    summary = (
        f"{len(latencies)} polls: median {statistics.median(latencies) * 1e3:.1f} ms, "
        f"p95 {p95 * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms"
    )
    print(summary)
    assert len(latencies) >= 50, summary  # the heavy requests kept the server busy a while
    assert p95 < P95_BOUND_S, summary
    assert latencies[-1] < MAX_BOUND_S, summary
