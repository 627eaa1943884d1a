"""`/health` answers while the heaviest requests the limits let in are served (issue 24,
item 2), asserted by where the heavy work runs and by order, never by a number of milliseconds
(issue 32: a test asserts behaviour, not speed; `benchmarks/bench_server_latency.py` measures
the latency).

Each heavy request below is an input that once held the server's event loop: a 2 MiB prompt
(tokenized on the loop before any limit: three delayed `/health` by 18.5 s), 64 prompts at the
character limit (tokenized), 65,000 empty chat messages (validated one by one, then a garbage
collection of the whole heap: 250 ms), streams with the most and the longest stop strings
(every token decoded the whole output and scanned every stop string: four such requests
delayed `/health` by 40.7 s), and a response with the log-probs of 64 samples (decoded and
serialized on the loop). This mix delayed `/health` by up to 3.8 s before the fix.

While the mix is served, the functions doing that work (tokenizing, detokenizing, stop
matching, serializing a response body) are probed: every call must run on a thread with no
event loop, and the first call of each kind is held inside the function until `/health` has
answered: had it run on the loop, `/health` could not answer before it returned.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from core_engine.engine import load_engine
from core_engine.network import app as app_module
from core_engine.network import create_app
from core_engine.network.limits import ServerLimits
from core_engine.network.stops import StopMatcher
from core_engine.scheduler import EngineConfig
from core_engine.toy import save_tiny_checkpoint

from .http_server import running_server

MODEL = "tiny"
CONTEXT = 256
LIMITS = ServerLimits()  # the defaults
PROMPT = "hey"
MAX_TOKENS = CONTEXT - 8  # room for the prompt's tokens
# Hang guards, not speed bounds. A held call waits at most this long for the test to release
# it once `/health` has answered (a round trip: milliseconds; about a second on a loaded
# machine): only a call that blocks the event loop waits it out, and the test then fails.
HOLD_LIMIT_S = 60.0
REQUESTS_LIMIT_S = 600.0  # the whole mix: about 10 s on a quiet 2-core machine
HEAVY_KINDS = ("tokenize", "detokenize", "stop matching", "response body")


@dataclass
class Hold:
    """The next matching call of one kind waits inside the function until `release`."""

    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    returned: threading.Event = field(default_factory=threading.Event)
    waited_out: bool = False  # the hang guard released it, not the test


@dataclass
class Probe:
    """Where each heavy call ran (kind -> [ran on an event loop's thread?]), and the holds."""

    engine_threads: set[int]  # the threads that step the engine (none is an event loop)
    calls: dict[str, list[bool]] = field(default_factory=lambda: defaultdict(list))
    holds: dict[str, Hold] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wrap(self, kind: str, fn: Callable[..., Any], holdable: Callable[..., bool]) -> Any:
        @functools.wraps(fn)
        def probed(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.calls[kind].append(_on_event_loop())
                hold = self.holds.get(kind)
                # held: the first call of the kind made for a request (not by the engine)
                held = not (
                    hold is None
                    or hold.entered.is_set()
                    or threading.get_ident() in self.engine_threads
                    or not holdable(*args, **kwargs)
                )
                if held:
                    hold.entered.set()
            if not held:
                return fn(*args, **kwargs)
            hold.waited_out = not hold.released.wait(HOLD_LIMIT_S)
            try:
                return fn(*args, **kwargs)
            finally:
                hold.returned.set()

        return probed


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), max_position_embeddings=CONTEXT)
    engine = load_engine(path, EngineConfig(max_batch_size=256, kv_cache_bytes=64 << 20))
    with running_server(create_app(engine, MODEL, limits=LIMITS)) as base:
        yield base, engine


def send(url: str, path: str, body: bytes) -> tuple[int, bytes]:
    """POST a JSON body; the status and the raw response (a stream read to its end)."""
    headers = {"content-type": "application/json"}
    with httpx.stream(
        "POST", url + path, content=body, headers=headers, timeout=REQUESTS_LIMIT_S
    ) as r:
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
    """Name -> (path, JSON body) of each heavy request, serialized before they are sent."""
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


@pytest.fixture
def probe(served, monkeypatch) -> Iterator[Probe]:
    """The heavy functions of the server, probed: a tokenizer call, a stop matcher's feed and
    the serialization of a non-streaming body."""
    _, engine = served
    engine_threads: set[int] = set()
    engine.add_listener(lambda _events: engine_threads.add(threading.get_ident()))
    probe = Probe(engine_threads)
    tokenizer = engine.tokenizer
    at_limit = CONTEXT * LIMITS.max_chars_per_token

    def long_text(text: Any, *_: Any, **__: Any) -> bool:
        return isinstance(text, str) and len(text) >= at_limit

    def anything(*_: Any, **__: Any) -> bool:
        return True

    for name, kind, holdable in (
        ("encode", "tokenize", long_text),
        ("decode", "detokenize", anything),
    ):
        monkeypatch.setattr(tokenizer, name, probe.wrap(kind, getattr(tokenizer, name), holdable))
    monkeypatch.setattr(
        StopMatcher, "feed", probe.wrap("stop matching", StopMatcher.feed, anything)
    )
    body = probe.wrap("response body", app_module.json_bytes, anything)
    monkeypatch.setattr(app_module, "json_bytes", body)
    yield probe
    for hold in probe.holds.values():  # whatever happened, nothing stays held
        hold.released.set()


def test_health_answers_while_each_heavy_call_of_the_heaviest_legal_requests_runs(served, probe):
    url, _ = served
    requests = heavy_requests(stop_strings(url))
    probe.holds.update({kind: Hold() for kind in HEAVY_KINDS})
    probe.calls.clear()
    outcomes: dict[str, tuple[int, bytes]] = {}
    threads = [
        threading.Thread(
            target=lambda name=name, path=path, body=body: outcomes.__setitem__(
                name, send(url, path, body)
            ),
            daemon=True,
        )
        for name, (path, body) in requests.items()
    ]
    answered_while_held: dict[str, bool] = {}
    with httpx.Client(base_url=url, timeout=REQUESTS_LIMIT_S) as client:
        assert client.get("/health").status_code == 200
        for thread in threads:
            thread.start()
        for kind, hold in probe.holds.items():
            # the heavy requests need these calls: the hang guard bounds a server that hangs
            assert hold.entered.wait(REQUESTS_LIMIT_S), f"no {kind} call came"
            health = client.get("/health")
            # answered while the held call was still inside the function, waiting for us
            answered_while_held[kind] = not hold.returned.is_set() and not hold.waited_out
            hold.released.set()
            assert health.status_code == 200 and health.json()["status"] == "ok"
    for thread in threads:
        thread.join(timeout=REQUESTS_LIMIT_S)
    assert not any(thread.is_alive() for thread in threads), "a heavy request hangs"

    # every heavy call ran on a thread with no event loop, and each kind was called
    for kind in HEAVY_KINDS:
        assert probe.calls[kind], f"no {kind} call: the probe misses the server's path"
        on_loop = sum(probe.calls[kind])
        assert not on_loop, f"{on_loop} of {len(probe.calls[kind])} {kind} calls ran on the loop"
    # and the loop answered /health while each kind of heavy call was in progress
    blocked = [kind for kind, answered in answered_while_held.items() if not answered]
    assert not blocked, f"/health was not answered while these calls were held: {blocked}"

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
