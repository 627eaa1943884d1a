"""Policy versions: acknowledged, serialized weight updates; prefix KV never crosses versions;
group sampling shares the prompt; a concurrency proof of attribution."""

import threading

import numpy as np
import pytest
import torch

from core_engine.serving import ServingLoop
from core_engine.task import ErrorCode, FinishReason, SamplingParams
from core_engine.weights import WeightUpdateError, canonical_weights, weights_checksum

from .reference import assert_idle, make_engine, make_pair

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def perturbed(model_or_weights, seed, scale=0.05):
    """New weights: the given ones plus seeded Gaussian noise."""
    weights = model_or_weights
    if isinstance(weights, torch.nn.Module):
        weights = canonical_weights(weights)
    gen = torch.Generator().manual_seed(seed)
    return {
        name: (t + scale * torch.randn(t.shape, generator=gen)).detach()
        for name, t in weights.items()
    }


def model_with(weights):
    model, _ = make_pair("qwen2")
    with torch.no_grad():
        for name, tensor in canonical_weights(model).items():
            tensor.copy_(weights[name])
    return model


@torch.no_grad()
def teacher_forced(model, prompt, output, temperature=1.0):
    logits = model(torch.tensor([prompt + output]))[0] / temperature
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(output)[:, None])[:, 0]


@pytest.fixture
def engine():
    model, _ = make_pair("qwen2")
    return make_engine(model, page_size=2)


def test_update_is_acknowledged_with_version_count_and_checksum(engine):
    engine.run_batch([[1, 2, 3, 4, 5, 6, 7]], GREEDY)
    entries = len(engine.pool.strategy.prefix)
    assert entries > 0
    new = perturbed(engine.model, 1)
    ack = engine.update_weights(new, 1)
    assert ack.version == engine.version == 1
    assert ack.prefix_entries_invalidated == entries
    assert ack.checksum == weights_checksum(new)  # the trainer's side of the check
    assert ack.checksum == weights_checksum(canonical_weights(engine.model))
    assert ack.seconds >= 0
    assert len(engine.pool.strategy.prefix) == 0
    engine.check_integrity()


def test_checksum_is_deterministic_and_content_sensitive(engine):
    weights = canonical_weights(engine.model)
    assert weights_checksum(weights) == weights_checksum({k: v.clone() for k, v in weights.items()})
    changed = dict(weights)
    name = next(iter(changed))
    changed[name] = changed[name].clone()
    changed[name].view(-1)[0] += 1e-3
    assert weights_checksum(changed) != weights_checksum(weights)


@pytest.mark.parametrize(
    ("version", "why"),
    [
        (0, "not greater"),
        (-1, "not greater"),
        (np.int64(0), "policy version 0 is not greater"),
        (1.5, "must be an integer"),
        ("2", "must be an integer"),
        (True, "must be an integer"),  # a bool is not a version, though Python calls it an int
    ],
)
def test_bad_or_non_increasing_version_is_refused_and_changes_nothing(engine, version, why):
    before = engine.run_batch([[1, 2, 3]], GREEDY)[0]
    checksum = weights_checksum(canonical_weights(engine.model))
    with pytest.raises(WeightUpdateError, match=why):
        engine.update_weights(perturbed(engine.model, 2), version)
    assert engine.version == 0
    assert weights_checksum(canonical_weights(engine.model)) == checksum
    assert engine.run_batch([[1, 2, 3]], GREEDY)[0].output_ids == before.output_ids


def test_bad_weight_sets_are_refused_atomically(engine):
    good = perturbed(engine.model, 3)
    name = "model.layers.0.mlp.up_proj.weight"
    broken = {
        "missing": {k: v for k, v in good.items() if k != name},
        "extra": {**good, "model.bogus.weight": torch.zeros(1)},
        "shape": {**good, name: good[name][:, :-1]},
        "dtype": {**good, name: good[name].double()},
        "nan": {**good, name: good[name].clone().fill_(float("nan"))},
    }
    checksum = weights_checksum(canonical_weights(engine.model))
    for label, weights in broken.items():
        with pytest.raises(WeightUpdateError):
            engine.update_weights(weights, 5)
        assert engine.version == 0, label
        assert weights_checksum(canonical_weights(engine.model)) == checksum, label
    assert engine.update_weights(good, 5).version == 5


def test_stale_prefix_kv_is_never_reused_after_an_update(engine):
    """The AstrAI failure: same prompt after an in-place update must not hit old pages."""
    prompt = [9, 8, 7, 6, 5, 4, 3]
    engine.run_batch([prompt], GREEDY)
    assert engine.run_batch([prompt], GREEDY)[0].num_cached_prompt_tokens == 6  # a hit
    new = perturbed(engine.model, 4, scale=0.2)
    engine.update_weights(new, 1)
    after = engine.run_batch([prompt], GREEDY)[0]
    assert after.num_cached_prompt_tokens == 0
    assert after.policy_version == 1
    fresh = make_engine(model_with(new), page_size=2).run_batch([prompt], GREEDY)[0]
    assert after.output_ids == fresh.output_ids
    assert torch.allclose(
        torch.tensor(after.output_temp_logprobs),
        torch.tensor(fresh.output_temp_logprobs),
        atol=1e-5,
    )
    engine.check_integrity()


def test_drain_mode_finishes_started_requests_under_the_old_version(engine):
    old = {k: v.clone() for k, v in canonical_weights(engine.model).items()}
    params = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=1)
    started = engine.make_tasks([[1, 2, 3]], params)
    engine.enqueue(started)
    engine.step()
    engine.step()
    queued = engine.make_tasks([[4, 5, 6]], params)
    engine.enqueue(queued)
    engine.update_weights(perturbed(engine.model, 5), 1)
    assert started[0].finished and started[0].policy_version == 0
    assert started[0].finish_reason == FinishReason.LENGTH
    stored = torch.tensor(started[0].output_temp_logprobs)
    replay = teacher_forced(model_with(old), [1, 2, 3], started[0].output_ids)
    assert torch.allclose(stored, replay, atol=1e-5)
    while not queued[0].finished:
        engine.step()
    assert queued[0].policy_version == 1


def test_drain_resumes_preempted_requests_behind_a_fresh_one(engine):
    """A preempted request is finished under the old version even when a request that has
    not started sits ahead of it; the fresh one waits for the new version."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    started = engine.make_tasks([[1, 2, 3]], params)
    engine.enqueue(started)
    engine.step()
    engine.step()
    engine.batching.preempt(started[0], engine.version)  # as when the pool runs out of pages
    fresh = engine.make_tasks([[4, 5, 6]], params)
    engine.batching.waiting.appendleft(fresh[0])  # e.g. a group sample requeued after a failed fork
    engine.update_weights(perturbed(engine.model, 8), 1)
    assert started[0].finished and started[0].policy_version == 0
    assert started[0].finish_reason == FinishReason.LENGTH and len(started[0].output_ids) == 8
    assert not fresh[0].finished and fresh[0].output_ids == []
    while not fresh[0].finished:
        engine.step()
    assert fresh[0].policy_version == 1 and fresh[0].finish_reason == FinishReason.LENGTH


def test_abort_mode_ends_started_requests_with_policy_updated(engine):
    started = engine.make_tasks([[1, 2, 3]], GREEDY)
    engine.enqueue(started)
    engine.step()
    ack = engine.update_weights(perturbed(engine.model, 6), 1, mode="abort")
    assert ack.requests_aborted == 1
    assert started[0].finish_reason == FinishReason.ABORT
    assert started[0].error.code == ErrorCode.POLICY_UPDATED
    assert started[0].policy_version == 0 and len(started[0].output_ids) == 1
    assert_idle(engine)


def test_serving_loop_applies_updates_at_step_boundaries(engine):
    loop = ServingLoop(engine)
    loop.start()
    try:
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        (handle,) = loop.submit([1, 2, 3], params)
        next(handle.stream(timeout=30))
        new = perturbed(engine.model, 7)
        ack = engine.update_weights(new, 1)
        result = handle.result(timeout=30)
        assert result.policy_version == 0 and len(result.output_ids) == 40
        later = loop.submit([1, 2, 3], params)[0].result(timeout=30)
        assert later.policy_version == ack.version == 1
    finally:
        loop.stop()


def test_group_prefills_the_prompt_once_and_shares_its_pages():
    model, _ = make_pair("qwen2")
    engine = make_engine(model, page_size=4)
    prompt = list(range(20, 30))  # two full pages + a partial one
    params = SamplingParams(temperature=1.0, max_tokens=1, seed=7)
    tasks = engine.make_tasks([prompt], params, samples_per_prompt=4)
    engine.enqueue(tasks)
    engine.step()  # prefill + the first token of every sample; max_tokens=1 finishes them
    assert engine.stats()["prefill_tokens"] == len(prompt)
    assert [t.num_cached_prompt_tokens for t in tasks] == [0, 10, 10, 10]
    long_params = SamplingParams(temperature=1.0, max_tokens=3, seed=7, ignore_eos=True)
    held = engine.make_tasks([list(range(40, 50))], long_params, samples_per_prompt=4)
    engine.enqueue(held)
    engine.step()
    # 2 shared full pages + one private partial page per sample, not 4 x 3 pages.
    assert engine.pool.strategy.usage()["pages_used"] == 2 + 4
    engine.check_integrity()


def test_group_results_equal_unshared_results_with_the_same_seeds():
    model, _ = make_pair("qwen2")
    prompts = [[3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1, 8, 2]]
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=10, seed=42, ignore_eos=True)
    shared = make_engine(model, page_size=4).run_batch(prompts, params, samples_per_prompt=4)
    unshared_params = [
        SamplingParams(temperature=0.9, top_p=0.95, max_tokens=10, seed=42 + k, ignore_eos=True)
        for _ in prompts
        for k in range(4)
    ]
    unshared = make_engine(model, page_size=4).run_batch(
        [p for p in prompts for _ in range(4)], unshared_params
    )
    for a, b in zip(shared, unshared, strict=True):
        assert a.output_ids == b.output_ids
        assert torch.allclose(
            torch.tensor(a.output_logprobs), torch.tensor(b.output_logprobs), atol=1e-5
        )
    assert [r.num_cached_prompt_tokens > 0 for r in shared[:4]] == [False, True, True, True]


def test_siblings_the_pool_cannot_hold_yet_wait_and_sample_as_if_unshared():
    """Five pages: the leader's three and one private partial page for each of two siblings.
    The third sibling waits for room, then runs; every sample equals its unshared run."""
    model, _ = make_pair("qwen2")
    prompt = list(range(20, 30))  # two full pages + a partial one
    params = SamplingParams(temperature=1.0, max_tokens=2, seed=11, ignore_eos=True)
    engine = make_engine(model, page_size=4, num_pages=5, max_batch_size=4, max_seq_len=12)
    tasks = engine.make_tasks([prompt], params, samples_per_prompt=4)
    engine.enqueue(tasks)
    engine.step()
    assert [len(t.output_ids) for t in tasks] == [1, 1, 1, 0]
    for _ in range(10):  # the three, then the fourth: a handful of steps
        engine.step()
    assert all(t.finished for t in tasks)
    unshared = make_engine(model, page_size=4).run_batch(
        [prompt] * 4,
        [
            SamplingParams(temperature=1.0, max_tokens=2, seed=11 + k, ignore_eos=True)
            for k in range(4)
        ],
    )
    for task, alone in zip(tasks, unshared, strict=True):
        assert task.output_ids == alone.output_ids
    engine.check_integrity()


def test_groups_take_one_sampling_setting_per_sample():
    """Per-request output lengths inside a shared group (the RL-like workload)."""
    model, _ = make_pair("qwen2")
    engine = make_engine(model, page_size=4)
    lengths = [3, 9, 1, 6]
    params = [
        SamplingParams(temperature=1.0, max_tokens=n, seed=100 + n, ignore_eos=True)
        for n in lengths
    ]
    results = engine.run_batch([[5, 4, 3, 2, 1]], params, samples_per_prompt=4)
    assert [len(r.output_ids) for r in results] == lengths
    assert engine.stats()["prefill_tokens"] == 5  # still one prefill for the group
    alone = make_engine(model, page_size=4).run_batch([[5, 4, 3, 2, 1]], params[1])[0]
    assert alone.output_ids == results[1].output_ids  # each sample keeps its own seed


def test_concurrent_generation_and_updates_stay_attributable():
    """One thread generates in a loop, another pushes new weights: for 100 rounds every
    result reproduces exactly under the weights of the version stamped on it."""
    model, _ = make_pair("qwen2")
    engine = make_engine(model, page_size=2)
    weights_by_version = {0: {k: v.clone() for k, v in canonical_weights(model).items()}}
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 1]]
    params = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    results = []
    done = threading.Event()

    def generate():
        for _ in range(100):
            results.extend(engine.run_batch(prompts, params))
        done.set()

    def update():
        version = 0
        while not done.is_set():
            version += 1
            new = perturbed(weights_by_version[0], version, scale=0.1)  # no drift
            weights_by_version[version] = {k: v.clone() for k, v in new.items()}
            engine.update_weights(new, version)

    threads = [threading.Thread(target=generate), threading.Thread(target=update)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = {r.policy_version for r in results}
    assert len(results) == 200 and len(versions) > 1
    replicas = {v: model_with(w) for v, w in weights_by_version.items() if v in versions}
    for r in results:
        replay = teacher_forced(replicas[r.policy_version], r.prompt_ids, r.output_ids)
        assert torch.allclose(torch.tensor(r.output_temp_logprobs), replay, atol=1e-5)
    engine.check_integrity()
