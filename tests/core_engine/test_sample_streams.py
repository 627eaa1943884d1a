"""Per-request uniform streams: drawn in chunks, yet exactly the numbers (and so the tokens and
log-probs) that one `torch.rand` per sampled token from the request's seeded generator gives."""

from collections import defaultdict

import pytest
import torch

from core_engine.runtime.uniforms import CHUNK, Uniforms
from core_engine.task import SamplingParams

from .reference import make_engine

PROMPTS = [[5, 17, 33, 2, 9], [7, 8, 9], list(range(10, 31)), [3]]
NEW_TOKENS = CHUNK + 6  # every sampled request crosses a chunk boundary


def one_at_a_time(seed: int, n: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand((), dtype=torch.float64, generator=g).item() for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 11, 2**63 - 1, -(2**63)])
def test_chunked_stream_is_the_one_at_a_time_stream(seed):
    stream = Uniforms(seed)
    assert [stream.take() for _ in range(3 * CHUNK + 5)] == one_at_a_time(seed, 3 * CHUNK + 5)


def old_rule(rows: list[torch.Tensor], params: SamplingParams, seed: int):
    """The sampler's rule before streams, row by row: argmax when greedy, else the tempered
    softmax's fp64 CDF inverted at one `torch.rand` per token from a fresh seeded generator."""
    g = torch.Generator().manual_seed(seed)
    tokens, logprobs, temp_logprobs = [], [], []
    for logits in rows:
        if params.temperature == 0:
            logp = logits.log_softmax(-1)
            token, logprob = int(logits.argmax()), 0.0
        else:
            logp = (logits / params.temperature).log_softmax(-1)
            cdf = logp.exp().cumsum(-1, dtype=torch.float64)
            u = torch.rand((), dtype=torch.float64, generator=g)
            below = torch.minimum(u * cdf[-1], cdf[-1].nextafter(torch.zeros((), dtype=cdf.dtype)))
            token = int(torch.searchsorted(cdf, below[None], right=True))
            logprob = logp[token].item()
        tokens.append(token)
        logprobs.append(logprob)
        temp_logprobs.append(logp[token].item())
    return tokens, logprobs, temp_logprobs


def run_recorded(engine, params: list[SamplingParams]):
    """`run_batch` over PROMPTS, with the logits row each request sampled from, in order."""
    rows: dict[int, list[torch.Tensor]] = defaultdict(list)
    sample = engine.executor.sample

    def recording(tasks, logits, return_logprobs):
        for task, row in zip(tasks, logits, strict=True):
            rows[task.task_id].append(row.clone())
        return sample(tasks, logits, return_logprobs)

    engine.executor.sample = recording
    return engine.run_batch(PROMPTS, params), rows


def assert_old_rule(results, rows, params: list[SamplingParams]) -> None:
    for result, p in zip(results, params, strict=True):
        assert len(result.output_ids) == NEW_TOKENS
        expected = old_rule(rows[result.task_id], p, p.seed)
        assert (result.output_ids, result.output_logprobs, result.output_temp_logprobs) == expected


def test_seeded_generation_is_the_one_at_a_time_rule(qwen2_pair):
    params = [
        SamplingParams(temperature=t, max_tokens=NEW_TOKENS, ignore_eos=True, seed=seed)
        for t, seed in [(1.0, 3), (0.7, 4), (1.0, 2**64 - 5), (1.3, 99)]
    ]
    results, rows = run_recorded(make_engine(qwen2_pair[0], page_size=4), params)
    assert_old_rule(results, rows, params)


def test_greedy_and_sampled_rows_mixed_keep_their_own_streams(qwen2_pair):
    params = [
        SamplingParams(temperature=t, max_tokens=NEW_TOKENS, ignore_eos=True, seed=seed)
        for t, seed in [(0.0, 1), (0.8, 5), (0.0, 6), (1.0, 7)]
    ]
    results, rows = run_recorded(make_engine(qwen2_pair[0], page_size=4), params)
    assert_old_rule(results, rows, params)
