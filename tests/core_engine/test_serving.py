"""The background serving loop: streaming, cancel, bad input and faults never stop it."""

import threading

import pytest

from core_engine.serving import ServingLoop, TokenEvent
from core_engine.task import ErrorCode, FinishReason, GenerationResult, SamplingParams

from .reference import assert_idle, hf_greedy, make_engine

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture
def serving(qwen2_pair):
    loop = ServingLoop(make_engine(qwen2_pair[0], page_size=4))
    loop.start()
    yield loop
    loop.stop()


def test_stream_yields_tokens_then_the_result(serving, qwen2_pair):
    (handle,) = serving.submit([1, 2, 3], GREEDY)
    events = list(handle.stream(timeout=30))
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[-1], GenerationResult)
    assert tokens == events[-1].output_ids == hf_greedy(qwen2_pair[1], [1, 2, 3], 8)
    assert [e.index for e in events[:-1]] == list(range(8))


def test_loop_survives_bad_requests_and_keeps_serving(serving):
    bad = [
        serving.submit([], GREEDY)[0],
        serving.submit([1, 10_000], GREEDY)[0],
        serving.submit([1], SamplingParams(max_tokens=-3))[0],
        serving.submit([1] * 600, GREEDY)[0],
    ]
    codes = [h.result(timeout=30).error.code for h in bad]
    assert codes == [
        ErrorCode.EMPTY_PROMPT,
        ErrorCode.INVALID_TOKEN_ID,
        ErrorCode.INVALID_SAMPLING_PARAMS,
        ErrorCode.PROMPT_TOO_LONG,
    ]
    good = serving.submit([5, 6], GREEDY)[0].result(timeout=30)
    assert good.finish_reason == FinishReason.LENGTH


def test_loop_survives_an_exception_inside_a_step(serving, monkeypatch):
    original = serving.engine.executor.forward_prefill
    failed = threading.Event()

    def fail_once(tasks):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("boom")
        return original(tasks)

    monkeypatch.setattr(serving.engine.executor, "forward_prefill", fail_once)
    broken = serving.submit([1, 2], GREEDY)[0].result(timeout=30)
    assert broken.finish_reason == FinishReason.ERROR
    assert broken.error.code == ErrorCode.INTERNAL and "boom" in broken.error.message
    assert serving.running
    assert serving.submit([1, 2], GREEDY)[0].result(timeout=30).finish_reason == "length"


def test_cancel_ends_a_running_request_and_frees_it(serving):
    (handle,) = serving.submit([1, 2, 3], SamplingParams(max_tokens=100_000, ignore_eos=True))
    stream = handle.stream(timeout=30)
    next(stream)  # running now
    handle.cancel()
    result = handle.result(timeout=30)
    assert result.finish_reason == FinishReason.ABORT
    assert result.error.code == ErrorCode.CANCELLED
    assert len(result.output_ids) < 400
    serving.stop()
    assert_idle(serving.engine)


def test_group_submission_shares_the_prompt(serving):
    handles = serving.submit([7, 8, 9, 10, 11], SamplingParams(max_tokens=4, seed=3), n=3)
    results = [h.result(timeout=30) for h in handles]
    assert [r.num_cached_prompt_tokens for r in results] == [0, 5, 5]
    assert len({tuple(r.output_ids) for r in results}) > 1


def test_stop_aborts_what_is_left(qwen2_pair):
    engine = make_engine(qwen2_pair[0])
    loop = ServingLoop(engine)
    loop.start()
    (handle,) = loop.submit([1, 2], SamplingParams(max_tokens=100_000, ignore_eos=True))
    next(handle.stream(timeout=30))
    loop.stop()
    result = handle.result(timeout=5)
    assert result.finish_reason == FinishReason.ABORT
    assert_idle(engine)


def test_metrics_are_readable_while_the_loop_writes(serving):
    handles = [serving.submit([i + 1, i + 2], GREEDY)[0] for i in range(6)]
    snapshots = []
    while not all(h._result for h in handles):
        snapshots.append(serving.engine.stats())
        for h in handles:
            if h._result is None:
                h.result(timeout=30)
                break
    assert serving.engine.stats()["finished"]["length"] == 6
    assert serving.engine.metrics.in_flight == 0
