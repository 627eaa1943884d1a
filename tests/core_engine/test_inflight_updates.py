"""In-flight weight updates: an update lands between two decode steps without draining; each
token records the version that sampled it, and its log-prob is the one it was sampled with.

The independent truth is a Hugging Face replay of the engine's schedule: one HF model per
version, the K/V cache carried across versions (an in-flight sequence keeps the K/V its earlier
tokens were computed with), each token predicted by the version that sampled it.
"""

import threading

import pytest
import torch
import transformers

from core_engine.task import FinishReason, SamplingParams, expand_runs
from core_engine.toy import tiny_config
from core_engine.weights import canonical_weights

from .reference import assert_idle, hf_logprobs, make_engine, make_pair
from .test_policy_versions import perturbed

PROMPTS = [[5, 9, 2, 7, 1], [3, 3, 8], [11, 4, 6, 2, 9, 13, 1]]
TOLERANCE = 1e-4


def hf_with(weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    hf = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2")).eval()
    hf.load_state_dict(weights, strict=False)  # tied/rotary names absent from `weights`
    return hf


@pytest.fixture
def versions():
    """Our model (version 0) and the weights of versions 0, 1, 2 with their HF twins."""
    model, _ = make_pair("qwen2")
    w0 = {k: v.detach().clone() for k, v in canonical_weights(model).items()}
    w1 = perturbed(w0, 1, scale=0.2)
    w2 = perturbed(w1, 2, scale=0.2)
    weights = {0: w0, 1: w1, 2: w2}
    return model, weights, {v: hf_with(w) for v, w in weights.items()}


@torch.no_grad()
def replay(hf_by_version, prompt, output, versions, temperature):
    """Per-token log-probs (and greedy argmax) of `output`, token j predicted by
    `hf_by_version[versions[j]]` from a forward that feeds the prompt (j = 0) or token j-1,
    with the K/V of every earlier position as an earlier version computed it."""
    cache = transformers.DynamicCache()
    fed = prompt
    logprobs, argmax = [], []
    for j, token in enumerate(output):
        hf = hf_by_version[versions[j]]
        logits = hf(torch.tensor([fed]), past_key_values=cache, use_cache=True).logits[0, -1]
        logp = (logits.float() / temperature).log_softmax(-1)
        logprobs.append(float(logp[token]))
        argmax.append(int(logits.argmax()))
        fed = [token]
    return torch.tensor(logprobs), argmax


def run_with_updates(engine, weights, at_steps, params, prompts=PROMPTS):
    """`run_batch` with in-flight updates to versions 1, 2, ... after the given steps."""
    steps, pending = [0], list(at_steps)

    def after_step(_events):
        steps[0] += 1
        if pending and steps[0] == pending[0]:
            pending.pop(0)
            version = engine.version + 1
            ack = engine.update_weights(weights[version], version, mode="in_flight")
            assert ack.requests_aborted == 0

    engine.add_listener(after_step)
    results = engine.run_batch(prompts, params)
    assert not pending, f"updates after steps {pending} never landed"
    return results


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_tokens_and_logprobs_equal_an_hf_replay_of_the_schedule(versions, temperature):
    model, weights, hf = versions
    engine = make_engine(model, page_size=2)
    params = SamplingParams(temperature=temperature, max_tokens=10, ignore_eos=True, seed=7)
    results = run_with_updates(engine, weights, at_steps=(3, 6), params=params)
    scoring_t = temperature or 1.0
    for result, prompt in zip(results, PROMPTS, strict=True):
        assert result.finish_reason is FinishReason.LENGTH
        per_token = expand_runs(result.token_versions)
        # prefill = step 1 samples token 0, decode steps 2, 3 (v0), 4-6 (v1), 7-10 (v2)
        assert result.token_versions == [[0, 3], [1, 3], [2, 4]]
        assert result.policy_version == 0  # stamped with its oldest token
        expected, argmax = replay(hf, prompt, result.output_ids, per_token, scoring_t)
        got = torch.tensor(result.output_temp_logprobs)
        assert torch.allclose(got, expected, atol=TOLERANCE), (got - expected).abs().max()
        if temperature == 0:
            assert result.output_ids == argmax
    assert_idle(engine)


def test_the_replay_tells_the_kv_mixture_apart(versions):
    """The check above can fail: re-scoring the in-flight tokens with every K/V recomputed by
    their own version (plain teacher forcing) gives other log-probs."""
    model, weights, hf = versions
    engine = make_engine(model, page_size=2)
    params = SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=7)
    [result] = run_with_updates(engine, weights, at_steps=(3,), params=params, prompts=PROMPTS[:1])
    fresh = hf_logprobs(hf[1], PROMPTS[0], result.output_ids, 0.8)[3:]
    assert (torch.tensor(result.output_temp_logprobs[3:]) - fresh).abs().max() > 1e-3


def test_in_flight_kv_is_never_published_to_the_prefix_cache(versions):
    """A sequence that crossed an update holds older K/V: when it finishes, none of it may be
    found by a later request. The next request's log-probs equal the new version's."""
    model, weights, hf = versions
    engine = make_engine(model, page_size=2)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    [first] = run_with_updates(engine, weights, at_steps=(2,), params=params, prompts=PROMPTS[:1])
    assert len(engine.pool.strategy.prefix) == 0
    repeat = PROMPTS[0] + first.output_ids  # its whole context, as a new prompt
    [again] = engine.run_batch([repeat], params)
    assert again.num_cached_prompt_tokens == 0
    truth = hf_logprobs(hf[1], repeat, again.output_ids)
    assert torch.allclose(torch.tensor(again.output_temp_logprobs), truth, atol=TOLERANCE)
    [third] = engine.run_batch([repeat], params)  # a clean request's pages are shared
    assert third.num_cached_prompt_tokens > 0 and third.output_ids == again.output_ids
    assert_idle(engine)


def test_preempted_in_flight_sequences_publish_nothing_stale(versions):
    """With a pool too small for the batch, sequences are preempted after an update: one that
    holds older K/V adds nothing to the prefix cache, and what any later request reuses was
    computed by the version it is served under."""
    model, weights, hf = versions
    engine = make_engine(model, page_size=2, num_pages=14, max_batch_size=8)
    stale_preemptions = []
    preempt = engine.batching.preempt

    def watched(task, version):
        stale, before = task.kv_version != version, len(engine.pool.strategy.prefix)
        preempt(task, version)
        if stale:
            stale_preemptions.append(len(engine.pool.strategy.prefix) - before)

    engine.batching.preempt = watched
    prompts = [PROMPTS[i % 3] + [i + 1] * 6 for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    results = run_with_updates(engine, weights, at_steps=(2,), params=params, prompts=prompts)
    assert stale_preemptions and not any(stale_preemptions)  # preempted, nothing published
    for prompt, result in zip(prompts, results, strict=True):
        context = prompt + result.output_ids[:6]
        [again] = engine.run_batch([context], params)
        truth = hf_logprobs(hf[1], context, again.output_ids)
        assert torch.allclose(torch.tensor(again.output_temp_logprobs), truth, atol=TOLERANCE)
    assert_idle(engine)


def test_an_update_from_another_thread_lands_between_steps(versions):
    """The trainer's side: the update waits for the step in progress (the engine's gate), lands,
    and the running batch goes on; every token's version is the engine's at its step."""
    model, weights, _ = versions
    engine = make_engine(model, page_size=2)
    params = SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True, seed=3)
    started = threading.Event()
    engine.add_listener(lambda _events: started.set())
    results = []
    worker = threading.Thread(target=lambda: results.extend(engine.run_batch(PROMPTS, params)))
    worker.start()
    assert started.wait(timeout=120)  # a hang guard
    for version in (1, 2):
        ack = engine.update_weights(weights[version], version, mode="in_flight")
        assert ack.version == version
    worker.join(timeout=120)  # a hang guard
    assert not worker.is_alive()
    for result in results:
        per_token = expand_runs(result.token_versions)
        assert len(per_token) == len(result.output_ids) == 40
        assert per_token == sorted(per_token) and per_token[0] == 0
    assert engine.version == 2
    assert_idle(engine)


def test_a_preempted_in_flight_sequence_records_where_it_resumed(versions):
    """A sequence preempted after an update resumes with every earlier position's K/V
    recomputed by the current version; the engine records where (`resumed_at`), and a replay
    that starts a fresh cache there (`workers.replay`) reproduces every stored log-prob, where
    one that ignores it does not."""
    from workers.replay import replay_logprobs, segments

    model, weights, hf = versions
    engine = make_engine(model, page_size=2, num_pages=14, max_batch_size=8)
    prompts = [PROMPTS[i % 3] + [i + 1] * 6 for i in range(4)]
    params = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=5)
    results = run_with_updates(engine, weights, at_steps=(2,), params=params, prompts=prompts)
    resumed = [r for r in results if r.resumed_at and len(r.token_versions) > 1]
    assert resumed, "no in-flight sequence was preempted and resumed"
    for result in resumed:
        assert all(0 < i <= len(result.output_ids) for i in result.resumed_at)
        stored = torch.tensor(result.output_temp_logprobs)

        def replayed(parts, result=result):
            scores = replay_logprobs(
                result.prompt_ids, result.output_ids, parts, hf.__getitem__, 0.8
            )
            return torch.tensor([v for part in scores for v in part])

        parts = segments(result.token_versions, result.resumed_at)
        assert torch.allclose(replayed(parts), stored, atol=TOLERANCE)
        unaware = segments(result.token_versions)
        assert (replayed(unaware) - stored).abs().max() > TOLERANCE
    assert_idle(engine)
