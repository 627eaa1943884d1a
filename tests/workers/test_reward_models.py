"""A reward model in a train job's reward list: refused at submission when it cannot be loaded
(the reason named), a Hub id downloaded like a model, its score stored as a component."""

import json
import tempfile
from pathlib import Path

import pytest
from huggingface_hub import constants

from core_engine.toy import save_tiny_reward_model
from db import Repository, SampleFilter
from tests.core_engine.test_reward_model import hf_score
from tests.workers.fake_hub import COMMIT, FakeHub, serving
from tests.workers.helpers import train_config
from tests.workers.test_hub_models import _rlwb
from workers import api
from workers.job_files import absolute_paths
from workers.specs import SpecError

HUB_RM = "tiny-org/tiny-reward"


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", seed=5)


def with_reward_model(model: str, policy: str, **overrides):
    reward = [{"name": "reward_model", "model": model}, {"name": "exact_match"}]
    return train_config(policy, reward=reward, **overrides)


def test_a_reward_model_that_cannot_be_loaded_is_refused_at_submission(env, tiny_model):
    # a causal LM is no sequence-classification reward model
    with pytest.raises(SpecError, match=r"reward reward_model: reward model .*: not a sequence"):
        api.submit_job("train", with_reward_model(tiny_model, tiny_model))
    with pytest.raises(SpecError, match="reward reward_model: model: /etc is not under a model"):
        api.submit_job("train", with_reward_model("/etc", tiny_model))


def test_a_reward_model_is_accepted_at_submission(env, tiny_model, reward_model):
    job = api.submit_job("train", with_reward_model(str(reward_model), tiny_model))
    assert job.config["reward"][0]["model"] == str(reward_model)


def test_offline_a_hub_reward_model_not_in_the_cache_is_refused(
    env, tiny_model, tmp_path, monkeypatch
):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(SpecError, match=f"reward reward_model: model: {HUB_RM} is a Hugging Face"):
        api.submit_job("train", with_reward_model(HUB_RM, tiny_model))


def test_a_hub_reward_model_is_downloaded_and_its_scores_stored(tmp_path, tiny_model, reward_model):
    hub = FakeHub(HUB_RM, reward_model)
    job = tmp_path / "job.json"
    job.write_text(json.dumps(with_reward_model(HUB_RM, tiny_model, steps=1)))
    roots = {"RLWB_MODEL_ROOTS": tempfile.gettempdir()}
    with serving(hub) as endpoint:
        done = _rlwb(tmp_path, "train", str(job), HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0", **roots)
    assert done.returncode == 0, done.stdout + done.stderr
    assert hub.served == dict.fromkeys(hub.files, 1)
    snapshot = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-reward" / "snapshots" / COMMIT
    repo = Repository.from_url(f"sqlite:///{tmp_path / 'data' / 'rlwb.db'}")
    try:
        [stored] = repo.list_jobs()
        assert stored.config["reward"][0]["model"] == HUB_RM  # the job keeps what was typed
        samples = [repo.get_sample(s.id) for s in repo.list_samples(SampleFilter(stored.id)).items]
    finally:
        repo.close()
    assert samples
    for sample in samples:
        truth = hf_score(snapshot, sample.prompt_text + sample.response_text)
        assert sample.reward_components["reward_model"] == pytest.approx(truth, abs=1e-5)
        total = sample.reward_components["reward_model"] + sample.reward_components["exact_match"]
        assert sample.reward == pytest.approx(total, abs=1e-6)


def test_relative_reward_model_paths_are_made_absolute(reward_model, monkeypatch):
    monkeypatch.chdir(Path(reward_model).parent)
    config = {"reward": [{"name": "reward_model", "model": "rm"}, {"name": "exact_match"}]}
    absolute = absolute_paths(config)
    assert absolute["reward"][0]["model"] == str(reward_model)
    assert absolute["reward"][1] == {"name": "exact_match"}
