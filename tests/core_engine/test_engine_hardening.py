"""The per-request rule: a request's bad input or numeric fault ends that request alone, with
its error code; its neighbours' results are unchanged (HF greedy as the truth); nothing escapes
`run_batch`; the pool returns to idle."""

import numpy as np
import pytest
import torch

from core_engine.serving import ServingLoop
from core_engine.task import ErrorCode, FinishReason, SamplingParams
from core_engine.toy import char_tokenizer

from .reference import assert_idle, hf_greedy, hf_logprobs, make_engine, make_pair

GOOD = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
NEIGHBOURS = [[1, 2, 3], [4, 5, 6, 7]]
BAD = ErrorCode.INVALID_SAMPLING_PARAMS

# Every sampling field, out of the range the sampler executes (or of the wrong type).
BAD_PARAMS = {
    "max_tokens=0": {"max_tokens": 0},
    "max_tokens=True": {"max_tokens": True},
    "max_tokens=2.0": {"max_tokens": 2.0},
    "temperature=-1": {"temperature": -1.0},
    "temperature=nan": {"temperature": float("nan")},
    "temperature=inf": {"temperature": float("inf")},
    "temperature=1e-38": {"temperature": 1e-38},
    "temperature=1e300": {"temperature": 1e300},
    "temperature='1'": {"temperature": "1"},
    "top_p=0": {"top_p": 0.0},
    "top_p=nan": {"top_p": float("nan")},
    "top_p=1.5": {"top_p": 1.5},
    "top_k=-1": {"top_k": -1},
    "top_k=True": {"top_k": True},
    "top_k=2.5": {"top_k": 2.5},
    "seed=2**64": {"seed": 2**64},
    "seed=-2**63-1": {"seed": -(2**63) - 1},
    "seed=1.5": {"seed": 1.5},
    "seed=True": {"seed": True},
    "stop_token_ids=['a']": {"stop_token_ids": ("a",)},
    "stop_token_ids=3": {"stop_token_ids": 3},
    "stop=['']": {"stop": ("",)},
    "stop=[3]": {"stop": (3,)},
    "ignore_eos=1": {"ignore_eos": 1},
}


def assert_neighbours_exact(results, hf, new_tokens=5):
    for prompt, result in zip(NEIGHBOURS, results, strict=True):
        assert result.finish_reason == FinishReason.LENGTH, result.error
        assert result.output_ids == hf_greedy(hf, prompt, new_tokens)
        assert len(result.output_logprobs) == len(result.output_ids)


@pytest.mark.parametrize("fields", BAD_PARAMS.values(), ids=BAD_PARAMS.keys())
def test_unexecutable_sampling_field_fails_its_request_alone(qwen2_pair, fields):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    bad = SamplingParams(**{"temperature": 1.0, "max_tokens": 5, **fields})
    results = engine.run_batch([NEIGHBOURS[0], [9, 9], NEIGHBOURS[1]], [GOOD, bad, GOOD])
    assert (results[1].finish_reason, results[1].error.code) == (FinishReason.ERROR, BAD)
    assert results[1].output_ids == [] and results[1].error.message
    assert_neighbours_exact([results[0], results[2]], hf)
    assert_idle(engine)


@pytest.mark.parametrize(
    "fields",
    [
        {"top_k": 2**63},
        {"top_k": 2**70},
        {"top_p": 1e-300},
        {"seed": 2**64 - 1},
        {"seed": -(2**63)},
    ],
    ids=["top_k=2**63", "top_k=2**70", "top_p=1e-300", "seed=max", "seed=min"],
)
def test_extreme_but_valid_values_run(qwen2_pair, fields):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    extreme = SamplingParams(max_tokens=4, ignore_eos=True, **fields)
    results = engine.run_batch([NEIGHBOURS[0], [9, 9], NEIGHBOURS[1]], [GOOD, extreme, GOOD])
    assert results[1].finish_reason == FinishReason.LENGTH and len(results[1].output_ids) == 4
    assert all(0 <= t < ours.config.vocab_size for t in results[1].output_ids)
    assert_neighbours_exact([results[0], results[2]], hf)
    assert_idle(engine)


def test_top_k_beyond_int64_matches_no_top_k(qwen2_pair):
    engine = make_engine(qwen2_pair[0], page_size=4)
    huge = engine.run_batch([[1, 2, 3]], SamplingParams(max_tokens=8, top_k=2**63, seed=5))[0]
    none = engine.run_batch([[1, 2, 3]], SamplingParams(max_tokens=8, top_k=0, seed=5))[0]
    assert huge.output_ids == none.output_ids
    assert huge.output_logprobs == pytest.approx(none.output_logprobs)


def test_group_seed_overflow_wraps_and_every_sample_runs(qwen2_pair):
    engine = make_engine(qwen2_pair[0], page_size=4)
    params = SamplingParams(max_tokens=4, seed=2**64 - 2, ignore_eos=True)
    results = engine.run_batch([[1, 2, 3]], params, samples_per_prompt=4)
    assert [r.finish_reason for r in results] == [FinishReason.LENGTH] * 4
    again = engine.run_batch([[1, 2, 3]], params, samples_per_prompt=4)
    assert [r.output_ids for r in results] == [r.output_ids for r in again]
    assert_idle(engine)


BAD_PROMPTS = {
    "None": (None, ErrorCode.INVALID_TOKEN_ID),
    "str": ("abc", ErrorCode.INVALID_TOKEN_ID),
    "None item": ([1, None], ErrorCode.INVALID_TOKEN_ID),
    "float item": ([1, 2.0], ErrorCode.INVALID_TOKEN_ID),
    "bool item": ([1, True], ErrorCode.INVALID_TOKEN_ID),
    "negative": ([1, -1], ErrorCode.INVALID_TOKEN_ID),
    "empty": ([], ErrorCode.EMPTY_PROMPT),
}


@pytest.mark.parametrize(("prompt", "code"), BAD_PROMPTS.values(), ids=BAD_PROMPTS.keys())
def test_malformed_prompt_fails_its_request_alone(qwen2_pair, prompt, code):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    results = engine.run_batch([NEIGHBOURS[0], prompt, NEIGHBOURS[1]], GOOD)
    assert (results[1].finish_reason, results[1].error.code) == (FinishReason.ERROR, code)
    assert_neighbours_exact([results[0], results[2]], hf)
    assert_idle(engine)


def test_non_sampling_params_object_fails_its_request_alone(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    results = engine.run_batch([NEIGHBOURS[0], [5], NEIGHBOURS[1]], [GOOD, None, GOOD])
    assert results[1].error.code == BAD
    assert_neighbours_exact([results[0], results[2]], hf)
    assert_idle(engine)


def test_numpy_integers_are_token_ids_and_fields(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    params = SamplingParams(temperature=0, max_tokens=np.int64(5), ignore_eos=True)
    prompts = [np.array(NEIGHBOURS[0]), [np.int32(t) for t in NEIGHBOURS[1]]]
    assert_neighbours_exact(engine.run_batch(prompts, params), hf)
    out_of_vocab = engine.run_batch([[np.int64(10_000)]], GOOD)[0]
    assert out_of_vocab.error.code == ErrorCode.INVALID_TOKEN_ID
    assert "outside the vocabulary" in out_of_vocab.error.message


def test_a_bare_stop_string_is_one_stop_string():
    assert SamplingParams(stop="ab").stop == ("ab",)
    model, _ = make_pair("qwen2", vocab_size=200)
    tok = char_tokenizer()
    engine = make_engine(model, page_size=4)
    engine.tokenizer = tok
    engine.intake.has_tokenizer = True
    free = engine.run_batch([tok.encode("hi")], SamplingParams(temperature=0, max_tokens=30))[0]
    first = free.text[0]
    two = first + "\x00"  # a two-character stop string that never occurs
    stopped = engine.run_batch([tok.encode("hi")], SamplingParams(temperature=0, stop=two))[0]
    assert stopped.output_ids == free.output_ids[:16], "stopped on a single character"


def test_sampler_fault_in_one_row_leaves_the_others_exact(qwen2_pair, monkeypatch):
    """A row whose logits turn non-finite mid-generation ends `non_finite_logits` alone."""
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    real = engine.executor.forward_decode

    def poison_second_row(tasks):
        logits = real(tasks).clone()
        for i, task in enumerate(tasks):
            if task.prompt_ids == [9, 9]:
                logits[i, 3] = float("nan")
        return logits

    monkeypatch.setattr(engine.executor, "forward_decode", poison_second_row)
    results = engine.run_batch([NEIGHBOURS[0], [9, 9], NEIGHBOURS[1]], GOOD)
    assert results[1].error.code == ErrorCode.NON_FINITE_LOGITS
    assert len(results[1].output_ids) == 1  # the prefill token; the first decode failed
    assert_neighbours_exact([results[0], results[2]], hf)
    assert_idle(engine)


def test_a_fault_outside_any_step_ends_the_batch_without_escaping(qwen2_pair, monkeypatch):
    engine = make_engine(qwen2_pair[0], page_size=4)

    def broken_enqueue(tasks):
        raise RuntimeError("queue broke")

    monkeypatch.setattr(engine, "enqueue", broken_enqueue)
    results = engine.run_batch(NEIGHBOURS, GOOD)
    assert [r.error.code for r in results] == [ErrorCode.INTERNAL] * 2
    assert "queue broke" in results[0].error.message
    monkeypatch.undo()
    assert_idle(engine)


def test_last_request_out_of_kv_alone_does_not_fail_the_next_one(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, max_batch_size=1, page_size=4, num_pages=3)
    long = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first, second = engine.run_batch([[1, 2, 3], [4, 5]], [long, short])
    assert first.error.code == ErrorCode.KV_EXHAUSTED  # 23 tokens can never fit 12 slots
    assert second.finish_reason == FinishReason.LENGTH
    assert second.output_ids == hf_greedy(hf, [4, 5], 3)
    assert_idle(engine)


def test_logprobs_line_up_with_tokens_whoever_steps(qwen2_pair):
    """A loop request stepped along by `run_batch(return_logprobs=False)` keeps one log-prob
    per token, equal to HF's."""
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    loop = ServingLoop(engine)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    with engine.lock:  # the loop is not started: only run_batch steps
        (handle,) = loop.submit([1, 2, 3], params)
        engine.enqueue(loop._inbox)
        loop._inbox.clear()
        mine = engine.run_batch([[7, 8]], GOOD, return_logprobs=False)[0]
    assert mine.output_logprobs == [] and mine.finish_reason == FinishReason.LENGTH
    while engine.has_work():
        engine.step()
    result = handle.result(timeout=5)
    assert len(result.output_logprobs) == len(result.output_ids) == 30
    truth = hf_logprobs(hf, [1, 2, 3], result.output_ids)
    assert result.output_temp_logprobs == pytest.approx(truth.tolist(), abs=1e-4)
    assert_idle(engine)


def test_submit_after_stop_resolves_at_once(qwen2_pair):
    engine = make_engine(qwen2_pair[0], page_size=4)
    loop = ServingLoop(engine)
    loop.start()
    loop.stop()
    (handle,) = loop.submit([1, 2, 3], GOOD)
    result = handle.result(timeout=5)
    assert (result.finish_reason, result.error.code) == (FinishReason.ABORT, ErrorCode.CANCELLED)
    assert_idle(engine)


def test_tied_model_accepts_its_own_state_dict():
    model, _ = make_pair("qwen2", tie_word_embeddings=True)
    engine = make_engine(model, page_size=4)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert "lm_head.weight" in state
    with torch.no_grad():
        for tensor in state.values():
            tensor.mul_(1.01)
    ack = engine.update_weights(state, 1)
    assert ack.version == 1
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])
    state["lm_head.weight"] = state["lm_head.weight"] + 1  # no longer the tied tensor
    from core_engine.weights import WeightUpdateError

    with pytest.raises(WeightUpdateError, match="tied"):
        engine.update_weights(state, 2)


def test_a_failing_listener_never_fails_a_step(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    seen = []

    def broken(events):
        seen.extend(events)
        raise RuntimeError("listener broke")

    engine.add_listener(broken)
    assert_neighbours_exact(engine.run_batch(NEIGHBOURS, GOOD), hf)
    assert len(seen) == 2 * 5 + 2  # every token event, then both finish events
    assert_idle(engine)


class _Picky:
    """A tokenizer that cannot decode one request's tokens (e.g. ids past its vocabulary)."""

    def __init__(self, tokenizer, poison: int) -> None:
        self.tokenizer, self.poison = tokenizer, poison

    def decode(self, ids, **kwargs):
        if self.poison in ids:
            raise ValueError(f"cannot decode {self.poison}")
        return self.tokenizer.decode(ids, **kwargs)


def test_a_tokenizer_fault_on_one_request_ends_it_alone(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    alone = engine.run_batch([[9, 9]], GOOD)[0]
    poison = alone.output_ids[1]  # its second token: the fault comes mid-generation
    assert all(poison not in hf_greedy(hf, p, 5) for p in NEIGHBOURS), "pick another prompt"
    engine.tokenizer = _Picky(char_tokenizer(), poison)
    engine.intake.has_tokenizer = True
    stop = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, stop="\x00")
    results = engine.run_batch([NEIGHBOURS[0], [9, 9], NEIGHBOURS[1]], stop)
    assert (
        results[1].error.code == ErrorCode.INTERNAL and "cannot decode" in results[1].error.message
    )
    assert results[1].output_ids == alone.output_ids[:2]
    assert_neighbours_exact([results[0], results[2]], hf)
    assert_idle(engine)


def test_an_iterator_prompt_is_read_once_for_its_whole_group(qwen2_pair):
    ours, hf = qwen2_pair
    engine = make_engine(ours, page_size=4)
    results = engine.run_batch([iter(NEIGHBOURS[0])], GOOD, samples_per_prompt=3)
    assert [r.prompt_ids for r in results] == [NEIGHBOURS[0]] * 3
    assert all(r.output_ids == hf_greedy(hf, NEIGHBOURS[0], 5) for r in results)
    assert_idle(engine)


def test_one_unusable_params_object_for_all_fails_each_request_not_the_call(qwen2_pair):
    engine = make_engine(qwen2_pair[0], page_size=4)
    for params in (5, {"temperature": 0}, "greedy"):
        results = engine.run_batch(NEIGHBOURS, params)
        assert [r.error.code for r in results] == [BAD, BAD]
    assert_idle(engine)


@pytest.mark.parametrize(
    ("call", "why"),
    [
        ({"prompts": None}, "prompts must be a sequence"),
        ({"prompts": "abc"}, "prompts must be a sequence"),
        ({"prompts": [[1]], "samples_per_prompt": 0}, "samples_per_prompt"),
        ({"prompts": [[1]], "samples_per_prompt": True}, "samples_per_prompt"),
        ({"prompts": [[1], [2]], "params": [GOOD] * 3}, "sampling params"),
    ],
)
def test_a_malformed_call_raises_before_anything_is_queued(qwen2_pair, call, why):
    engine = make_engine(qwen2_pair[0], page_size=4)
    with pytest.raises(ValueError, match=why):
        engine.run_batch(**call)
    assert_idle(engine)
    assert engine.run_batch([[1, 2]], GOOD, samples_per_prompt=np.int64(2))[1].ok


@pytest.mark.parametrize("seed", range(3))
def test_random_mixes_of_good_and_bad_requests_keep_the_rule(qwen2_pair, seed):
    """Random batches (bad fields, bad prompts, shared headers, groups) on a small pool that
    preempts: every good greedy request equals its solo HF run, every bad one fails alone
    with its code, the pool is consistent after every step and idle at the end."""
    import random

    ours, hf = qwen2_pair
    rng = random.Random(seed)
    engine = make_engine(ours, page_size=4, num_pages=8, max_batch_size=4)
    header = [rng.randrange(3, 128) for _ in range(8)]
    prompts, params, expected = [], [], []
    for _ in range(10):
        prompt = header + [rng.randrange(3, 128) for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.3:
            fields = rng.choice(list(BAD_PARAMS.values()))
            prompts.append(prompt)
            params.append(SamplingParams(**{"temperature": 1.0, "max_tokens": 4, **fields}))
            expected.append(BAD)
        elif rng.random() < 0.15:
            bad_prompt, code = rng.choice(list(BAD_PROMPTS.values()))
            prompts.append(bad_prompt)
            params.append(GOOD)
            expected.append(code)
        else:
            prompts.append(prompt)
            params.append(GOOD)
            expected.append(None)
    tasks = engine.make_tasks(prompts, params)
    engine.enqueue(tasks)
    while engine.has_work():
        engine.step()
        engine.check_integrity()
    for task, prompt, code in zip(tasks, prompts, expected, strict=True):
        if code is None:
            assert task.finish_reason == FinishReason.LENGTH, task.error
            assert task.output_ids == hf_greedy(hf, prompt, 5)
        else:
            assert (task.finish_reason, task.error.code) == (FinishReason.ERROR, code)
    assert engine.stats()["preemptions"] > 0, "the pool should be small enough to preempt"
    assert_idle(engine)
