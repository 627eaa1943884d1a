"""Issue 42 item 5: a train job stores what the loss did to each token of each trained sample
(`SampleRecord`'s loss record), read back equal to the trainer's `StepRecord`; an episode's
observation tokens are stored as not trained."""

import pytest

import workers.training
from db import LossFlag, SampleFilter
from tests.workers.helpers import train_config
from workers.jobs import run_job
from workers.records import trainer_batches

TWO_TURNS = """
class TwoTurns:
    tools = []

    def reset(self, task):
        return [{"role": "user", "content": "say 7"}]

    def step(self, turn):
        self.turns = getattr(self, "turns", 0) + 1
        if self.turns < 2:
            return {"messages": [{"role": "user", "content": "once more"}]}
        return {"messages": [], "reward": float(len(turn["text"]) % 2), "done": True}
"""


@pytest.fixture
def steps(monkeypatch):
    """The trainer's `StepRecord`s, as the worker stores them."""
    seen = []

    def spy(job_id, version, step):
        seen.append(step)
        return trainer_batches(job_id, version, step)

    monkeypatch.setattr(workers.training, "trainer_batches", spy)
    return seen


def _stored(repo, job_id):
    """(step, prompt index, group index) -> the stored sample, of every sample of the job."""
    details = [repo.get_sample(s.id) for s in repo.list_samples(SampleFilter(job_id)).items]
    return {(repo.get_batch(d.batch_id).step, d.prompt_index, d.group_index): d for d in details}


def test_a_train_job_stores_the_loss_record_of_the_trainer(repo, settings, tiny_model, steps):
    config = train_config(tiny_model, steps=2, group_size=4, reward="regex:.*7.*")
    job = repo.create_job("train", config, total_steps=2)
    assert run_job(repo, job.id, settings).status == "succeeded"
    stored = _stored(repo, job.id)
    compared = 0
    for step in steps:
        for i, record in enumerate(step.loss_records or []):
            group = step.rollout.group_of(i)
            detail = stored[(step.step, group, i % step.rollout.group_size)]
            if record is None:
                assert detail.loss_flags is None
                continue
            bits = zip(record.trained, record.corrected, record.clipped, strict=True)
            assert detail.loss_flags == [LossFlag.of(*token) for token in bits]
            assert detail.loss_ratios == record.ratios  # float32 both: exact
            assert detail.loss_weights == record.weights
            compared += 1
    assert compared == 2 * 2 * 4  # every sample of both steps was trained and stored


def test_an_episode_jobs_observation_tokens_are_not_trained(
    repo, settings, tiny_model, tmp_path, monkeypatch
):
    (tmp_path / "rlwb_env_two_turns.py").write_text(TWO_TURNS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLWB_ENVIRONMENTS", "two_turns=rlwb_env_two_turns:TwoTurns")
    config = train_config(
        tiny_model, steps=1, environment="two_turns", max_turns=2, max_episode_tokens=64
    )
    job = repo.create_job("train", {**config, "heldout_every": 0}, total_steps=1)
    assert run_job(repo, job.id, settings).status == "succeeded", repo.get_job(job.id).error
    episodes = [d for d in _stored(repo, job.id).values() if d.loss_flags is not None]
    assert episodes
    observed = 0
    for detail in episodes:
        trained = [bool(flags & LossFlag.TRAINED) for flags in detail.loss_flags]
        assert trained == detail.sampled_tokens
        observed += trained.count(False)
    assert observed > 0  # the episodes have observation tokens between their turns
