"""Sampler: behaviour and temperature-only log-probs against hand computations."""

import math

import pytest
import torch

from core_engine.runtime.sample import sample
from core_engine.runtime.uniforms import Uniforms
from core_engine.task import SamplingParams


def gen(seed):
    return Uniforms(seed)


LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])


def test_greedy_is_argmax_with_point_mass_logprob():
    out = sample(LOGITS, [SamplingParams(temperature=0)], [gen(0)])
    assert out.token_ids == [0]
    assert out.logprobs == [0.0]
    assert out.temp_logprobs[0] == pytest.approx(LOGITS.log_softmax(-1)[0, 0].item(), abs=1e-6)


def test_temperature_logprob_is_of_the_tempered_distribution():
    out = sample(LOGITS, [SamplingParams(temperature=0.7)], [gen(1)])
    expected = (LOGITS / 0.7).log_softmax(-1)[0, out.token_ids[0]].item()
    assert out.logprobs[0] == pytest.approx(expected, abs=1e-6)
    assert out.temp_logprobs[0] == pytest.approx(expected, abs=1e-6)


def test_top_k_renormalises_over_the_kept_tokens():
    params = SamplingParams(temperature=1.0, top_k=2)
    for seed in range(20):
        out = sample(LOGITS, [params], [gen(seed)])
        token = out.token_ids[0]
        assert token in (0, 1)
        kept = LOGITS[0, :2]
        assert out.logprobs[0] == pytest.approx((kept.log_softmax(-1))[token].item(), abs=1e-6)
        assert out.temp_logprobs[0] == pytest.approx(
            LOGITS.log_softmax(-1)[0, token].item(), abs=1e-6
        )


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = LOGITS.softmax(-1)[0]  # about [0.61, 0.22, 0.14, 0.03, 0.004]
    top_p = (probs[0] + probs[1]).item() - 1e-3  # tokens 0 and 1 are needed
    seen = set()
    for seed in range(40):
        out = sample(LOGITS, [SamplingParams(top_p=top_p)], [gen(seed)])
        seen.add(out.token_ids[0])
        kept = probs[:2] / probs[:2].sum()
        assert out.logprobs[0] == pytest.approx(math.log(kept[out.token_ids[0]]), abs=1e-5)
    assert seen == {0, 1}


def test_top_k_then_top_p_order():
    params = SamplingParams(temperature=2.0, top_k=3, top_p=0.5)
    scaled = LOGITS[0] / 2.0
    kept3 = scaled[:3].softmax(-1)  # top-k first, then top-p on the renormalised mass
    n_keep = int((kept3.cumsum(0) - kept3 < 0.5).sum())
    for seed in range(10):
        out = sample(LOGITS, [params], [gen(seed)])
        kept = scaled[:n_keep].log_softmax(-1)
        assert out.token_ids[0] < n_keep
        assert out.logprobs[0] == pytest.approx(kept[out.token_ids[0]].item(), abs=1e-6)


def test_mixed_batch_rows_are_independent_and_seeded():
    logits = torch.randn(4, 50)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, seed=3),
        SamplingParams(temperature=0.5, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
    ]
    first = sample(logits, params, [gen(i) for i in range(4)])
    again = sample(logits, params, [gen(i) for i in range(4)])
    assert first == again
    alone = sample(logits[1:2], params[1:2], [gen(1)])
    assert alone.token_ids[0] == first.token_ids[1]
    assert alone.logprobs[0] == pytest.approx(first.logprobs[1])
    assert first.logprobs[0] == 0.0
    assert first.token_ids[0] == int(logits[0].argmax())


def test_non_finite_rows_are_flagged_without_poisoning_others():
    logits = torch.randn(3, 10)
    logits[1, 4] = float("nan")
    logits[2, 0] = float("inf")
    out = sample(logits, [SamplingParams(temperature=1.0)] * 3, [gen(i) for i in range(3)])
    assert out.finite == [True, False, False]
    assert math.isfinite(out.logprobs[0])


def test_sampling_frequencies_follow_the_distribution():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = [0.25, 0.75]
    g = gen(0)
    hits = sum(sample(logits, [SamplingParams()], [g]).token_ids[0] for _ in range(2000))
    assert abs(hits / 2000 - 0.75) < 0.04


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(temperature=-1), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(top_p=0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_k=-2), "top_k"),
        (SamplingParams(stop=("",)), "stop"),
    ],
)
def test_invalid_params_are_explained(params, message):
    assert message in params.validation_error()


def test_valid_params_pass():
    assert (
        SamplingParams(temperature=0.0, top_k=5, top_p=0.9, max_tokens=3).validation_error() is None
    )
