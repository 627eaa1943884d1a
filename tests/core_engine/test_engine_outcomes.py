"""Every request ends with one structured outcome; bad input never hurts its neighbours;
every failure path returns the pool and the metrics exactly to idle."""

import pytest
import torch

from core_engine.task import ErrorCode, FinishReason, SamplingParams
from core_engine.toy import char_tokenizer

from .reference import assert_idle, hf_greedy, make_engine

GOOD = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def outcome(result):
    return result.finish_reason, result.error.code if result.error else None


def test_bad_requests_fail_alone_in_a_mixed_batch(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, max_seq_len=64, page_size=4)
    prompts = [[1, 2, 3], [], list(range(1, 70)), [4, 5], [6, 7], [8, 9], [3, 999], [10, 11]]
    params = [
        GOOD,
        GOOD,
        GOOD,
        SamplingParams(max_tokens=0),
        SamplingParams(temperature=-0.5),
        SamplingParams(top_p=2.0),
        GOOD,
        SamplingParams(top_k=-1),
    ]
    results = engine.run_batch(prompts, params)
    assert [outcome(r) for r in results] == [
        (FinishReason.LENGTH, None),
        (FinishReason.ERROR, ErrorCode.EMPTY_PROMPT),
        (FinishReason.ERROR, ErrorCode.PROMPT_TOO_LONG),
        (FinishReason.ERROR, ErrorCode.INVALID_SAMPLING_PARAMS),
        (FinishReason.ERROR, ErrorCode.INVALID_SAMPLING_PARAMS),
        (FinishReason.ERROR, ErrorCode.INVALID_SAMPLING_PARAMS),
        (FinishReason.ERROR, ErrorCode.INVALID_TOKEN_ID),
        (FinishReason.ERROR, ErrorCode.INVALID_SAMPLING_PARAMS),
    ]
    assert results[0].output_ids == hf_greedy(hf, [1, 2, 3], 6)
    assert all(r.error.message for r in results[1:])
    assert all(r.output_ids == [] for r in results[1:])
    assert_idle(engine)


def test_request_that_can_never_fit_the_pool_is_kv_exhausted(qwen2_pair):
    ours, _ = qwen2_pair
    engine = make_engine(ours, page_size=4, num_pages=3)  # 12 token slots
    small, big = engine.run_batch([[1, 2], list(range(1, 13))], GOOD)
    assert outcome(small) == (FinishReason.LENGTH, None)
    assert outcome(big) == (FinishReason.ERROR, ErrorCode.KV_EXHAUSTED)
    # Fits at admission but cannot grow to max_tokens even alone: tokens so far are kept.
    grown = engine.run_batch([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=20))[0]
    assert outcome(grown) == (FinishReason.ERROR, ErrorCode.KV_EXHAUSTED)
    assert len(grown.output_ids) == 10  # 3 prompt + 9 computed + the last sampled token
    assert_idle(engine)


def test_non_finite_logits_fail_only_that_request(qwen2_pair, monkeypatch):
    ours, _ = qwen2_pair
    engine = make_engine(ours, page_size=4)
    original = engine.executor.forward_decode

    def poison_second_row(tasks):
        logits = original(tasks).clone()
        if len(tasks) > 1:
            logits[1] = float("nan")
        return logits

    monkeypatch.setattr(engine.executor, "forward_decode", poison_second_row)
    first, second = engine.run_batch([[1, 2, 3], [4, 5, 6]], GOOD)
    assert outcome(first) == (FinishReason.LENGTH, None)
    assert outcome(second) == (FinishReason.ERROR, ErrorCode.NON_FINITE_LOGITS)
    assert len(second.output_ids) == 1  # the prefill token before the bad step
    assert_idle(engine)


def test_exception_in_forward_fails_that_step_and_leaks_nothing(qwen2_pair, monkeypatch):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    calls = {"n": 0}
    original = engine.executor.forward_decode

    def flaky(tasks):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device fell over")
        return original(tasks)

    monkeypatch.setattr(engine.executor, "forward_decode", flaky)
    results = engine.run_batch([[1, 2, 3], [4, 5]], GOOD)
    for r in results:
        assert outcome(r) == (FinishReason.ERROR, ErrorCode.INTERNAL)
        assert "device fell over" in r.error.message
    assert_idle(engine)
    monkeypatch.setattr(engine.executor, "forward_decode", original)
    again = engine.run_batch([[1, 2, 3]], GOOD)[0]
    assert again.output_ids == hf_greedy(hf, [1, 2, 3], 6)


def test_exception_in_prefill_is_contained(qwen2_pair, monkeypatch):
    ours, _ = qwen2_pair
    engine = make_engine(ours, page_size=4)

    def broken(tasks):
        raise ValueError("bad kernel")

    monkeypatch.setattr(engine.executor, "forward_prefill", broken)
    (result,) = engine.run_batch([[1, 2, 3]], GOOD)
    assert outcome(result) == (FinishReason.ERROR, ErrorCode.INTERNAL)
    group = engine.run_batch([[1, 2, 3]], GOOD, samples_per_prompt=3)  # forks fail too
    assert [outcome(r) for r in group] == [(FinishReason.ERROR, ErrorCode.INTERNAL)] * 3
    assert_idle(engine)


def test_allocation_and_extension_failures_leave_no_trace(qwen2_pair):
    ours, _ = qwen2_pair
    engine = make_engine(ours, max_batch_size=3, page_size=4, num_pages=6)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    results = engine.run_batch([[1] * 7, [2] * 7, [3] * 7], params)  # must preempt
    assert all(r.finish_reason == FinishReason.LENGTH for r in results)
    assert engine.stats()["preemptions"] > 0
    assert_idle(engine)


def test_eos_and_stop_token_ids_stop_with_reason(qwen2_pair):
    ours, hf = qwen2_pair
    expected = hf_greedy(hf, [1, 2, 3], 8)
    eos = expected[3]
    engine = make_engine(ours, eos_token_ids=(eos,))
    stopped = engine.run_batch([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8))[0]
    assert stopped.finish_reason == FinishReason.STOP and stopped.stop_reason == eos
    assert stopped.output_ids == expected[: expected.index(eos) + 1]
    ignored = engine.run_batch(
        [[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )[0]
    assert ignored.output_ids == expected and ignored.finish_reason == FinishReason.LENGTH
    by_id = make_engine(ours).run_batch(
        [[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(expected[2],))
    )[0]
    assert by_id.output_ids == expected[:3] and by_id.stop_reason == expected[2]


def test_stop_wins_over_length_on_the_same_token(qwen2_pair):
    ours, hf = qwen2_pair
    expected = hf_greedy(hf, [1, 2, 3], 4)
    engine = make_engine(ours, eos_token_ids=(expected[3],))
    result = engine.run_batch([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))[0]
    assert result.finish_reason == FinishReason.STOP


def test_stop_strings_need_a_tokenizer_and_trim_the_text():
    from core_engine.model import build_model
    from core_engine.scheduler import EngineConfig, InferenceScheduler
    from core_engine.toy import tiny_config

    tokenizer = char_tokenizer()
    model = build_model(tiny_config("qwen2", vocab_size=len(tokenizer)))
    engine = InferenceScheduler(model, EngineConfig(), tokenizer)
    prompt = tokenizer("abc")["input_ids"]
    free_run = engine.run_batch([prompt], SamplingParams(temperature=0, max_tokens=12))[0]
    stop = free_run.text[3:5]
    assert len(stop) == 2
    result = engine.run_batch([prompt], SamplingParams(temperature=0, max_tokens=12, stop=(stop,)))[
        0
    ]
    assert result.finish_reason == FinishReason.STOP and result.stop_reason == stop
    assert result.text == free_run.text[: free_run.text.index(stop)]
    bare = make_engine(model)
    (no_tok,) = bare.run_batch([prompt], SamplingParams(stop=("x",)))
    assert outcome(no_tok) == (FinishReason.ERROR, ErrorCode.INVALID_SAMPLING_PARAMS)


def test_context_limit_ends_with_length(qwen2_pair):
    ours, _ = qwen2_pair
    engine = make_engine(ours, max_seq_len=10, page_size=4)
    result = engine.run_batch([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=50))[0]
    assert result.finish_reason == FinishReason.LENGTH
    assert len(result.prompt_ids) + len(result.output_ids) == 10


def test_abort_releases_everything(qwen2_pair):
    ours, _ = qwen2_pair
    engine = make_engine(ours, page_size=4)
    tasks = engine.make_tasks([[1, 2, 3], [4, 5, 6]], GOOD)
    engine.enqueue(tasks)
    engine.step()
    engine.abort(tasks[0], ErrorCode.CANCELLED, "user asked")
    assert tasks[0].finish_reason == FinishReason.ABORT
    assert tasks[0].error.code == ErrorCode.CANCELLED
    while not tasks[1].finished:
        engine.step()
    assert_idle(engine)


def test_run_batch_stops_at_the_step_its_caller_cancels(qwen2_pair):
    """`cancelled` is asked before every step: a request cancelled after 3 steps ends
    `abort/cancelled` with the tokens it had, and releases everything."""
    ours, _ = qwen2_pair
    engine = make_engine(ours, page_size=4)
    asked = []
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    results = engine.run_batch(
        [[1, 2, 3], [4, 5]], long, cancelled=lambda: asked.append(1) or len(asked) > 3
    )
    assert [outcome(r) for r in results] == [(FinishReason.ABORT, ErrorCode.CANCELLED)] * 2
    assert [len(r.output_ids) for r in results] == [3, 3]  # one prefill, two decode steps
    assert_idle(engine)
    assert len(engine.run_batch([[1, 2]], long)[0].output_ids) == 40  # never cancelled


def test_metrics_record_timings_and_outcomes(qwen2_pair):
    ours, _ = qwen2_pair
    engine = make_engine(ours)
    results = engine.run_batch([[1, 2, 3], []], GOOD)
    ok = results[0]
    assert ok.queue_wait_s >= 0 and ok.time_to_first_token_s > 0 and ok.decode_tokens_per_s > 0
    stats = engine.stats()
    assert stats["finished"] == {"length": 1, "error": 1}
    assert stats["errors"] == {"empty_prompt": 1}
    assert stats["tokens_generated"] == 6
    assert stats["running"] == stats["waiting"] == stats["in_flight"] == 0
    assert {"pages_used", "pages_free", "pages_cached", "preemptions"} <= set(stats)
    assert_idle(engine)


def test_samples_per_prompt_must_be_positive(qwen2_pair):
    ours, _ = qwen2_pair
    with pytest.raises(ValueError, match="samples_per_prompt"):
        make_engine(ours).run_batch([[1]], GOOD, samples_per_prompt=0)
    with pytest.raises(ValueError, match="2 prompts x 1 samples but 3 sampling params"):
        make_engine(ours).run_batch([[1], [2]], [GOOD] * 3)


def test_seeded_sampling_is_reproducible(qwen2_pair):
    ours, _ = qwen2_pair
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=5, ignore_eos=True)
    a = make_engine(ours).run_batch([[1, 2], [3, 4]], params)
    b = make_engine(ours, kv_strategy="contiguous").run_batch([[3, 4]], params)
    assert a[1].output_ids == b[0].output_ids
    assert torch.allclose(torch.tensor(a[1].output_logprobs), torch.tensor(b[0].output_logprobs))
