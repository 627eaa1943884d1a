"""Issue 42 item 5: the per-token diagnostics and the Samples gap filter read the loss's stored
record. An episode whose observation tokens are far from the trainer's log-probs (a recomputed
clip rule would call them clipped, a gap over all tokens would rank by them) shows them as not
trained, its trained tokens with the stored ratio; a sample stored before the record keeps the
recomputed view, its note saying so."""

import math
import re

import pytest

from db import LossFlag, SampleFilter
from tests.db.helpers import make_batch, make_sample, running_job
from ui.diagnostics import token_diagnostics
from ui.handlers.samples import sample_detail

SEGMENTS = [
    {"role": "assistant", "start": 0, "end": 3, "text": "call"},
    {"role": "tool", "start": 3, "end": 6, "text": "result"},
    {"role": "assistant", "start": 6, "end": 8, "text": "answer"},
]
TRAINED = [True, True, True, False, False, False, True, True]
BEHAVIOUR = [-1.0 - i / 8 for i in range(8)]


def _episode(trained_gap: float, observation_gap: float, record: bool, **fields):
    """An 8-token episode (advantage 0.5) whose trainer log-probs exceed the behaviour's by
    `trained_gap` on its assistant tokens and `observation_gap` on its observations; with
    `record`, the loss's record: ratio 1.3 (clipped at ε 0.2) on the trained tokens."""
    gaps = [trained_gap if kept else observation_gap for kept in TRAINED]
    loss = {}
    if record:
        clipped = int(LossFlag.TRAINED | LossFlag.CLIPPED)
        loss = {
            "loss_ratios": [1.3 if kept else 1.0 for kept in TRAINED],
            "loss_weights": [1.0] * 8,
            "loss_flags": [clipped if kept else 0 for kept in TRAINED],
        }
    return make_sample(
        tokens=8,
        temperature_logprobs=BEHAVIOUR,
        trainer_logprobs=[b + gap for b, gap in zip(BEHAVIOUR, gaps, strict=True)],
        segments=SEGMENTS,
        episode_finish="done",
        **loss,
        **fields,
    )


@pytest.fixture(scope="module")
def episodes(world):
    """A job with three episodes: far only on observations (recorded), far on trained tokens
    (recorded), and one stored before the record (far on observations)."""
    repo = world["repo"]
    job = running_job(repo, model=str(world["model"]), environment="calculator", clip_eps=0.2)
    samples = [
        _episode(0.05, 3.0, True, group_index=0),
        _episode(0.5, 0.0, True, group_index=1),
        _episode(0.05, 3.0, False, group_index=2),
    ]
    repo.record_batch(make_batch(job.id, samples))
    details = [repo.get_sample(s.id) for s in repo.list_samples(SampleFilter(job.id)).items]
    return job, sorted(details, key=lambda d: d.group_index)


def test_an_episodes_observations_are_not_trained_and_its_ratios_are_the_stored_ones(
    services, episodes
):
    _, (detail, *_) = episodes
    rows = token_diagnostics(detail, 0.2)
    assert [row.trained for row in rows] == TRAINED
    assert not any(row.clipped for row in rows if not row.trained)
    assert [row.ratio for row in rows] == detail.loss_ratios  # not exp(trainer - behaviour)
    assert all(row.clipped and row.corrected is False for row in rows if row.trained)
    html = sample_detail(services, detail.id)
    states = re.findall(r'data-clipped="(true|false)" data-trained="(true|false)"', html)
    assert states == [("true", "true") if kept else ("false", "false") for kept in TRAINED]
    assert html.count("not trained</td>") == TRAINED.count(False)
    assert "5 of 5 trained tokens clipped (3 not trained)" in html
    assert "as the loss recorded them" in html


def test_a_sample_stored_before_the_record_is_recomputed_on_its_sampled_tokens(services, episodes):
    detail = episodes[1][2]
    rows = token_diagnostics(detail, 0.2)
    assert [row.trained for row in rows] == TRAINED
    assert not any(row.clipped for row in rows if not row.trained)
    for row in rows:
        if row.trained:
            assert row.ratio == pytest.approx(math.exp(row.trainer - row.behaviour))
            assert row.weight is None and row.corrected is None
    assert "recomputed (stored before the loss's per-token record" in sample_detail(
        services, detail.id
    )


def test_the_gap_filter_ranks_episodes_by_their_trained_tokens(services, episodes):
    job, (_, trained_far, before) = episodes
    found = services.repository.list_samples(SampleFilter(job.id, min_logprob_gap=0.25)).items
    # the first episode's 3.0 gap is on tokens the loss never trained; the last has no record
    assert sorted(s.id for s in found) == sorted([trained_far.id, before.id])
